"""horovodrun's flags on perseusrun (Horovod 0.28.1, horovod/runner/launch.py).

Each flag does on perseusrun what it does on horovodrun, by one of four routes:

* a setting of the core: the flag sets the PERSEUS_* variable of the same meaning
  (SETTINGS); what the variable means, accepts and says when wrong is in the core's
  table (csrc/src/engine/config.cc), checked at init() on every rank;
* a flag or variable of the mpirun in use: ssh, network interfaces, output files,
  TCP only, binding, timestamps (mpirun_flags, rank_environment, mpirun_environment);
* nothing here does it: the flag is accepted and a note says why it changes nothing
  (notes);
* not available: refused at parse time, naming what to use instead (Gloo, jsrun).

The elastic flags (--min-np, --max-np, --host-discovery-script, ...) drive
perseus/launcher_elastic.py; check_elastic says what is wrong with them.

A YAML --config-file (horovodrun's sections: params, autotune, timeline, stall_check,
library_options, logging, controller) fills the flags the command line left unset.
"""

import argparse
import os

from perseus.launcher_mpi_match import OPENMPI

MIB = 1024 * 1024

# dest -> (the core's variable, the value's text). Only names of the core's table.
SETTINGS = {
    "fusion_threshold_mb": ("PERSEUS_FUSION_THRESHOLD", lambda mb: "%d" % round(float(mb) * MIB)),
    "cycle_time_ms": ("PERSEUS_CYCLE_TIME", str),
    "cache_capacity": ("PERSEUS_CACHE_CAPACITY", str),
    "hierarchical_allreduce": ("PERSEUS_ALLREDUCE_MODE",
                               lambda on: "hierarchical" if on else "flat"),
    "hierarchical_allgather": ("PERSEUS_HIERARCHICAL_ALLGATHER", lambda on: "1" if on else "0"),
    "autotune": ("PERSEUS_AUTOTUNE", lambda on: "1" if on else "0"),
    "autotune_log_file": ("PERSEUS_AUTOTUNE_LOG", str),
    "autotune_warmup_samples": ("PERSEUS_AUTOTUNE_WARMUP_SAMPLES", str),
    "autotune_steps_per_sample": ("PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE", str),
    "timeline_filename": ("PERSEUS_TIMELINE", str),
    "timeline_mark_cycles": ("PERSEUS_TIMELINE_MARK_CYCLES", lambda on: "1" if on else "0"),
    "stall_check_warning_time_seconds": ("PERSEUS_STALL_CHECK_TIME_SECONDS", str),
    "stall_check_shutdown_time_seconds": ("PERSEUS_STALL_SHUTDOWN_TIME_SECONDS", str),
    # Horovod's NCCL streams are Perseus's lanes: a stream and communicator each (on
    # the CPU an MPI communicator and thread each).
    "num_nccl_streams": ("PERSEUS_ALLREDUCE_STREAMS", str),
    "log_level": ("PERSEUS_LOG_LEVEL", lambda level: str(level).lower()),
}

# dest -> why the flag, when on, changes nothing under perseusrun.
NO_EFFECT = {
    "disable_cache": "perseusrun keeps no cache of start-up checks",
    "start_timeout": "perseusrun makes no start-up checks (ssh, NICs) to time; mpirun "
                     "starts the ranks",
    "autotune_bayes_opt_max_samples": "Perseus's autotuner searches a grid by coordinate "
                                      "descent, not by Bayesian optimisation",
    "autotune_gaussian_process_noise": "Perseus's autotuner searches a grid by coordinate "
                                       "descent, not by Bayesian optimisation",
    "mpi_threads_disable": "Perseus needs MPI_THREAD_SERIALIZED or better (it asks for "
                           "MPI_THREAD_MULTIPLE) and runs beside mpi4py at mpi4py's default",
    "thread_affinity": "Perseus does not pin its engine thread (pin the ranks with "
                       "--binding-args)",
    "gloo_timeout_seconds": "Perseus has no Gloo controller",
    "log_with_timestamp": "Perseus's log lines carry no timestamp",
}
HYDRA_NO_TIMESTAMPS = ("Hydra's mpirun (MPICH, Intel MPI) cannot timestamp output lines "
                       "(Open MPI's --timestamp-output can)")

