"""hvd.elastic (Horovod's elastic API on MPI's fixed world), per front end, at np 2
and 4: sync from rank 0, commit / restore, run() retrying after an injected and a
real HorovodInternalError, reset callbacks, and the error for a resize request.

PyTorch: tests/rank_scripts/elastic.py; TensorFlow and Keras: tests/tensorflow/elastic.py
in .venv-tf (see tests/frameworks/test_tensorflow.py).
"""
import pytest

from support.jobs import TESTS_DIR, TF_ENV, tf_python

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(420)]


@pytest.mark.parametrize("nprocs", [2, 4])
def test_torch_elastic(run_mpi, nprocs):
    run_mpi("elastic", nprocs, timeout=240)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_tensorflow_elastic(run_mpi, nprocs):
    run_mpi("elastic", nprocs, env=TF_ENV, timeout=360, python=tf_python(),
            scripts_dir=TESTS_DIR / "tensorflow")
