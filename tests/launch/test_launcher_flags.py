"""perseusrun takes every flag of horovodrun 0.28.1 (horovod/runner/launch.py): each
sets the core's PERSEUS_* variable or the mpirun flag that does the same, is accepted
with a note where nothing corresponds, or is refused naming what to use instead;
--version is perseus.__version__, the CHANGELOG's latest; docs/api/perseusrun.md
shows the real --help. Parsing and command building only: no rank is started."""
import os
import re
import subprocess
import sys

import pytest

import perseus
from support.jobs import REPO_ROOT, clean_env
from perseus import launcher, launcher_flags
from perseus.launcher import MPICH, OPENMPI, build_command, make_parser

PERSEUSRUN = REPO_ROOT / "bin" / "perseusrun"

# horovodrun 0.28.1's flags (launch.py's parse_args), each with a value where it takes
# one. The reference list: a flag Horovod adds later belongs here too.
HOROVODRUN_FLAGS = [
    ("-v",), ("--version",), ("-np", "2"), ("--num-proc", "2"), ("-cb",), ("--check-build",),
    ("--disable-cache",), ("--start-timeout", "30"), ("--network-interfaces", "eth0,eth1"),
    ("--network-interface", "eth0"), ("--output-filename", "out"), ("--verbose",),
    ("--config-file", "c.yaml"), ("-p", "2222"), ("--ssh-port", "2222"),
    ("-i", "key"), ("--ssh-identity-file", "key"),
    ("--fusion-threshold-mb", "32"), ("--cycle-time-ms", "2.5"), ("--cache-capacity", "512"),
    ("--hierarchical-allreduce",), ("--no-hierarchical-allreduce",),
    ("--hierarchical-allgather",), ("--no-hierarchical-allgather",),
    ("--autotune",), ("--no-autotune",), ("--autotune-log-file", "a.csv"),
    ("--autotune-warmup-samples", "2"), ("--autotune-steps-per-sample", "5"),
    ("--autotune-bayes-opt-max-samples", "10"), ("--autotune-gaussian-process-noise", "0.5"),
    ("--min-np", "2"), ("--min-num-proc", "2"), ("--max-np", "4"), ("--max-num-proc", "4"),
    ("--slots-per-host", "2"), ("--elastic-timeout", "60"), ("--reset-limit", "3"),
    ("--blacklist-cooldown-range", "10", "100"),
    ("--timeline-filename", "t.json"), ("--timeline-mark-cycles",), ("--no-timeline-mark-cycles",),
    ("--no-stall-check",), ("--stall-check",), ("--stall-check-warning-time-seconds", "30"),
    ("--stall-check-shutdown-time-seconds", "90"),
    ("--mpi-threads-disable",), ("--no-mpi-threads-disable",), ("--mpi-args", "-genv FOO 1"),
    ("--tcp",), ("--binding-args", "--bind-to core"), ("--num-nccl-streams", "2"),
    ("--thread-affinity", "1"), ("--gloo-timeout-seconds", "30"),
    ("--log-level", "DEBUG"), ("--log-with-timestamp",), ("--log-without-timestamp",),
    ("-prefix-timestamp",), ("--prefix-output-with-timestamp",),
    ("--log-hide-timestamp",), ("--no-log-hide-timestamp",),
    ("-H", "a:2"), ("--hosts", "a:2"), ("-hostfile", "h"), ("--hostfile", "h"),
    ("--host-discovery-script", "d.sh"), ("--gloo",), ("--mpi",), ("--jsrun",),
]
REFUSED = {"--gloo", "--jsrun"}
EXITING = {"-v", "--version", "-cb", "--check-build"}


def parse(argv):
    return make_parser().parse_args(argv)


def cmd(argv, flavour, environ=None):
    return build_command(parse(argv), flavour, "/opt/mpi/bin/mpirun", environ=environ or {},
                         cpu_count=4, is_root=False)