NO_GLOO = ("Perseus has no Gloo controller: it runs over MPI, which perseusrun launches with "
           "mpirun (drop --gloo, or give --mpi)")
NO_JSRUN = ("perseusrun does not drive jsrun: Perseus runs over MPI, so on an LSF cluster start "
            "the ranks with `jsrun -n N python train.py` (a Perseus built with that cluster's "
            "MPI) or with perseusrun / mpirun inside the allocation")


class _Refuse(argparse.Action):
    """A flag perseusrun cannot honour: a usage error naming what to use instead."""

    def __init__(self, option_strings, dest, why, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, default=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("%s: %s" % (option_string, self.why))


def _switch(group, on, off, dest, help_on, help_off):
    """--x / --no-x of one setting: True, False, or None when neither is given."""
    both = group.add_mutually_exclusive_group()
    both.add_argument(*on, dest=dest, action="store_const", const=True, default=None,
                      help=help_on)
    both.add_argument(*off, dest=dest, action="store_const", const=False, default=None,
                      help=help_off)


def add_to(parser):
    """Adds horovodrun's flags, in horovodrun's groups, to perseusrun's parser."""
    g = parser.add_argument_group("horovodrun's start-up arguments")
    g.add_argument("--disable-cache", action="store_const", const=True, default=None,
                   help="accepted; no effect (perseusrun caches nothing)")
    g.add_argument("--start-timeout", type=int, metavar="S",
                   help="accepted; no effect (no start-up checks to time)")
    g.add_argument("--network-interfaces", "--network-interface", dest="nics", action="append",
                   metavar="NIC[,NIC]",
                   help="interfaces for MPI's and NCCL's traffic (repeatable): Open MPI "
                        "--mca btl_tcp_if_include, Hydra -iface (one NIC), "
                        "NCCL_SOCKET_IFNAME and UCX_NET_DEVICES in the ranks")
    g.add_argument("--output-filename", metavar="DIR",
                   help="each rank's stdout and stderr to files under DIR: Open MPI's "
                        "--output-filename; with Hydra, DIR/rank.N/stdout and stderr")
    g.add_argument("--config-file", metavar="FILE",
                   help="horovodrun's YAML configuration; the command line wins over it")

    g = parser.add_argument_group("SSH arguments")
    g.add_argument("-p", "--ssh-port", type=int, metavar="PORT",
                   help="ssh port of every host (Open MPI plm_rsh_args, Hydra "
                        "HYDRA_LAUNCHER_EXTRA_ARGS)")
    g.add_argument("-i", "--ssh-identity-file", metavar="FILE",
                   help="ssh private key for every host (as --ssh-port)")

    g = parser.add_argument_group("tuneable parameter arguments (the core's settings)")
    g.add_argument("--fusion-threshold-mb", type=float, metavar="MB",
                   help="PERSEUS_FUSION_THRESHOLD, in MiB (0: no fusion)")
    g.add_argument("--cycle-time-ms", type=float, metavar="MS", help="PERSEUS_CYCLE_TIME")
    g.add_argument("--cache-capacity", type=int, metavar="N", help="PERSEUS_CACHE_CAPACITY")
    _switch(g, ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"],
            "hierarchical_allreduce", "PERSEUS_ALLREDUCE_MODE=hierarchical",
            "PERSEUS_ALLREDUCE_MODE=flat")
    _switch(g, ["--hierarchical-allgather"], ["--no-hierarchical-allgather"],
            "hierarchical_allgather", "PERSEUS_HIERARCHICAL_ALLGATHER=1 (not implemented: "
                                      "init() says so)", "PERSEUS_HIERARCHICAL_ALLGATHER=0")

    g = parser.add_argument_group("autotune arguments")
    _switch(g, ["--autotune"], ["--no-autotune"], "autotune", "PERSEUS_AUTOTUNE=1",
            "PERSEUS_AUTOTUNE=0")
    g.add_argument("--autotune-log-file", metavar="FILE", help="PERSEUS_AUTOTUNE_LOG")
    g.add_argument("--autotune-warmup-samples", type=int, metavar="N",
                   help="PERSEUS_AUTOTUNE_WARMUP_SAMPLES")
    g.add_argument("--autotune-steps-per-sample", type=int, metavar="N",
                   help="PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE")
    g.add_argument("--autotune-bayes-opt-max-samples", type=int, metavar="N",
                   help="accepted; no effect (the autotuner is not Bayesian)")
    g.add_argument("--autotune-gaussian-process-noise", type=float, metavar="X",
                   help="accepted; no effect (as above)")

    g = parser.add_argument_group("elastic arguments")
    g.add_argument("--elastic", action="store_true",
                   help="the job outlives a rank that fails (hvd.elastic.run): on a core "
                        "built with Open MPI 5's ULFM the survivors go on in a world of "
                        "their own (mpirun --with-ft ulfm); on any other the job is started "
                        "again and resumes from its last persisted commit (with -H/--hostfile, "
                        "without the hosts that lost a rank)")
    g.add_argument("--reset-limit", type=int, metavar="N",
                   help="--elastic without ULFM, with --host-discovery-script or with "
                        "-H/--hostfile: restart the job at most N times after a rank dies "
                        "(under ULFM: a host is lost) or the hosts change, then end it "
                        "(default: 3)")
    g.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="--elastic: a command printing one host[:slots] per line, run at "
                        "start and every second; when its hosts change, the ranks get "
                        "HostsUpdatedInterrupt at their next commit and the job restarts "
                        "on the new hosts from that commit")
    g.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                   help="with --host-discovery-script or -H/--hostfile: run on at least N "
                        "slots, else wait for them (default: -np, else 1)")
    g.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                   help="run at most N ranks (default: with --host-discovery-script all "
                        "slots found, with -H/--hostfile -np)")
    g.add_argument("--slots-per-host", type=int, metavar="N",
                   help="slots of a host the script prints without :slots (default: 1)")
    g.add_argument("--elastic-timeout", type=int, metavar="S",
                   help="how long to wait for --min-np slots before failing (default: "
                        "$HOROVOD_ELASTIC_TIMEOUT, else 600)")
    g.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                   help="--host-discovery-script or -H/--hostfile: seconds a host that lost "
                        "a rank stays out (Horovod's doubling cooldown; default: the rest of "
                        "the job)")

    g = parser.add_argument_group("timeline arguments")
    g.add_argument("--timeline-filename", metavar="FILE", help="PERSEUS_TIMELINE")
    _switch(g, ["--timeline-mark-cycles"], ["--no-timeline-mark-cycles"],
            "timeline_mark_cycles", "PERSEUS_TIMELINE_MARK_CYCLES=1",
            "PERSEUS_TIMELINE_MARK_CYCLES=0")

    g = parser.add_argument_group("stall check arguments")
    _switch(g, ["--no-stall-check"], ["--stall-check"], "no_stall_check",
            "PERSEUS_STALL_CHECK_TIME_SECONDS=0 (wins over the warning time, as in Horovod)",
            "accepted (the stall check is on by default)")
    g.add_argument("--stall-check-warning-time-seconds", type=int, metavar="S",
                   help="PERSEUS_STALL_CHECK_TIME_SECONDS")
    g.add_argument("--stall-check-shutdown-time-seconds", type=int, metavar="S",
                   help="PERSEUS_STALL_SHUTDOWN_TIME_SECONDS")

    g = parser.add_argument_group("library arguments")
    _switch(g, ["--mpi-threads-disable"], ["--no-mpi-threads-disable"], "mpi_threads_disable",
            "accepted; no effect (Perseus needs threaded MPI)", "accepted (the default)")
    g.add_argument("--tcp", action="store_const", const=True, default=None,
                   help="TCP only: NCCL_IB_DISABLE=1; Open MPI --mca pml ob1 --mca btl "
                        "^openib; MPICH UCX_TLS=tcp,self,sm")
    g.add_argument("--binding-args", metavar="ARGS",
                   help="mpirun's binding flags, in place of perseusrun's (Open MPI: "
                        "--bind-to none --map-by slot)")
    g.add_argument("--num-nccl-streams", type=int, metavar="N",
                   help="PERSEUS_ALLREDUCE_STREAMS (lanes, CPU ones too)")
    g.add_argument("--thread-affinity", type=int, metavar="CPU",
                   help="accepted; no effect (the engine thread is not pinned)")
    g.add_argument("--gloo-timeout-seconds", type=int, metavar="S",
                   help="accepted; no effect (no Gloo)")

    g = parser.add_argument_group("logging arguments")
    g.add_argument("--log-level", type=str.upper, metavar="LEVEL",
                   choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
                   help="PERSEUS_LOG_LEVEL: TRACE, DEBUG, INFO, WARNING, ERROR or FATAL")
    stamps = g.add_mutually_exclusive_group()
    stamps.add_argument("--log-with-timestamp", "--no-log-hide-timestamp",
                        dest="log_with_timestamp", action="store_const", const=True,
                        default=None, help="accepted; no effect (no timestamps in the log)")
    stamps.add_argument("--log-without-timestamp", "--log-hide-timestamp",
                        dest="log_with_timestamp", action="store_const", const=False,
                        default=None, help="accepted (the log has no timestamps)")
    g.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                   dest="prefix_output_with_timestamp", action="store_const", const=True,
                   default=None, help="Open MPI --timestamp-output (Hydra: no effect)")

    g = parser.add_argument_group("controller arguments")
    g.add_argument("--mpi", action="store_const", const=True, default=None,
                   help="accepted: MPI is Perseus's only controller")
    g.add_argument("--gloo", action=_Refuse, why=NO_GLOO, help="refused: no Gloo")
    g.add_argument("--jsrun", action=_Refuse, why=NO_JSRUN, help="refused: use jsrun itself")


