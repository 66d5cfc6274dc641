"""CUDA tensors: in this process (a world of one), and the multi-rank scripts under
mpirun in each GPU configuration. Skipped cleanly where torch sees no CUDA device;
scripts/gpu_check.sh runs this file on a GPU machine, one configuration at a time
(`-k <config>`; the in-process tests are `-m "not mpi"`).

Configurations (CONFIGS):
  nccl_np1_lanes{1,2,4}  NCCL at size 1 (the same code path as size N) with 1, 2 and 4
                         lanes (PERSEUS_ALLREDUCE_STREAMS);
  mpi_np2_shared         host-staged (PERSEUS_GPU_OPERATIONS=mpi), two ranks sharing GPU 0
                         (NCCL refuses two ranks on one GPU);
  nccl_np2               NCCL across two GPUs, only where torch sees at least two;
  auto_np2_shared        two ranks on GPU 0 with nothing set: the lanes see the shared
                         GPU and run host-staged (one warning) instead of failing in NCCL;
  nccl_np{2,4}_shared_lanes{1,2,4}
                         NCCL with 2 and 4 ranks on GPU 0 (NCCL 2.30+ with
                         NCCL_MULTI_RANK_GPU_ENABLE=1: the NCCL Perseus loads, e.g.
                         PERSEUS_NCCL_LIB, which scripts/gpu_check.sh --nccl sets and names in
                         PERSEUS_KEEP_ENV so that the jobs get it), 1, 2 and 4 lanes; skipped
                         where that NCCL cannot. NCCL's INIT log must show a communicator
                         made with that NCCL (not the host-staged fallback).
Scripts: the CPU collective scripts of tests/rank_scripts rerun on CUDA tensors
(PTEST_DEVICE, see tests/rank_scripts/common.py), and the torch CUDA ones
(tests/rank_scripts/gpu_torch_*.py, PTEST_GPU). A configuration's scripts run in one MPI
job, in turn (tests/support/batch_job.py; its first test starts it): the ranks start,
import torch, make their CUDA context and load NCCL once per configuration, not once
per script (issue 47: the device time of a lent GPU is short). A script that did not
end there (it failed, or one before it did) runs alone, and that run is its test's
report. With $PERSEUS_GPU_LOGS set (scripts/gpu_check.sh), a job's output goes to
job_<config>.log there as it comes. scripts/gpu_check.sh may run a configuration in parts
(scripts/gpu_plan.py): $PERSEUS_GPU_CHECK_SCRIPTS names a part's scripts (the job runs only
those), $PERSEUS_GPU_CHECK_JOB its log's name, $PERSEUS_GPU_CHECK_JOB_S the job's time limit.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import batch_job
from support.jobs import REPO_ROOT, clean_env

CONFIG_JOB_TIMEOUT_S = int(os.environ.get("PERSEUS_GPU_CHECK_JOB_S", "200"))  # gpu_check.sh's plan sets it

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(max(300, CONFIG_JOB_TIMEOUT_S + 60)),  # a configuration's first test runs its job
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]

# CPU scripts that take PTEST_DEVICE, and the torch CUDA scripts (PTEST_GPU). (gpu_*.py
# without "torch" are the core's C ABI tests on a fake CUDA, run by test_gpu_core.py.)
REUSED = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
          "join", "barrier", "process_sets"]
GPU_ONLY = ["gpu_torch_collectives", "gpu_torch_ordering", "gpu_torch_sizes", "gpu_torch_training",
            "gpu_torch_backend", "gpu_torch_mismatch"]
NEEDS_TWO_RANKS = {"barrier", "process_sets", "gpu_torch_mismatch"}
# Scripts that reduce no device tensor, so NCCL makes no communicator (and logs no INIT line).
NO_DEVICE_TENSORS = {"barrier"}
# Where lanes matter: reductions, fusion, ordering across streams, training.
LANE_SCRIPTS = ["allreduce", "grouped_allreduce", "reducescatter", "gpu_torch_collectives",
                "gpu_torch_ordering", "gpu_torch_sizes", "gpu_torch_training"]

# name -> (ranks, environment, device spec, scripts, GPUs needed)
CONFIGS = {
    "nccl_np1_lanes1": (1, {"PERSEUS_ALLREDUCE_STREAMS": "1"}, "cuda", REUSED + GPU_ONLY, 1),
    "nccl_np1_lanes2": (1, {"PERSEUS_ALLREDUCE_STREAMS": "2"}, "cuda", LANE_SCRIPTS, 1),
    "nccl_np1_lanes4": (1, {"PERSEUS_ALLREDUCE_STREAMS": "4"}, "cuda", LANE_SCRIPTS, 1),
    "mpi_np2_shared": (2, {"PERSEUS_GPU_OPERATIONS": "mpi"}, "cuda:0", REUSED + GPU_ONLY, 1),
    "nccl_np2": (2, {"PERSEUS_GPU_OPERATIONS": "nccl"}, "cuda", REUSED + GPU_ONLY, 2),
    "auto_np2_shared": (2, {}, "cuda:0", ["allreduce", "gpu_torch_collectives", "gpu_torch_training"], 1),
    "nccl_np2_shared_lanes1": (2, {"PERSEUS_ALLREDUCE_STREAMS": "1"}, "cuda:0", REUSED + GPU_ONLY, 1),
    "nccl_np2_shared_lanes2": (2, {"PERSEUS_ALLREDUCE_STREAMS": "2"}, "cuda:0", LANE_SCRIPTS + ["process_sets"], 1),
    "nccl_np2_shared_lanes4": (2, {"PERSEUS_ALLREDUCE_STREAMS": "4"}, "cuda:0", LANE_SCRIPTS + ["process_sets"], 1),
    "nccl_np4_shared_lanes1": (4, {"PERSEUS_ALLREDUCE_STREAMS": "1"}, "cuda:0", REUSED + GPU_ONLY, 1),
    "nccl_np4_shared_lanes2": (4, {"PERSEUS_ALLREDUCE_STREAMS": "2"}, "cuda:0", LANE_SCRIPTS + ["process_sets"], 1),
    "nccl_np4_shared_lanes4": (4, {"PERSEUS_ALLREDUCE_STREAMS": "4"}, "cuda:0", LANE_SCRIPTS + ["process_sets"], 1),
}
# What the shared-GPU NCCL configurations add: NCCL's permission, and its INIT log (on
# stdout), which names the version of the communicators it makes.
SHARED_NCCL_ENV = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
# A communicator's line in that log ("ncclCommInitRank comm 0x... rank 0 nranks 2 ... - Init
# COMPLETE"; ncclCommInitRankConfig or ncclCommSplit for some).
NCCL_COMMUNICATOR = re.compile(r"NCCL INFO .*(ncclComm\w+ comm 0x|Init COMPLETE)")
_multi_rank = None


def multi_rank_nccl():
    """(version or None, why): whether the NCCL Perseus loads here runs several ranks on
    one GPU, as perseusrun --check-build says (asked once, in a fresh process)."""
    global _multi_rank
    if _multi_rank is None:
        code = "from perseus.common import gpu; print(gpu.describe())"
        out = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), capture_output=True, text=True,
                             env=clean_env(SHARED_NCCL_ENV), timeout=120).stdout
        lines = [line for line in out.splitlines() if line.startswith(("NCCL:", "Ranks sharing a GPU:"))]
        version = re.search(r"NCCL: .* \(version (\S+)\)", out)
        usable = version is not None and "Ranks sharing a GPU: use NCCL" in out
        _multi_rank = (version.group(1) if usable else None, "; ".join(lines) or out.strip())
    return _multi_rank


def config_scripts(config):
    np, _, _, scripts, _ = CONFIGS[config]
    return [s for s in scripts if np >= 2 or s not in NEEDS_TWO_RANKS]


def script_cases():
    for config in CONFIGS:
        for script in config_scripts(config):
            yield pytest.param(config, script, id="%s-%s" % (config, script))


def script_env(script, device):
    """Where the script puts its tensors: PTEST_GPU for the torch CUDA scripts."""
    return {("PTEST_GPU" if script in GPU_ONLY else "PTEST_DEVICE"): device}


def entry(script):
    return "%s[own]" % script  # its name in the batch: under its own variables


_config_jobs = {}  # configuration -> its job (batch_job.BatchJob)


def config_job(config, env, scratch):
    """The job that ran every script of `config` (started by its first test)."""
    if config not in _config_jobs:
        np, _, device, _, _ = CONFIGS[config]
        logs = os.environ.get("PERSEUS_GPU_LOGS")
        part = os.environ.get("PERSEUS_GPU_CHECK_SCRIPTS", "").split()  # a part of the configuration
        entries = {entry(s): (s, script_env(s, device)) for s in config_scripts(config) if not part or s in part}
        name = os.environ.get("PERSEUS_GPU_CHECK_JOB", config)
        _config_jobs[config] = batch_job.run(
            entries, np, env, CONFIG_JOB_TIMEOUT_S, scratch,
            log=Path(logs) / ("job_%s.log" % name) if logs else None)
    return _config_jobs[config]


@pytest.mark.mpi
@pytest.mark.parametrize("config, script", list(script_cases()))
def test_script(run_mpi, tmp_path_factory, config, script):
    np, env, device, _, gpus = CONFIGS[config]
    if torch.cuda.device_count() < gpus:
        pytest.skip("%s needs %d GPUs, torch sees %d" % (config, gpus, torch.cuda.device_count()))
    shared_nccl = config.startswith("nccl_") and "_shared_" in config
    if shared_nccl:
        version, why = multi_rank_nccl()
        if version is None:
            pytest.skip("the NCCL Perseus loads here cannot run several ranks on one GPU: %s" % why)
        env = dict(env, **SHARED_NCCL_ENV)
    job = config_job(config, env, tmp_path_factory.mktemp(config))
    if job.ended(entry(script)):
        if job.exit_failure():  # every script ended, but the job failed at its exit
            pytest.fail("%s ended, but %s" % (entry(script), job.exit_failure()), pytrace=False)
        out = job.window(entry(script))  # every rank returned from it: it passed
    else:
        out = run_mpi(script, np, env=dict(env, **script_env(script, device)), timeout=240)
    # That NCCL made the script's communicators (the host-staged fallback makes none): its
    # banner, printed once a process, names the version, and each communicator it makes
    # logs a line of its own (INIT).
    if shared_nccl and script not in NO_DEVICE_TENSORS:
        banner = job.out if job.ended(entry(script)) else out
        assert "NCCL version %s" % version in banner and NCCL_COMMUNICATOR.search(out), \
            "no NCCL %s communicator in NCCL's INIT log:\n%s" % (version, out)


# ---------------------------------------------------------------- in this process

def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).cuda()
    return torch.randint(0, 50, shape, generator=g).to(dtype).cuda()


def test_built_answers(hvd):
    assert hvd.cuda_built() is True
    assert hvd.nccl_built() >= 20000  # NCCL_VERSION_CODE of an NCCL 2.x
    res = subprocess.run([sys.executable, str(REPO_ROOT / "bin" / "perseusrun"), "--check-build"],
                         cwd=str(REPO_ROOT), env=clean_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[X] NCCL" in res.stdout, res.stdout


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_collectives_on_cuda_tensors(hvd, dtype):
    for i, shape in enumerate([(), (17,), (1 << 16,), (3, 4)]):
        x = make(shape, dtype, seed=i)
        tag = "gpu.%s.%d" % (dtype, i)
        for op in (hvd.Sum, hvd.Min, hvd.Max):
            out = hvd.allreduce(x, name="%s.%s" % (tag, op), op=op)
            assert out.device == x.device and torch.equal(out, x)
        y = x.clone()
        hvd.allreduce_(y, name=tag + ".inplace", op=hvd.Sum)
        assert torch.equal(y, x)
        assert torch.equal(hvd.broadcast(x, 0, name=tag + ".bc"), x)
        if x.dim():
            out = hvd.allgather(x, name=tag + ".ag")
            assert out.device == x.device and torch.equal(out, x)
    if dtype.is_floating_point:
        x = make((1000,), dtype)
        out = hvd.allreduce(x, name="gpu.scale.%s" % dtype, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
        torch.testing.assert_close(out, x * 0.5)


def test_grouped_and_async_on_cuda(hvd):
    xs = [make((n,), torch.float32, seed=n) for n in (1, 100, 10000)]
    outs = hvd.grouped_allreduce(xs, name="gpu.grouped", op=hvd.Sum)
    for out, x in zip(outs, xs):
        assert out.is_cuda and torch.equal(out, x)
    handles = [hvd.allreduce_async(x, name="gpu.async.%d" % i, op=hvd.Sum) for i, x in enumerate(xs)]
    for handle, x in zip(handles, xs):
        assert torch.equal(hvd.synchronize(handle), x)


def test_empty_and_alltoall_on_cuda(hvd):
    for dtype in (torch.float32, torch.int64):
        empty = torch.empty(0, 3, dtype=dtype, device="cuda")
        assert hvd.allreduce(empty, name="gpu.empty.%s" % dtype, op=hvd.Sum).shape == (0, 3)
        assert hvd.allgather(empty, name="gpu.empty.ag.%s" % dtype).shape == (0, 3)
        x = make((5, 2), dtype)
        out, received = hvd.alltoall(x, splits=[5], name="gpu.a2a.%s" % dtype)
        assert out.is_cuda and torch.equal(out, x) and [int(v) for v in received] == [5]
        rs = hvd.reducescatter(x, name="gpu.rs.%s" % dtype, op=hvd.Sum)
        assert rs.is_cuda and torch.equal(rs, x)


def test_cpu_work_beside_cuda_work(hvd):
    # Both kinds in flight at once, each result on its input's device.
    cpu = torch.arange(10, dtype=torch.float32)
    gpu = cpu.cuda()
    h1 = hvd.allreduce_async(cpu, name="gpu.mixed.cpu", op=hvd.Sum)
    h2 = hvd.allreduce_async(gpu, name="gpu.mixed.cuda", op=hvd.Sum)
    a, b = hvd.synchronize(h1), hvd.synchronize(h2)
    assert a.device.type == "cpu" and b.is_cuda
    assert torch.equal(a, cpu) and torch.equal(b.cpu(), cpu)
