"""The MXNet front end, tested in its own venv (.venv-mx, made by
scripts/setup_mxnet.sh, which scripts/setup.sh runs): each script in tests/mxnet/
runs under `mpirun -np 2` and `-np 4` with .venv-mx's python.

Skipped when .venv-mx is missing (setup.sh with PERSEUS_SKIP_MX=1) or with
PERSEUS_SKIP_MX=1; PERSEUS_MX_PYTHON names another interpreter with mxnet 1.9.1.
The examples in examples/mxnet/ (Gluon + Horovod API, Gluon with the KVStore swap,
Module.fit with the KVStore) run at np 2 and must reach the promised accuracy.
"""
import re
import subprocess

import pytest

from support.jobs import REPO_ROOT, TESTS_DIR, clean_env, framework_python, run_job

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(420)]

MX_SCRIPTS = TESTS_DIR / "mxnet"

SCRIPTS = [
    "collectives",  # every collective x dtype against numpy; mismatch errors; objects
    "training",     # DistributedTrainer / DistributedOptimizer vs one process; broadcast_parameters
    "kvstore",      # dist_sync_perseus: push/pull semantics, optimizer, gluon.Trainer, Module.fit
    "sync_batch_norm",  # PerseusSyncBatchNorm vs BatchNorm on the group's batch, both scopes
]
# Two simulated nodes of 2 ranks at np 4 (one node at np 2), for comm_scope=0.
SCRIPT_ENV = {"sync_batch_norm": {"PERSEUS_RANKS_PER_NODE": "2"}}


def mx_python():
    return framework_python("MXNet", "mx", "setup_mxnet.sh")


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("script", SCRIPTS)
def test_mxnet_script(run_mpi, run_mpi_batch, script, nprocs):
    if script in SCRIPT_ENV:
        run_mpi(script, nprocs, env=SCRIPT_ENV[script], timeout=360, python=mx_python(),
                scripts_dir=MX_SCRIPTS)
    else:  # the others in one job per np (tests/support/rank_batch.py)
        run_mpi_batch(script, nprocs, [s for s in SCRIPTS if s not in SCRIPT_ENV], timeout=300,
                      python=mx_python(), scripts_dir=MX_SCRIPTS)


def test_collectives_naive_engine(run_mpi):
    """MXNET_ENGINE_TYPE=NaiveEngine (synchronous MXNet, for debugging): the ops run
    at once and raise their errors from the call."""
    run_mpi("collectives", 2, env={"MXNET_ENGINE_TYPE": "NaiveEngine"}, timeout=360,
            python=mx_python(), scripts_dir=MX_SCRIPTS)


def test_single_process_without_mpirun():
    code = ("import mxnet as mx, perseus.mxnet as hvd\n"
            "hvd.init(); assert (hvd.rank(), hvd.size()) == (0, 1)\n"
            "assert hvd.allreduce(mx.nd.array([2.0])).asnumpy().tolist() == [2.0]\n"
            "assert hvd.allgather(mx.nd.ones((2, 1))).shape == (2, 1)\n"
            "hvd.shutdown(); print('single ok')\n"
            # an op nobody reads is still in MXNet's engine at exit: it must finish
            # before Perseus shuts down, not fail
            "hvd.init(); y = hvd.allreduce(mx.nd.ones((500, 500)))\n")
    result = subprocess.run([str(mx_python()), "-c", code], cwd=str(REPO_ROOT), env=clean_env(),
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "single ok" in result.stdout, result.stderr
    assert "failed" not in result.stderr and "Error" not in result.stderr, result.stderr


@pytest.mark.parametrize("example", ["gluon_digits", "gluon_digits_kvstore", "module_digits"])
def test_example_two_ranks(example):
    out = run_job(2, [mx_python(), REPO_ROOT / "examples" / "mxnet" / ("%s.py" % example)],
                  timeout=240)
    assert len(re.findall(r"^Epoch +\d+/20: ", out, re.M)) == 20, out  # rank 0 alone prints
    final = re.search(r"^Final test accuracy: ([\d.]+)% on 2 rank\(s\)", out, re.M)
    assert final and float(final.group(1)) >= 95.0, out