ELASTIC_HOST_FLAGS = ("min_np", "max_np", "slots_per_host", "elastic_timeout",
                      "blacklist_cooldown_range")


def check_elastic(args, environ=None):
    """The first problem with the elastic flags, as one line, or None."""
    environ = os.environ if environ is None else environ
    given = [d for d in ELASTIC_HOST_FLAGS if getattr(args, d, None) is not None]
    script = getattr(args, "host_discovery_script", None)
    if (script or given) and not getattr(args, "elastic", False):
        return ("%s needs --elastic (a job that follows its hosts)"
                % _flag_of("host_discovery_script" if script else given[0]))
    fixed = bool(getattr(args, "hosts", None) or getattr(args, "hostfile", None))
    if script and fixed:
        return "--host-discovery-script gives the hosts: drop -H/--hostfile"
    if "slots_per_host" in given and not script:
        return ("--slots-per-host needs --host-discovery-script (-H/--hostfile give each "
                "host's slots, host:N)")
    # --min-np alone bounds the survivors of a shrink in place on this machine (Horovod
    # takes it as an elastic job on localhost too); the other flags count hosts.
    counted = [d for d in given if d != "min_np"]
    if counted and not script and not fixed:
        return ("%s needs --host-discovery-script or -H/--hostfile (the hosts it counts come "
                "from them)" % _flag_of(counted[0]))
    if not script and not fixed and given and args.np is not None and args.min_np > args.np:
        return ("--min-np %d is above -np %d: the job could never run on --min-np ranks"
                % (args.min_np, args.np))
    if not script and not given:
        return None
    for dest in ("np", "min_np", "max_np", "slots_per_host"):
        value = getattr(args, dest, None)
        if value is not None and value < 1:
            return "%s must be at least 1, not %d" % ("-np" if dest == "np" else _flag_of(dest),
                                                       value)
    low = args.min_np if args.min_np is not None else (args.np or 1)
    if args.max_np is not None and low > args.max_np:
        return ("--min-np %d is above --max-np %d" % (low, args.max_np) if args.min_np is not None
                else "-np %d is above --max-np %d" % (low, args.max_np))
    if args.elastic_timeout is not None and args.elastic_timeout < 0:
        return "--elastic-timeout must be 0 or more seconds, not %d" % args.elastic_timeout
    if args.elastic_timeout is None:
        text = environ.get("HOROVOD_ELASTIC_TIMEOUT")
        if text is not None and not text.strip().isdigit():
            return "HOROVOD_ELASTIC_TIMEOUT must be a whole number of seconds, not %r" % text
    if args.blacklist_cooldown_range is not None:
        low_s, high_s = args.blacklist_cooldown_range
        if not 1 <= low_s <= high_s <= 3600:  # Horovod's bounds
            return ("--blacklist-cooldown-range %d %d: need 1 <= MIN <= MAX <= 3600 seconds"
                    % (low_s, high_s))
    return None


