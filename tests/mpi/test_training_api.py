"""Training API under mpirun -np 2 and 4: DistributedOptimizer against single-process
training on the whole batch (tests/rank_scripts/optimizer.py), and the broadcast helpers
restoring identical model and optimizer state (tests/rank_scripts/broadcast_state.py), and
DistributedOptimizer(op=Adasum) against a simulation (tests/rank_scripts/adasum_optimizer.py), and
DistributedOptimizer's per-parameter request cache (tests/rank_scripts/optimizer_cache.py),
its gradients as bucket views against one request per gradient
(tests/rank_scripts/optimizer_views.py), and its gathering of CPU gradients while the core
holds (tests/rank_scripts/optimizer_gather.py). Each script computes its reference on every
rank with plain torch; see their docstrings."""
import pytest
import torch

from perseus.torch.compression import Compression

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

NPROCS = [2, 4]
SCRIPTS = ["optimizer", "optimizer_cache", "optimizer_views", "optimizer_process_set", "broadcast_state",
           "adasum_optimizer"]


@pytest.mark.parametrize("nprocs", NPROCS)
@pytest.mark.parametrize("script", SCRIPTS)
def test_script(run_mpi_batch, script, nprocs):
    run_mpi_batch(script, nprocs, SCRIPTS, timeout=200)  # one job per np (tests/support/rank_batch.py)


HOLDS = {"default": {}, "300-bytes": {"PERSEUS_HOLD_BYTES": "300"}, "bytes-0": {"PERSEUS_HOLD_BYTES": "0"},
         "time-0": {"PERSEUS_HOLD_TIME": "0"}}


@pytest.mark.parametrize("nprocs", NPROCS)
@pytest.mark.parametrize("setting", list(HOLDS))
def test_optimizer_gathers_while_the_core_holds(run_mpi_batch, setting, nprocs):
    """tests/rank_scripts/optimizer_gather.py: the hooks gather CPU gradients exactly while the
    core would hold them, and training stays exact. The four holds in one job per np, each
    a fresh init() (run_mpi_batch's settings)."""
    run_mpi_batch("optimizer_gather", nprocs, ["optimizer_gather"], settings=HOLDS, setting=setting)


@pytest.mark.parametrize("name,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compression_round_trip(name, wire, dtype):
    compressor = getattr(Compression, name)
    x = torch.randn(17, dtype=dtype)
    sent, ctx = compressor.compress(x)
    assert sent.dtype == wire
    back = compressor.decompress(sent, ctx)
    assert back.dtype == dtype
    assert torch.equal(back, x.to(wire).to(dtype))
    # Integer tensors pass through untouched.
    i = torch.arange(5)
    sent, ctx = compressor.compress(i)
    assert sent is i and compressor.decompress(sent, ctx) is i
