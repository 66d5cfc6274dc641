"""perseusrun (perseus/launcher.py): the mpirun command it builds for each MPI flavour,
real runs through the venv's MPICH mpirun, and --check-build."""
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env, find_mpirun
from perseus import launcher
from perseus.launcher import MPICH, OPENMPI, LauncherError, build_command, make_parser

PERSEUSRUN = REPO_ROOT / "bin" / "perseusrun"
ENV = {"PERSEUS_FUSION_THRESHOLD": "1", "HOROVOD_CYCLE_TIME": "2", "PYTHONPATH": "/x",
       "PATH": "/bin", "SECRET_TOKEN": "s", "OMP_NUM_THREADS": "1"}


def cmd(argv, flavour, environ=ENV, cpu_count=4, is_root=False):
    args = make_parser().parse_args(argv)
    return build_command(args, flavour, "/opt/mpi/bin/mpirun", environ=environ,
                         cpu_count=cpu_count, is_root=is_root)


def test_flavour_from_version_text():
    assert launcher.flavour_of("mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/") == OPENMPI
    assert launcher.flavour_of("mpirun (Open MPI) 5.0.3") == OPENMPI
    assert launcher.flavour_of("HYDRA build details:\n    Version: 4.2.0") == MPICH
    assert launcher.flavour_of("Intel(R) MPI Library for Linux* OS, Version 2021.9") == MPICH
    assert launcher.flavour_of("something else") is None


def test_detects_the_venv_mpirun_as_mpich():
    assert launcher.detect_flavour(find_mpirun()) == MPICH


def test_mpich_local():
    assert cmd(["-np", "2", "python", "train.py", "--lr", "0.1"], MPICH) == [
        "/opt/mpi/bin/mpirun", "-np", "2", "python", "train.py", "--lr", "0.1"]


def test_command_options_stay_with_the_command():
    c = cmd(["-np", "2", "--verbose", "python", "-c", "print(1)", "-np", "9"], MPICH)
    assert c == ["/opt/mpi/bin/mpirun", "-np", "2", "python", "-c", "print(1)", "-np", "9"]


def test_mpich_hosts_and_env_assignments():
    c = cmd(["-np", "4", "-H", "a:2,b:2", "-x", "FOO=bar", "-x", "KEEP", "python", "t.py"], MPICH)
    assert c == ["/opt/mpi/bin/mpirun", "-np", "4", "-hosts", "a:2,b:2", "-genv", "FOO", "bar",
                 "python", "t.py"]
    # MPICH forwards the environment itself: no variable is listed.
    assert "SECRET_TOKEN" not in c and "-x" not in c


def test_mpich_hostfile(tmp_path):
    colon = tmp_path / "hosts"
    colon.write_text("# cluster\nnode1:4\nnode2:4  # second\n")
    assert cmd(["-np", "8", "--hostfile", str(colon), "python", "t.py"], MPICH)[3:6] == [
        "-f", str(colon), "python"]
    slots = tmp_path / "hosts.ompi"
    slots.write_text("node1 slots=4\nnode2 slots=2\n")
    assert cmd(["-np", "6", "--hostfile", str(slots), "python", "t.py"], MPICH)[3:5] == [
        "-hosts", "node1:4,node2:2"]


def test_openmpi_local_not_root():
    c = cmd(["-np", "2", "python", "t.py"], OPENMPI)
    assert c[:3] == ["/opt/mpi/bin/mpirun", "-np", "2"]
    assert "--allow-run-as-root" not in c and "--oversubscribe" not in c
    assert c[c.index("--bind-to") + 1] == "none"
    forwarded = {c[i + 1] for i, a in enumerate(c) if a == "-x"}
    assert forwarded == {"PERSEUS_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "PYTHONPATH", "PATH",
                         "OMP_NUM_THREADS"}
    assert c[-2:] == ["python", "t.py"]


def test_openmpi_root_and_oversubscribe():
    c = cmd(["-np", "8", "python", "t.py"], OPENMPI, cpu_count=2, is_root=True)
    assert "--allow-run-as-root" in c and "--oversubscribe" in c
    c = cmd(["-np", "2", "python", "t.py"], OPENMPI, cpu_count=2, is_root=True)
    assert "--oversubscribe" not in c