def _nics(args):
    names = []
    for item in args.nics or []:
        names += [n.strip() for n in item.split(",") if n.strip() and n.strip() not in names]
    return names


def rank_environment(args, flavour):
    """[(name, value)]: the variables the flags set in every rank, in flag order."""
    env = [(SETTINGS[dest][0], SETTINGS[dest][1](getattr(args, dest)))
           for dest in SETTINGS if getattr(args, dest, None) is not None]
    if getattr(args, "no_stall_check", None):
        env = [(n, v) for n, v in env if n != "PERSEUS_STALL_CHECK_TIME_SECONDS"]
        env.append(("PERSEUS_STALL_CHECK_TIME_SECONDS", "0"))
    if getattr(args, "tcp", None):
        env.append(("NCCL_IB_DISABLE", "1"))
        if flavour != OPENMPI:  # the mpich wheel's transport is UCX
            env.append(("UCX_TLS", "tcp,self,sm"))
    if getattr(args, "elastic", None) and getattr(args, "min_np", None) is not None \
            and not getattr(args, "elastic_restart", False):
        # Under ULFM the ranks shrink in place: hvd.elastic.run does not go on below it
        # (perseus/common/elastic.py, min_np). Only where given: without it, as before.
        env.append(("PERSEUS_ELASTIC_MIN_NP", str(args.min_np)))
    nics = _nics(args)
    if nics:
        env.append(("NCCL_SOCKET_IFNAME", ",".join(nics)))
        if flavour != OPENMPI:
            env.append(("UCX_NET_DEVICES", ",".join(nics)))
    return env