@pytest.mark.parametrize("flag", [f for f in HOROVODRUN_FLAGS
                                  if f[0] not in REFUSED | EXITING], ids=lambda f: f[0])
def test_each_horovodrun_flag_is_accepted(flag):
    args = parse(list(flag) + ["-np", "2", "python", "t.py"])
    assert args.command == ["python", "t.py"]


@pytest.mark.parametrize("flag", [f for f in HOROVODRUN_FLAGS if f[0] in REFUSED],
                         ids=lambda f: f[0])
def test_refused_flags_say_what_to_use_instead(flag, capsys):
    with pytest.raises(SystemExit) as e:
        parse(list(flag) + ["-np", "2", "python", "t.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag[0] in err
    assert "MPI" in err and ("mpirun" in err or "perseusrun" in err), err


def test_help_lists_every_horovodrun_flag():
    text = make_parser().format_help()
    missing = [f[0] for f in HOROVODRUN_FLAGS
               if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(f[0]), text)]
    assert not missing, missing


def test_mpi_is_no_longer_ambiguous():
    assert parse(["--mpi", "-np", "2", "python"]).np == 2


def core_table_names():
    """The PERSEUS_* names of csrc/src/engine/config.cc's table (read from the source)."""
    source = (REPO_ROOT / "csrc" / "src" / "engine" / "config.cc").read_text()
    body = source.split("const std::vector<Variable>& Table() {", 1)[1].split("\n  };", 1)[0]
    return set(re.findall(r'\{"(PERSEUS_\w+)"', body))


def test_every_variable_a_flag_sets_is_in_the_core_table():
    names = {name for name, _ in launcher_flags.SETTINGS.values()}
    assert names and names <= core_table_names(), names - core_table_names()


@pytest.mark.parametrize("argv, variable, value", [
    (["--fusion-threshold-mb", "32"], "PERSEUS_FUSION_THRESHOLD", "33554432"),
    (["--cycle-time-ms", "2.5"], "PERSEUS_CYCLE_TIME", "2.5"),
    (["--cache-capacity", "512"], "PERSEUS_CACHE_CAPACITY", "512"),
    (["--hierarchical-allreduce"], "PERSEUS_ALLREDUCE_MODE", "hierarchical"),
    (["--no-hierarchical-allreduce"], "PERSEUS_ALLREDUCE_MODE", "flat"),
    (["--hierarchical-allgather"], "PERSEUS_HIERARCHICAL_ALLGATHER", "1"),
    (["--autotune"], "PERSEUS_AUTOTUNE", "1"),
    (["--no-autotune"], "PERSEUS_AUTOTUNE", "0"),
    (["--autotune-log-file", "a.csv"], "PERSEUS_AUTOTUNE_LOG", "a.csv"),
    (["--autotune-warmup-samples", "2"], "PERSEUS_AUTOTUNE_WARMUP_SAMPLES", "2"),
    (["--autotune-steps-per-sample", "5"], "PERSEUS_AUTOTUNE_STEPS_PER_SAMPLE", "5"),
    (["--timeline-filename", "t.json"], "PERSEUS_TIMELINE", "t.json"),
    (["--timeline-mark-cycles"], "PERSEUS_TIMELINE_MARK_CYCLES", "1"),
    (["--stall-check-warning-time-seconds", "30"], "PERSEUS_STALL_CHECK_TIME_SECONDS", "30"),
    (["--stall-check-shutdown-time-seconds", "90"], "PERSEUS_STALL_SHUTDOWN_TIME_SECONDS", "90"),
    (["--no-stall-check", "--stall-check-warning-time-seconds", "30"],
     "PERSEUS_STALL_CHECK_TIME_SECONDS", "0"),  # as Horovod: disabling wins
    (["--num-nccl-streams", "2"], "PERSEUS_ALLREDUCE_STREAMS", "2"),
    (["--log-level", "DEBUG"], "PERSEUS_LOG_LEVEL", "debug"),
    (["--tcp"], "NCCL_IB_DISABLE", "1"),
    (["--network-interface", "eth0", "--network-interface", "eth1"], "NCCL_SOCKET_IFNAME",
     "eth0,eth1"),
])
def test_settings_reach_the_ranks(argv, variable, value):
    mpich = cmd(argv + ["-np", "2", "python", "t.py"], MPICH)
    assert ["-genv", variable, value] == mpich[mpich.index(variable) - 1:mpich.index(variable) + 2]
    ompi = cmd(argv + ["-np", "2", "python", "t.py"], OPENMPI,
               environ={variable: "from-the-environment"})
    assert "%s=%s" % (variable, value) in ompi
    assert variable not in ompi  # not also forwarded from the environment


def test_a_flag_wins_over_the_horovod_spelling_in_the_environment():
    """The core reads PERSEUS_* before HOROVOD_*: the flag's PERSEUS_ name wins."""
    c = cmd(["--fusion-threshold-mb", "1", "-np", "2", "python"], OPENMPI,
            environ={"HOROVOD_FUSION_THRESHOLD": "5"})
    assert "PERSEUS_FUSION_THRESHOLD=1048576" in c


def test_mpirun_flags_open_mpi():
    c = cmd(["-p", "2222", "-i", "key", "--output-filename", "out", "--network-interfaces",
             "eth0,eth1", "--binding-args", "--bind-to core", "-prefix-timestamp", "--tcp",
             "-np", "2", "python"], OPENMPI)
    line = " ".join(c)
    assert "--mca plm_rsh_args -p 2222 -i key" in line
    assert "--output-filename out" in line
    assert "--mca btl_tcp_if_include eth0,eth1" in line
    assert "--bind-to core" in line and "--bind-to none" not in line
    assert "--timestamp-output" in line
    assert "--mca pml ob1" in line


def test_mpirun_flags_mpich(tmp_path):
    args = parse(["-p", "2222", "-i", "key", "--output-filename", str(tmp_path / "out"),
                  "--network-interface", "eth0", "--tcp", "-np", "2", "python"])
    c = build_command(args, MPICH, "/opt/mpi/bin/mpirun", environ={}, cpu_count=4, is_root=False)
    line = " ".join(c)
    assert "-outfile-pattern %s/rank.%%r/stdout" % (tmp_path / "out") in line
    assert "-errfile-pattern %s/rank.%%r/stderr" % (tmp_path / "out") in line
    assert "-iface eth0" in line
    assert "-genv UCX_TLS tcp,self,sm" in line
    # Hydra takes ssh's arguments from its own environment, not from a flag.
    assert launcher_flags.mpirun_environment(args, MPICH)["HYDRA_LAUNCHER_EXTRA_ARGS"] == "-p 2222 -i key"
    launcher_flags.prepare(args, MPICH, 2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank.0", "rank.1"]


@pytest.mark.parametrize("argv, flavour, phrase", [
    (["--start-timeout", "30"], MPICH, "--start-timeout"),
    (["--disable-cache"], MPICH, "--disable-cache"),
    (["--thread-affinity", "1"], MPICH, "--thread-affinity"),
    (["--gloo-timeout-seconds", "5"], MPICH, "--gloo-timeout-seconds"),
    (["--autotune-bayes-opt-max-samples", "5"], MPICH, "--autotune-bayes-opt-max-samples"),
    (["--mpi-threads-disable"], MPICH, "--mpi-threads-disable"),
    (["--log-with-timestamp"], MPICH, "--log-with-timestamp"),
    (["--prefix-output-with-timestamp"], MPICH, "--prefix-output-with-timestamp"),
])
def test_flags_without_an_effect_here_say_so(argv, flavour, phrase):
    notes = launcher_flags.notes(parse(argv + ["-np", "2", "python"]), flavour)
    assert len(notes) == 1 and phrase in notes[0] and "no effect" in notes[0], notes


def test_no_notes_for_flags_that_take_effect():
    args = parse(["--fusion-threshold-mb", "2", "--log-without-timestamp", "-np", "2", "python"])
    assert launcher_flags.notes(args, MPICH) == []
    assert launcher_flags.notes(parse(["-prefix-timestamp", "-np", "2", "python"]), OPENMPI) == []


def test_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("params:\n  fusion_threshold_mb: 8\n  cycle_time_ms: 3\n"
                      "autotune:\n  enabled: true\n  log_file: a.csv\n"
                      "stall_check:\n  warning_time_seconds: 20\n"
                      "logging:\n  level: INFO\n")
    args = parse(["--config-file", str(config), "--cycle-time-ms", "7", "-np", "2", "python"])
    launcher_flags.apply_config_file(make_parser(), args)
    line = " ".join(build_command(args, MPICH, "/m/mpirun", environ={}, cpu_count=4,
                                  is_root=False))
    assert "-genv PERSEUS_FUSION_THRESHOLD 8388608" in line
    assert "-genv PERSEUS_CYCLE_TIME 7" in line  # the command line wins
    assert "-genv PERSEUS_AUTOTUNE 1" in line and "-genv PERSEUS_AUTOTUNE_LOG a.csv" in line
    assert "-genv PERSEUS_STALL_CHECK_TIME_SECONDS 20" in line
    assert "-genv PERSEUS_LOG_LEVEL info" in line


def test_config_file_controller_gloo_is_refused(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("controller: gloo\n")
    args = parse(["--config-file", str(config), "-np", "2", "python"])
    with pytest.raises(SystemExit):
        launcher_flags.apply_config_file(make_parser(), args)
    assert "Gloo" in capsys.readouterr().err


def _perseusrun(args, env=None):
    return subprocess.run([sys.executable, str(PERSEUSRUN)] + args, cwd=str(REPO_ROOT),
                          env=env or clean_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def test_version_is_the_package_version_and_the_changelog_latest():
    for flag in ("--version", "-v"):
        res = _perseusrun([flag])
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == perseus.__version__
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[?(\d+\.\d+\.\d+)", changelog, flags=re.M)
    assert versions and versions[0] == perseus.__version__, versions
    setup = (REPO_ROOT / "setup.py").read_text()
    assert not re.search(r"version=\"\d", setup), "setup.py must read perseus.__version__"


def test_dry_run_prints_the_notes_and_the_settings():
    res = _perseusrun(["--dry-run", "--start-timeout", "5", "--fusion-threshold-mb", "1",
                       "-np", "2", "python", "t.py"])
    assert res.returncode == 0, res.stderr
    assert "--start-timeout has no effect" in res.stderr
    assert "PERSEUS_FUSION_THRESHOLD" in res.stdout


HELP_BEGIN = "<!-- perseusrun --help: begin -->"
HELP_END = "<!-- perseusrun --help: end -->"


def test_the_api_page_shows_the_real_help():
    """docs/api/perseusrun.md keeps a copy of `perseusrun --help` at 80 columns; rebuild
    it with `COLUMNS=80 .venv/bin/python bin/perseusrun --help` when the flags change."""
    env = dict(clean_env(), COLUMNS="80")
    res = _perseusrun(["--help"], env=env)
    assert res.returncode == 0, res.stderr
    page = (REPO_ROOT / "docs" / "api" / "perseusrun.md").read_text()
    assert HELP_BEGIN in page and HELP_END in page, "the page has no --help block"
    block = page.split(HELP_BEGIN, 1)[1].split(HELP_END, 1)[0]
    shown = block.split("```text\n", 1)[1].rsplit("```", 1)[0]
    assert shown == res.stdout, ("docs/api/perseusrun.md's --help is stale: paste the output "
                                 "of `COLUMNS=80 .venv/bin/python bin/perseusrun --help`")