def test_openmpi_hosts(tmp_path):
    c = cmd(["-np", "3", "-H", "a:2,b", "-x", "FOO=bar", "python", "t.py"], OPENMPI, cpu_count=64)
    assert c[c.index("-H") + 1] == "a:2,b:1"
    assert "--oversubscribe" not in c  # 3 slots for 3 ranks, whatever the local cores
    assert c[c.index("FOO=bar") - 1] == "-x"
    c = cmd(["-np", "4", "-H", "a:2,b", "python", "t.py"], OPENMPI, cpu_count=64)
    assert "--oversubscribe" in c
    slots = tmp_path / "hosts"
    slots.write_text("a slots=2\nb slots=2\n")
    c = cmd(["-np", "4", "--hostfile", str(slots), "python", "t.py"], OPENMPI)
    assert c[c.index("--hostfile") + 1] == str(slots)
    colon = tmp_path / "hosts.mpich"
    colon.write_text("a:2\nb:2\n")
    c = cmd(["-np", "4", "--hostfile", str(colon), "python", "t.py"], OPENMPI)
    assert c[c.index("-H") + 1] == "a:2,b:2" and "--hostfile" not in c


def test_np_defaults_to_the_slots_of_the_hosts(tmp_path):
    assert cmd(["-H", "a:2,b:2", "python", "t.py"], MPICH)[:5] == [
        "/opt/mpi/bin/mpirun", "-np", "4", "-hosts", "a:2,b:2"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=4\nnode2 slots=2\n")
    c = cmd(["--hostfile", str(hostfile), "python", "t.py"], OPENMPI)
    assert c[1:3] == ["-np", "6"] and "--oversubscribe" not in c


def test_elastic_starts_open_mpi_with_ulfm_and_refuses_mpich():
    """Issue 46: perseusrun --elastic runs Open MPI's mpirun with ULFM on (a rank that
    fails is left behind); MPICH has no fault tolerance: a clear error."""
    made = cmd(["--elastic", "-np", "4", "python", "t.py"], OPENMPI)
    assert made[made.index("--with-ft") + 1] == "ulfm", made
    with pytest.raises(LauncherError, match="--elastic needs Open MPI 5 with ULFM"):
        cmd(["--elastic", "-np", "4", "python", "t.py"], MPICH)
    assert "--with-ft" not in cmd(["-np", "4", "python", "t.py"], OPENMPI)



def test_elastic_restart_runs_mpirun_without_ulfm_and_restarts_only_deaths():
    """Issue 46: on a core without ULFM, perseusrun --elastic runs the plain mpirun
    (main() sets elastic_restart) and restarts a job only when mpirun's exit code says a
    rank was killed by a signal (Hydra: the signal's number; Open MPI: 128 + it)."""
    from perseus.launcher import died_of_signal
    args = make_parser().parse_args(["--elastic", "-np", "4", "python", "t.py"])
    args.elastic_restart = True
    for flavour in (MPICH, OPENMPI):
        made = build_command(args, flavour, "/opt/mpi/bin/mpirun", environ={}, cpu_count=4,
                             is_root=False)
        assert "--with-ft" not in made, made
    assert [died_of_signal(c) for c in (9, 137, 15, 143, 11, 139, 6)] == [True] * 7
    assert [died_of_signal(c) for c in (0, 1, 2, 3, 127, 130, -9)] == [False] * 7


@pytest.mark.parametrize("argv,error", [
    (["--reset-limit", "2", "-np", "2", "python"], "--reset-limit needs --elastic"),
    (["--elastic", "--reset-limit", "-1", "-np", "2", "python"], "--reset-limit must be 0 or more"),
])
def test_reset_limit_checks(argv, error, capsys):
    from perseus.launcher import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and error in capsys.readouterr().err


def test_extra_mpi_args():
    c = cmd(["-np", "2", "--mpi-args", "-genv FOO 'a b'", "python", "t.py"], MPICH)
    assert c[3:] == ["-genv", "FOO", "a b", "python", "t.py"]


@pytest.mark.parametrize("argv", [
    ["-np", "0", "python"],
    ["-np", "2"],
    ["-np", "2", "-H", "a:0", "python"],
    ["-np", "2", "-H", "a:x", "python"],
    ["-np", "2", "-H", "a", "--hostfile", "f", "python"],
    ["python", "t.py"],
])
def test_bad_arguments(argv):
    with pytest.raises(LauncherError):
        cmd(argv, MPICH)


def _perseusrun(args, timeout=60):
    return subprocess.run([sys.executable, str(PERSEUSRUN)] + args, cwd=str(REPO_ROOT),
                          env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.mpi
def test_real_run_two_ranks():
    # One write per rank: print('rank', r) writes its pieces separately, and with
    # unbuffered output the two ranks' pieces could interleave ("rankrank 1\n 0").
    code = ("import sys, perseus.torch.horovod as hvd; hvd.init(); assert hvd.size() == 2; "
            "sys.stdout.write('rank %d\\n' % hvd.rank())")
    res = _perseusrun(["-np", "2", "--verbose", sys.executable, "-c", code])
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split("\n")[:2]) == ["rank 0", "rank 1"], res.stdout
    assert "perseusrun (mpich): " in res.stderr and " -np 2 " in res.stderr


@pytest.mark.mpi
def test_exit_code_is_mpiruns():
    res = _perseusrun(["-np", "2", sys.executable, "-c", "import sys; sys.exit(3)"])
    assert res.returncode == 3, res.stdout + res.stderr


def test_dry_run_prints_and_runs_nothing():
    res = _perseusrun(["-np", "2", "--dry-run", sys.executable, "-c", "raise SystemExit(5)"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("perseusrun (mpich): ") and "-np 2" in res.stdout


def _section(text, title):
    """The box lines under one horovodrun-style heading, as {label: checked}."""
    lines = text.split(title + ":\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {line.strip()[4:]: line.strip().startswith("[X]") for line in lines}


@pytest.mark.parametrize("flag", ["--check-build", "-cb"])
def test_check_build(flag):
    res = _perseusrun([flag])
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.startswith("Perseus v")
    # Frameworks: found without importing them; this venv has torch and neither of the others.
    assert _section(out, "Available Frameworks") == {"TensorFlow": False, "PyTorch": True, "MXNet": False}
    assert _section(out, "Available Controllers") == {"MPI": True, "Gloo": False}
    ops = _section(out, "Available Tensor Operations")
    assert set(ops) == {"NCCL", "DDL", "CCL", "MPI", "Gloo"} and ops["MPI"] and not ops["Gloo"]
    # The NCCL box is what nccl_built() answers in a process of its own.
    code = "from perseus.common import gpu; print(bool(gpu.nccl_built()))"
    built = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=clean_env(),
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    assert ops["NCCL"] == (built.stdout.strip() == "True")
    details = out.split("Details:\n", 1)[1]
    assert "MPI library:" in details and "MPICH" in details
    assert "GPU libraries:" in details and "GPU operations:" in details


def test_check_build_imports_no_framework():
    code = ("import sys; from perseus import check_build; check_build.report(); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'mxnet') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_framework_version_from_metadata():
    from perseus.check_build import framework_version
    assert framework_version("pytest") == pytest.__version__
    assert framework_version("no_such_package_here") is None


RESTARTED_JOB = """
import os, sys
restarts = int(os.environ["PERSEUS_ELASTIC_RESTARTS"])
print(os.environ["PERSEUS_ELASTIC_RUN_ID"], restarts, os.environ["PERSEUS_ELASTIC_RESET_LIMIT"])
sys.exit(int(sys.argv[1].split(",")[restarts]))
"""


@pytest.mark.parametrize("codes,limit,rc,runs,said", [
    ("9,137,0", 2, 0, 3, "restart 2 of at most 2"),       # Hydra's and Open MPI's codes of a kill
    ("9,9,9", 1, 9, 2, "already restarted 1 time(s), the --reset-limit: giving up"),
    ("1", 3, 1, 1, "exit code 1, which is not a rank killed by a signal"),
])
def test_restart_policy(codes, limit, rc, runs, said, capfd):
    """Issue 46: perseusrun --elastic's loop (the real kills are in
    tests/mpi/test_fault_tolerance.py): a job stands in for mpirun, exiting with the codes
    given, one per run; the same run id in every run, the restart count, the limit."""
    from perseus.launcher import run_restarting
    messages = []
    got = run_restarting([sys.executable, "-c", RESTARTED_JOB, codes], clean_env(), limit,
                         say=messages.append)
    lines = capfd.readouterr().out.split()
    assert got == rc, (got, messages)
    assert lines[1::3] == [str(n) for n in range(runs)] and len(set(lines[0::3])) == 1, lines
    assert lines[2::3] == [str(limit)] * runs, lines
    assert said in " ".join(messages), messages