def _ssh_args(args):
    words = []
    if getattr(args, "ssh_port", None) is not None:
        words += ["-p", str(args.ssh_port)]
    if getattr(args, "ssh_identity_file", None):
        words += ["-i", args.ssh_identity_file]
    return " ".join(words)


def mpirun_flags(args, flavour):
    """mpirun's own flags for ssh, interfaces, output files, TCP only and timestamps."""
    flags = []
    ssh = _ssh_args(args)
    nics = _nics(args)
    if flavour == OPENMPI:
        if ssh:
            flags += ["--mca", "plm_rsh_args", ssh]
        if nics:
            flags += ["--mca", "btl_tcp_if_include", ",".join(nics)]
        if getattr(args, "tcp", None):
            flags += ["--mca", "pml", "ob1", "--mca", "btl", "^openib"]
        if getattr(args, "output_filename", None):
            flags += ["--output-filename", args.output_filename]
        if getattr(args, "prefix_output_with_timestamp", None):
            flags.append("--timestamp-output")
    else:  # Hydra: ssh's arguments come from its environment (mpirun_environment)
        if len(nics) == 1:  # Hydra takes one interface
            flags += ["-iface", nics[0]]
        if getattr(args, "output_filename", None):
            folder = os.path.join(args.output_filename, "rank.%r")  # %r: Hydra's rank
            flags += ["-outfile-pattern", os.path.join(folder, "stdout"),
                      "-errfile-pattern", os.path.join(folder, "stderr")]
    return flags


def mpirun_environment(args, flavour):
    """Variables mpirun itself reads (not the ranks): Hydra's ssh arguments."""
    ssh = _ssh_args(args)
    if not ssh or flavour == OPENMPI:
        return {}
    # MPICH's Hydra, and Intel MPI's under its own name.
    return {"HYDRA_LAUNCHER_EXTRA_ARGS": ssh, "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": ssh}


