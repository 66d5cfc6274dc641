"""A process that torchrun (or python -m torch.distributed.launch) started as one of N,
but that MPI sees as a world of one, is refused by init() in every front end, naming
the count and `mpirun -np N` (issue 49, point 1); a plain `python` and a real
`mpirun -np 1` still run. perseus.common.launch_check holds the check; the core checks
MPI launchers and srun (tests/launch/test_slurm.py)."""
import subprocess
import sys
import textwrap

import pytest

from support.jobs import REPO_ROOT, clean_env, find_mpirun, framework_python, run_bounded
from perseus.common.launch_check import launched_alone_error, started_by_srun

pytestmark = pytest.mark.timeout(180)

REFUSED = ("init(): WORLD_SIZE=2, RANK=1 says a launcher (torchrun or python -m "
           "torch.distributed.launch?) started 2 processes, but MPI says the world has 1 "
           "rank, so each would train alone as rank 0 of 1. Perseus takes its ranks from "
           "MPI, not from torch's launcher variables: launch with mpirun -np 2 (or "
           "perseusrun -np 2)")


@pytest.mark.parametrize("mpi_size,env,expected", [
    (1, {"WORLD_SIZE": "2", "RANK": "1"}, REFUSED),
    (1, {"WORLD_SIZE": "4"}, "init(): WORLD_SIZE=4 says"),  # torch.distributed.launch of old
    (1, {}, None),                                          # plain python, mpirun -np 1
    (1, {"WORLD_SIZE": "1", "RANK": "0"}, None),            # torchrun --nproc_per_node 1
    (1, {"WORLD_SIZE": "two"}, None),                       # not a launcher's value
    (2, {"WORLD_SIZE": "2", "RANK": "1"}, None),            # mpirun -np 2 under a torch env
    (1, {"SLURM_NTASKS": "4", "LOCAL_WORLD_SIZE": "4"}, None),  # no WORLD_SIZE: not torch's
])
def test_launched_alone_error(mpi_size, env, expected):
    error = launched_alone_error(mpi_size, env)
    if expected is None:
        assert error is None, error
    else:
        assert isinstance(error, RuntimeError) and str(error).startswith(expected), error


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "PMIX_RANK": "3"}, True),  # srun -n 4
    ({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, False),   # srun -n 1: no peer to lose
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}, False),           # an sbatch script's shell
    # mpirun (Open MPI's prterun, Hydra) inside a step: the innermost launcher is MPI's
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "PRTE_LAUNCHED": "1"}, False),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "OMPI_COMM_WORLD_SIZE": "4"}, False),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "PMI_SIZE": "4"}, False),
    ({}, False),
])
def test_started_by_srun(env, expected):
    """Under srun (not an mpirun inside the allocation) a ULFM core says that a failure
    ends the job (tests/launch/test_slurm.py runs it)."""
    assert started_by_srun(env) is expected


# Prints REFUSED: <error> and whether Perseus is left initialized, then inits again
# without WORLD_SIZE.
SNIPPET = textwrap.dedent("""
    import os
    import {module} as hvd
    try:
        hvd.init()
    except RuntimeError as e:
        print("REFUSED %s: %s" % (type(e).__name__, e))
        print("initialized after the refusal:", hvd.is_initialized())
        del os.environ["WORLD_SIZE"]
        hvd.init()
    print("size", hvd.size())
    hvd.shutdown()
""")

FRONT_ENDS = {"torch": "perseus.torch.horovod", "tf": "perseus.tensorflow.horovod",
              "mx": "perseus.mxnet"}


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
def test_init_refuses_a_world_of_one_that_torchrun_started(front_end):
    python = sys.executable
    if front_end == "tf":
        python = str(framework_python("TensorFlow", "tf", "setup_tf.sh"))
    elif front_end == "mx":
        python = str(framework_python("MXNet", "mx", "setup_mxnet.sh"))
    env = clean_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "2",
                     "TF_CPP_MIN_LOG_LEVEL": "2"})
    result = subprocess.run([python, "-c", SNIPPET.format(module=FRONT_ENDS[front_end])],
                            cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=150)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "REFUSED HorovodInternalError: " + REFUSED in result.stdout, out
    assert "initialized after the refusal: False" in result.stdout, out
    assert "size 1" in result.stdout, out  # a plain process still runs, after the refusal


def test_torchrun_two_processes_are_refused(tmp_path):
    """The real launcher: torchrun --nproc_per_node 2 fails, each process saying why."""
    script = tmp_path / "train.py"
    script.write_text("import perseus.torch.horovod as hvd\nhvd.init()\nprint('TRAINED ALONE')\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--no-python", sys.executable, str(script)]
    code, out, err, _ = run_bounded(cmd, clean_env(), 150)
    assert code != 0 and "TRAINED ALONE" not in out, (out, err)
    for rank in (0, 1):
        text = REFUSED.replace("RANK=1", "RANK=%d" % rank)
        assert text in err, err


@pytest.mark.mpi
def test_mpirun_np_1_is_not_refused():
    snippet = "import perseus.torch.horovod as hvd; hvd.init(); print('size', hvd.size())"
    code, out, err, _ = run_bounded([find_mpirun(), "-np", "1", sys.executable, "-c", snippet],
                                    clean_env(), 60)
    assert code == 0 and "size 1" in out, (out, err)
