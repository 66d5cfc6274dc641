"""Invalid collective arguments raise what Horovod scripts catch, per front end, at
np 2 and 4 (MXNet's cases are in tests/mxnet/collectives.py)."""
import pytest

from support.jobs import TESTS_DIR, TF_ENV, tf_python

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


@pytest.mark.parametrize("nprocs", [2, 4])
def test_torch_error_types(run_mpi, nprocs):
    run_mpi("error_types", nprocs, timeout=120)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_tensorflow_error_types(run_mpi, nprocs):
    run_mpi("error_types", nprocs, env=TF_ENV, timeout=240, python=tf_python(),
            scripts_dir=TESTS_DIR / "tensorflow")