def prepare(args, flavour, np):
    """What must exist before mpirun starts: Hydra writes output files only into
    folders that exist (Open MPI makes its own)."""
    if getattr(args, "output_filename", None) and flavour != OPENMPI:
        for rank in range(np):
            os.makedirs(os.path.join(args.output_filename, "rank.%d" % rank), exist_ok=True)


def notes(args, flavour):
    """One line for each flag given that has no effect here, saying why."""
    found = []
    for dest, why in NO_EFFECT.items():
        if getattr(args, dest, None) not in (None, False):
            found.append("%s has no effect: %s" % (_flag_of(dest), why))
    if getattr(args, "prefix_output_with_timestamp", None) and flavour != OPENMPI:
        found.append("--prefix-output-with-timestamp has no effect: %s" % HYDRA_NO_TIMESTAMPS)
    return found


def _flag_of(dest):
    return "--" + dest.replace("_", "-")


# horovodrun's YAML sections: (section, key) -> dest; stall_check's `enabled` is inverted.
CONFIG_KEYS = {
    ("params", "fusion_threshold_mb"): "fusion_threshold_mb",
    ("params", "cycle_time_ms"): "cycle_time_ms",
    ("params", "cache_capacity"): "cache_capacity",
    ("params", "hierarchical_allreduce"): "hierarchical_allreduce",
    ("params", "hierarchical_allgather"): "hierarchical_allgather",
    ("autotune", "enabled"): "autotune",
    ("autotune", "log_file"): "autotune_log_file",
    ("autotune", "warmup_samples"): "autotune_warmup_samples",
    ("autotune", "steps_per_sample"): "autotune_steps_per_sample",
    ("autotune", "bayes_opt_max_samples"): "autotune_bayes_opt_max_samples",
    ("autotune", "gaussian_process_noise"): "autotune_gaussian_process_noise",
    ("timeline", "filename"): "timeline_filename",
    ("timeline", "mark_cycles"): "timeline_mark_cycles",
    ("stall_check", "enabled"): "no_stall_check",
    ("stall_check", "warning_time_seconds"): "stall_check_warning_time_seconds",
    ("stall_check", "shutdown_time_seconds"): "stall_check_shutdown_time_seconds",
    ("library_options", "mpi_threads_disable"): "mpi_threads_disable",
    ("library_options", "num_nccl_streams"): "num_nccl_streams",
    ("library_options", "thread_affinity"): "thread_affinity",
    ("library_options", "gloo_timeout_seconds"): "gloo_timeout_seconds",
    ("logging", "level"): "log_level",
    ("logging", "with_timestamp"): "log_with_timestamp",
}


def apply_config_file(parser, args):
    """Fills the flags the command line left unset from --config-file; a usage error
    for a file that cannot be read, a key horovodrun does not know, or the Gloo
    controller."""
    if not getattr(args, "config_file", None):
        return
    try:
        import yaml
    except ImportError:
        parser.error("--config-file needs PyYAML (pip install pyyaml)")
    try:
        with open(args.config_file) as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        parser.error("--config-file %s: %s" % (args.config_file, e))
    if not isinstance(config, dict):
        parser.error("--config-file %s: expected horovodrun's sections (params:, autotune:, "
                     "...), got %r" % (args.config_file, config))
    controller = str(config.pop("controller", "mpi")).lower()
    if controller != "mpi":
        parser.error("--config-file %s: controller %s: %s"
                     % (args.config_file, controller, NO_GLOO if controller == "gloo" else
                        "Perseus's only controller is MPI"))
    for section, values in config.items():
        for key, value in (values or {}).items() if isinstance(values, dict) else [(None, values)]:
            dest = CONFIG_KEYS.get((section, key))
            if dest is None:
                parser.error("--config-file %s: horovodrun has no setting %s%s"
                             % (args.config_file, section, "." + key if key else ""))
            if dest == "no_stall_check":
                value = not value
            if getattr(args, dest, None) is None:  # the command line wins
                setattr(args, dest, value)
