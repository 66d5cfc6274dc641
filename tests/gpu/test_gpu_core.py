"""The core's GPU path, tested where no GPU is: no torch needed, everything through
the C ABI (tests/support/capi.py, ctypes).

- The loader of the CUDA runtime and NCCL: with the real libnccl.so.2 of the
  nvidia-nccl-cu12/-cu13 wheel (found through $PERSEUS_TEST_NCCL_DIR or a
  site-packages nvidia/nccl/lib folder; skipped with the reason if absent) it loads
  and reports its version; a missing library names every path tried.
- GPU requests on a machine where CUDA cannot be used fail on every rank, and the
  engine goes on serving CPU requests; a CPU/GPU mismatch is an error on every rank.
- The device lanes' logic (NCCL and host-staged paths, fusion, uneven splits, scale
  factors, failures, shutdown; packing fusion buffers by each way there is) on a fake
  CUDA runtime and NCCL (tests/gpu_fakes), built here with mpicc.
- Fusion planning with CPU and GPU requests of different ordinals (a C++ test).
- The configuration values PERSEUS_GPU_OPERATIONS / HOROVOD_GPU_OPERATIONS,
  PERSEUS_CUDA_LIB and PERSEUS_NCCL_LIB.
"""
import ctypes
import glob
import os
import subprocess
import sys
import textwrap

import pytest

from support.jobs import REPO_ROOT, TESTS_DIR
from support.cpp_build import find_mpi_compiler

pytestmark = pytest.mark.timeout(240)


def real_nccl_dir():
    """A folder holding the real libnccl.so.2, or None."""
    configured = os.environ.get("PERSEUS_TEST_NCCL_DIR")
    if configured:
        return configured if os.path.exists(os.path.join(configured, "libnccl.so.2")) else None
    for site in sys.path:
        for lib in glob.glob(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2")):
            return os.path.dirname(lib)
    return None


NO_NCCL = ("the real NCCL library is not installed: `pip install nvidia-nccl-cu13` (or -cu12) "
           "into this environment, or set PERSEUS_TEST_NCCL_DIR to a folder holding libnccl.so.2")


# ---------------------------------------------------------------- the loader

LOAD_SNIPPET = textwrap.dedent("""
    import ctypes, os
    from perseus.common import library as lib
    dirs = os.environ.get("TEST_GPU_DIRS")
    if dirs is not None:
        assert lib.perseus_set_gpu_library_dirs(dirs.encode()) == 0
    cuda, nccl = ctypes.c_int32(-1), ctypes.c_int32(-1)
    status = lib.perseus_gpu_load(ctypes.byref(cuda), ctypes.byref(nccl))
    print("STATUS", status, "CUDA", cuda.value, "NCCL", nccl.value)
    print("ERROR", lib.perseus_last_error().decode() if status else "")
    print(lib.perseus_gpu_describe().decode())
    again = lib.perseus_set_gpu_library_dirs(b"/somewhere/else")
    same = lib.perseus_set_gpu_library_dirs((dirs or "").encode())
    print("DIRS_AFTER_LOAD", again, same)
""")


def load(run_python, env=None):
    result = run_python(LOAD_SNIPPET, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_real_nccl_loads_from_its_folder(run_python):
    folder = real_nccl_dir()
    if folder is None:
        pytest.skip(NO_NCCL)
    out = load(run_python, {"PERSEUS_NCCL_LIB": folder})
    assert "NCCL 1" in out, out
    assert "NCCL: %s (version 2." % os.path.join(folder, "libnccl.so.2") in out, out


def test_real_nccl_loads_from_the_front_ends_folders(run_python):
    folder = real_nccl_dir()
    if folder is None:
        pytest.skip(NO_NCCL)
    out = load(run_python, {"TEST_GPU_DIRS": "/nonexistent/folder:" + folder})
    assert "NCCL 1" in out and "(version 2." in out, out
    # Other folders once loaded: refused; the same folders again: accepted.
    assert "DIRS_AFTER_LOAD 1 0" in out, out


def test_missing_configured_nccl_names_the_path(run_python):
    out = load(run_python, {"PERSEUS_NCCL_LIB": "/nonexistent/libnccl.so.2"})
    assert "NCCL 0" in out, out
    assert ("NCCL: not loaded: could not load NCCL from PERSEUS_NCCL_LIB=/nonexistent/libnccl.so.2; "
            "tried: /nonexistent/libnccl.so.2 (") in out, out
    assert "No such file" in out, out


def test_no_nccl_anywhere_names_every_path_tried(run_python, tmp_path):
    try:
        ctypes.CDLL("libnccl.so.2")
        pytest.skip("libnccl.so.2 is on this machine's loader path")
    except OSError:
        pass
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    out = load(run_python, {"TEST_GPU_DIRS": "%s:%s" % (a, b)})
    assert "NCCL 0" in out, out
    for path in ("%s/libnccl.so.2 (" % a, "%s/libnccl.so (" % a, "%s/libnccl.so.2 (" % b,
                 "libnccl.so.2 via the system loader path (", "libnccl.so via the system loader path ("):
        assert path in out, "%r not named:\n%s" % (path, out)
    assert "set PERSEUS_NCCL_LIB" in out, out


def test_missing_cuda_runtime_fails_the_load(run_python, tmp_path):
    # A folder: each name is tried in it, and nothing else.
    out = load(run_python, {"PERSEUS_CUDA_LIB": str(tmp_path)})
    assert "STATUS 7 CUDA 0" in out, out
    assert "could not load the CUDA runtime from PERSEUS_CUDA_LIB=%s" % tmp_path in out, out
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        assert "%s/%s (" % (tmp_path, name) in out, out
    assert "system loader path" not in out.split("NCCL:")[0], out
    # A file.
    out = load(run_python, {"PERSEUS_CUDA_LIB": "/nonexistent/libcudart.so.12"})
    assert "STATUS 7 CUDA 0" in out, out
    assert "tried: /nonexistent/libcudart.so.12 (" in out and "No such file" in out, out


def test_describe_reports_the_runtime_and_devices(run_python, fake_gpu):
    out = load(run_python, fake_gpu)
    assert "STATUS 0 CUDA 1 NCCL 1" in out, out
    assert "CUDA runtime: %s/libcudart.so.12 (runtime 12.8, driver 12.8); devices: 1" % \
        fake_gpu["PERSEUS_CUDA_LIB"] in out, out
    assert "NCCL: %s/libnccl.so.2 (version 2.23.5)" % fake_gpu["PERSEUS_NCCL_LIB"] in out, out


# What perseusrun --check-build says (the core's description) about ranks that share a
# GPU and about the launch order on the GPU, for each NCCL version and setting.
NCCL_CHOICES = {
    "2.23": ({}, ["Ranks sharing a GPU: host-staged through MPI, with one warning: NCCL 2.23.5 refuses several "
                  "ranks on one GPU (NCCL 2.30 or later does, with NCCL_MULTI_RANK_GPU_ENABLE=1)",
                  "Launch order on the GPU: the launch order only: NCCL 2.23.5 has no launch order implicit"]),
    "2.28-multi_rank_asked": (
        {"FAKE_NCCL_VERSION": "22809", "NCCL_MULTI_RANK_GPU_ENABLE": "1"},
        ["with one warning: NCCL 2.28.9 refuses several ranks on one GPU",
         "Launch order on the GPU: the launch order only: NCCL 2.28.9 takes launch order implicit from "
         "NCCL_LAUNCH_ORDER_IMPLICIT=1 alone, which would apply to every NCCL communicator of the process"]),
    "2.28-implicit_in_env": ({"FAKE_NCCL_VERSION": "22809", "NCCL_LAUNCH_ORDER_IMPLICIT": "1"},
                             ["Launch order on the GPU: NCCL_LAUNCH_ORDER_IMPLICIT=1 in the environment decides, "
                              "for every NCCL communicator of the process"]),
    "2.32": ({"FAKE_NCCL_VERSION": "23203"},
             ["with one warning: NCCL_MULTI_RANK_GPU_ENABLE is not set, not 1 (NCCL 2.32.3 runs several ranks on "
              "one GPU when it is 1)",
              "Launch order on the GPU: per communicator: Perseus's are made with launchOrderImplicit=1 "
              "(NCCL 2.32.3); other NCCL communicators in the process keep their own setting"]),
    "2.32-multi_rank": ({"FAKE_NCCL_VERSION": "23203", "NCCL_MULTI_RANK_GPU_ENABLE": "1"},
                        ["Ranks sharing a GPU: use NCCL: NCCL 2.32.3 with NCCL_MULTI_RANK_GPU_ENABLE=1 runs several "
                         "ranks on one GPU"]),
    "2.32-multi_rank_with_nvls": (
        {"FAKE_NCCL_VERSION": "23203", "NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"},
        ["with one warning: NCCL_NVLS_ENABLE=1 cannot go with NCCL_MULTI_RANK_GPU_ENABLE=1"]),
    "2.32-implicit_off_in_env": ({"FAKE_NCCL_VERSION": "23203", "NCCL_LAUNCH_ORDER_IMPLICIT": "0"},
                                 ["Launch order on the GPU: NCCL_LAUNCH_ORDER_IMPLICIT=0 in the environment decides"]),
}


@pytest.mark.parametrize("case", list(NCCL_CHOICES))
def test_describe_says_what_this_nccl_does_with_shared_gpus_and_launch_order(run_python, fake_gpu, case):
    env, lines = NCCL_CHOICES[case]
    out = load(run_python, dict(fake_gpu, **env))
    for line in lines:
        assert line in out, "%r not in:\n%s" % (line, out)


def test_check_build_says_it(fake_gpu):
    from support.jobs import clean_env
    res = subprocess.run([sys.executable, str(REPO_ROOT / "bin" / "perseusrun"), "--check-build"], cwd=str(REPO_ROOT),
                         env=clean_env(dict(fake_gpu, FAKE_NCCL_VERSION="23203", NCCL_MULTI_RANK_GPU_ENABLE="1")),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    for line in ("Ranks sharing a GPU: use NCCL: NCCL 2.32.3 with NCCL_MULTI_RANK_GPU_ENABLE=1",
                 "Launch order on the GPU: per communicator: Perseus's are made with launchOrderImplicit=1"):
        assert line in res.stdout, res.stdout


# ---------------------------------------------------------------- configuration

CONFIG_SNIPPET = textwrap.dedent("""
    from perseus.common import library as lib
    status = lib.perseus_init(-1)
    if status:
        print("INIT_ERROR", status, lib.perseus_last_error().decode())
    else:
        print(lib.perseus_config_string().decode())
        lib.perseus_shutdown()
""")

BAD_GPU_SETTINGS = [
    ({"PERSEUS_GPU_OPERATIONS": "gloo2"}, "PERSEUS_GPU_OPERATIONS='gloo2' is invalid", "nccl or mpi"),
    ({"HOROVOD_GPU_OPERATIONS": "DDL"}, "HOROVOD_GPU_OPERATIONS='DDL' is invalid", "not implemented"),
    ({"PERSEUS_GPU_OPERATIONS": ""}, "PERSEUS_GPU_OPERATIONS='' is invalid", "nccl or mpi"),
]


@pytest.mark.parametrize("env,named,says", BAD_GPU_SETTINGS, ids=lambda v: str(v)[:30])
def test_bad_gpu_operations_fail_init(run_python, env, named, says):
    result = run_python(CONFIG_SNIPPET, env=env)
    assert "INIT_ERROR 6" in result.stdout, result.stdout + result.stderr
    assert named in result.stdout and says in result.stdout, result.stdout


GOOD_GPU_SETTINGS = [
    ({}, ["PERSEUS_GPU_OPERATIONS=nccl", "PERSEUS_CUDA_LIB=\n", "PERSEUS_NCCL_LIB=\n"]),
    ({"HOROVOD_GPU_OPERATIONS": "MPI"}, ["PERSEUS_GPU_OPERATIONS=mpi"]),
    ({"PERSEUS_GPU_OPERATIONS": "Nccl"}, ["PERSEUS_GPU_OPERATIONS=nccl"]),
    ({"PERSEUS_CUDA_LIB": "/opt/cuda/lib64", "PERSEUS_NCCL_LIB": "/opt/nccl/libnccl.so.2"},
     ["PERSEUS_CUDA_LIB=/opt/cuda/lib64\n", "PERSEUS_NCCL_LIB=/opt/nccl/libnccl.so.2\n"]),
]


@pytest.mark.parametrize("env,lines", GOOD_GPU_SETTINGS, ids=lambda v: str(v)[:40])
def test_gpu_settings_are_accepted(run_python, env, lines):
    result = run_python(CONFIG_SNIPPET, env=env)
    assert "INIT_ERROR" not in result.stdout, result.stdout + result.stderr
    for line in lines:
        assert line in result.stdout, result.stdout


# ---------------------------------------------------------------- requests, no usable GPU

@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2])
def test_gpu_request_without_usable_cuda_fails_on_every_rank(run_mpi, nprocs):
    # Whatever this machine has (a runtime without a driver, or no runtime at all).
    run_mpi("gpu_unavailable", nprocs, timeout=120)


@pytest.mark.mpi
def test_gpu_request_with_unloadable_runtime_names_the_path(run_mpi):
    run_mpi("gpu_unavailable", 2, timeout=120,
            env={"PERSEUS_CUDA_LIB": "/nonexistent/libcudart.so.12",
                 "GPU_EXPECT": "PERSEUS_CUDA_LIB=/nonexistent/libcudart.so.12; tried: "
                               "/nonexistent/libcudart.so.12 ("})


@pytest.mark.mpi
def test_gpu_request_without_a_device_fails_on_every_rank(run_mpi, fake_gpu):
    run_mpi("gpu_unavailable", 2, timeout=120,
            env=dict(fake_gpu, FAKE_CUDA_DEVICES="0", GPU_EXPECT="no usable CUDA device"))


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_cpu_and_gpu_tensor_under_one_name_is_a_mismatch(run_mpi, nprocs):
    run_mpi("gpu_mismatch", nprocs, timeout=120)


# ---------------------------------------------------------------- device lanes on the fake

LANE_CASES = {
    "nccl-np1": (1, {"GPU_MODE": "nccl"}),
    "nccl-np2": (2, {"GPU_MODE": "nccl"}),
    "nccl-np2-lanes3-cuda_rank": (2, {"GPU_MODE": "nccl", "PERSEUS_ALLREDUCE_STREAMS": "3",
                                      "FAKE_CUDA_DEVICES": "2"}),
    "nccl-np4-tiny_fusion": (4, {"GPU_MODE": "nccl", "PERSEUS_FUSION_THRESHOLD": "64"}),
    "staged-np2": (2, {"GPU_MODE": "staged", "PERSEUS_GPU_OPERATIONS": "mpi"}),
    "staged-np2-horovod_spelling-lanes2": (2, {"GPU_MODE": "staged", "HOROVOD_GPU_OPERATIONS": "MPI",
                                               "PERSEUS_ALLREDUCE_STREAMS": "2"}),
    "nccl-np2-nancheck": (2, {"GPU_MODE": "nccl", "PERSEUS_ALLREDUCE_NANCHECK": "1"}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(LANE_CASES))
def test_device_lanes_on_fake_gpu(run_mpi, fake_gpu, case):
    nprocs, env = LANE_CASES[case]
    run_mpi("gpu_collectives", nprocs, env=dict(fake_gpu, **env), timeout=180)


# Every collective on both sides of every size boundary (tests/rank_scripts/gpu_sizes.py). The
# fake reports NCCL 2.23.5 and models the one-rank bug that NCCL < 2.29.7 has, so the
# np1 NCCL cases fail unless such calls are made in whole pieces; "nccl_fixed" reports
# 2.29.7 (one call). Chunk and fusion threshold made small, so that their boundaries
# cost little.
SMALL_LIMITS = {"PERSEUS_CHUNK_SIZE": "65536", "PERSEUS_FUSION_THRESHOLD": "262144"}
SIZE_CASES = {
    "nccl-np1": (1, {"GPU_MODE": "nccl"}),
    "nccl-np1-lanes4": (1, {"GPU_MODE": "nccl", "PERSEUS_ALLREDUCE_STREAMS": "4"}),
    "nccl_fixed-np1": (1, {"GPU_MODE": "nccl", "FAKE_NCCL_VERSION": "22907"}),
    "staged-np2": (2, {"GPU_MODE": "staged", "PERSEUS_GPU_OPERATIONS": "mpi"}),
    "staged-np2-lanes4": (2, {"GPU_MODE": "staged", "PERSEUS_GPU_OPERATIONS": "mpi",
                              "PERSEUS_ALLREDUCE_STREAMS": "4"}),
    "nccl-np2-lanes4": (2, {"GPU_MODE": "nccl", "PERSEUS_ALLREDUCE_STREAMS": "4"}),
    "nccl-np4-to_1MiB": (4, {"GPU_MODE": "nccl", "GPU_SIZES_LARGEST": str(1 << 20)}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(SIZE_CASES))
def test_sizes_across_boundaries_on_fake_gpu(run_mpi, fake_gpu, case):
    nprocs, env = SIZE_CASES[case]
    run_mpi("gpu_sizes", nprocs, env=dict(fake_gpu, **SMALL_LIMITS, **env), timeout=180)


# Stream ordering under the fake's checker, with producer and consumer streams
# (tests/rank_scripts/gpu_ordering.py); every other device-lane test runs under it too.
ORDER_CASES = {
    "nccl-np1": (1, {"GPU_MODE": "nccl"}),
    "nccl-np2-lanes3": (2, {"GPU_MODE": "nccl", "PERSEUS_ALLREDUCE_STREAMS": "3"}),
    "staged-np2-lanes2": (2, {"GPU_MODE": "staged", "PERSEUS_GPU_OPERATIONS": "mpi",
                              "PERSEUS_ALLREDUCE_STREAMS": "2"}),
    "nccl-np4": (4, {"GPU_MODE": "nccl"}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(ORDER_CASES))
def test_stream_ordering_on_fake_gpu(run_mpi, fake_gpu, case):
    nprocs, env = ORDER_CASES[case]
    run_mpi("gpu_ordering", nprocs, env=dict(fake_gpu, **env), timeout=120)


# Packing fused batches (tests/rank_scripts/gpu_packing.py), each way the core may take
# (csrc/src/cuda/memory/batched_copy.h), reached through the fake's switches: the pack kernel;
# cudaMemcpyBatchAsync of CUDA 12.8 (9 arguments) and 13 (8), also after the kernel's
# first launch fails as lazy loading reports a PTX the driver cannot compile; one copy
# per tensor where the runtime predates batched copies, the driver refuses them, or the
# stream is being captured into a CUDA graph.
# Every other device-lane test runs on the kernel; FAKE_CUDA_NO_LIBRARY=1 (with
# FAKE_CUDA_RUNTIME_VERSION=12040 for copies) in the environment runs them on another.
PACK_CASES = {
    "kernel-np1": (1, {"GPU_PACK": "kernel"}),
    "kernel-np3": (3, {"GPU_PACK": "kernel"}),
    "kernel_cuda13-np2": (2, {"GPU_PACK": "kernel", "FAKE_CUDA_RUNTIME_VERSION": "13000"}),
    "batched-np2": (2, {"GPU_PACK": "batched", "FAKE_CUDA_NO_LIBRARY": "1"}),
    "batched_cuda13-np2": (2, {"GPU_PACK": "batched", "FAKE_CUDA_NO_LIBRARY": "1",
                               "FAKE_CUDA_RUNTIME_VERSION": "13000"}),
    "batched_after_lazy_jit_failure-np2": (2, {"GPU_PACK": "batched",
                                               "FAKE_CUDA_NO_LIBRARY": "launch"}),
    "each_cuda12.4-np2": (2, {"GPU_PACK": "each", "FAKE_CUDA_NO_LIBRARY": "1",
                              "FAKE_CUDA_RUNTIME_VERSION": "12040"}),
    "each_after_old_driver-np2": (2, {"GPU_PACK": "each", "FAKE_CUDA_NO_LIBRARY": "1",
                                      "FAKE_CUDA_NO_BATCH_COPY": "1"}),
    "each_while_capturing-np2": (2, {"GPU_PACK": "each", "FAKE_CUDA_NO_LIBRARY": "1",
                                     "FAKE_CUDA_NO_BATCH_COPY": "capture"}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(PACK_CASES))
def test_packing_on_fake_gpu(run_mpi, fake_gpu, case):
    nprocs, env = PACK_CASES[case]
    run_mpi("gpu_packing", nprocs, env=dict(fake_gpu, PERSEUS_ALLREDUCE_STREAMS="1", **env),
            timeout=120)


@pytest.mark.mpi
def test_packing_on_fake_gpu_runtime_without_kernel_calls(run_mpi, tmp_path):
    """A runtime that lacks cudaLibraryLoadData, cudaLaunchKernel and
    cudaMemcpyBatchAsync (the fake without fake_kernel.c) still loads: one copy per tensor."""
    from support import fake_gpu as fake
    library = fake.build(find_mpi_compiler("mpicc"), tmp_path, kernels=False)
    env = {"PERSEUS_CUDA_LIB": str(tmp_path), "PERSEUS_NCCL_LIB": str(tmp_path),
           "FAKE_GPU_LIB": library, "GPU_PACK": "each", "PERSEUS_ALLREDUCE_STREAMS": "1",
           "FAKE_CUDA_NO_LIBRARY": "1"}  # (tells gpu_packing.py that no library loads)
    run_mpi("gpu_packing", 2, env=env, timeout=120)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2])
def test_gpu_calls_per_request_on_fake_gpu(run_mpi, fake_gpu, nprocs):
    """Shared ready events, one lane wait per producer stream, one consumer wait per
    batch (tests/rank_scripts/gpu_calls.py)."""
    run_mpi("gpu_calls", nprocs, env=dict(fake_gpu, GPU_MODE="nccl"), timeout=120)


def staged_collectives(nprocs, env, says):
    """Runs gpu_collectives.py, whose every GPU batch must be host-staged (two lanes each),
    and returns the lines of its stderr that contain `says`."""
    from support.jobs import clean_env, find_mpirun
    result = subprocess.run([find_mpirun(), "-np", str(nprocs), sys.executable,
                             str(TESTS_DIR / "rank_scripts" / "gpu_collectives.py")],
                            cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=180,
                            env=clean_env(dict(env, GPU_MODE="staged", PERSEUS_ALLREDUCE_STREAMS="2")))
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stderr.splitlines() if says in line]


@pytest.mark.mpi
def test_unloadable_nccl_falls_back_to_host_staging_with_one_warning(fake_gpu):
    warnings = staged_collectives(2, dict(fake_gpu, PERSEUS_NCCL_LIB="/nonexistent/nccl"),
                                  "host-staged through MPI")
    assert len(warnings) == 2, warnings  # one per process, though two lanes opened twice
    assert all("PERSEUS_NCCL_LIB=/nonexistent/nccl" in w for w in warnings), warnings


# Ranks on one GPU (the fake names it alike in every process; like NCCL, it refuses them
# a communicator unless it reports 2.30+ and NCCL_MULTI_RANK_GPU_ENABLE=1). Where NCCL
# cannot share the GPU, the lanes run every GPU collective host-staged, right, with one
# warning in the job saying why. Without the variable the fake gives each process its
# own GPU, and the GPU_MODE=nccl tests check that NCCL is used.
SHARED_GPU = {"FAKE_GPU_PCI_BUS_ID": "0000:1b:00.0"}
SHARED_STAGED = {
    "np2-nccl_2.23": (2, {}, "NCCL 2.23.5 refuses several ranks on one GPU"),
    "np4-nccl_2.23": (4, {}, "NCCL 2.23.5 refuses several ranks on one GPU"),
    "np2-nccl_2.28_asked": (2, {"FAKE_NCCL_VERSION": "22809", "NCCL_MULTI_RANK_GPU_ENABLE": "1"},
                            "NCCL 2.28.9 refuses several ranks on one GPU"),
    "np2-nccl_2.32_not_asked": (2, {"FAKE_NCCL_VERSION": "23203"}, "NCCL_MULTI_RANK_GPU_ENABLE is not set, not 1"),
    "np2-nccl_2.32_with_nvls": (2, {"FAKE_NCCL_VERSION": "23203", "NCCL_MULTI_RANK_GPU_ENABLE": "1",
                                    "NCCL_NVLS_ENABLE": "1"}, "NCCL_NVLS_ENABLE=1 cannot go with"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(SHARED_STAGED))
def test_ranks_sharing_a_gpu_run_host_staged_with_one_warning(fake_gpu, case):
    nprocs, env, why = SHARED_STAGED[case]
    warnings = staged_collectives(nprocs, dict(fake_gpu, **SHARED_GPU, **env), "share one GPU")
    assert len(warnings) == 1, warnings  # from rank 0 alone, though two lanes opened
    ranks = "[%s]" % ", ".join(str(r) for r in range(nprocs))
    assert all("ranks %s share one GPU" % ranks in w and "/0000:1b:00.0.0)" in w and why in w
               and "host-staged through MPI" in w and "PERSEUS_GPU_OPERATIONS=mpi" in w for w in warnings), warnings


# ... and where it can (NCCL 2.32.3 with NCCL_MULTI_RANK_GPU_ENABLE=1), they use NCCL:
# every collective, at 2 and 4 ranks, 2 and 4 lanes, on a GPU of one kernel slot.
SHARED_NCCL = {"np2-lanes2": (2, "2"), "np4-lanes4": (4, "4")}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(SHARED_NCCL))
def test_ranks_sharing_a_gpu_use_nccl_where_it_allows(run_mpi, fake_gpu, case):
    nprocs, lanes = SHARED_NCCL[case]
    run_mpi("gpu_collectives", nprocs, timeout=180,
            env=dict(fake_gpu, **SHARED_GPU, GPU_MODE="nccl", FAKE_NCCL_VERSION="23203",
                     NCCL_MULTI_RANK_GPU_ENABLE="1", PERSEUS_ALLREDUCE_STREAMS=lanes))


@pytest.mark.mpi
def test_nccl_functions_come_from_the_library_perseus_loaded(run_mpi, fake_gpu, tmp_path):
    """With another NCCL global in the process (as torch's own is), Perseus's NCCL,
    loaded by path, runs its own functions: Perseus's calls and the library's calls to
    itself (tests/rank_scripts/gpu_nccl_copy.py)."""
    import shutil
    from support import fake_gpu as fake
    other = fake.build_other_nccl(find_mpi_compiler("mpicc"), tmp_path)
    copy = tmp_path / "perseus_nccl"
    copy.mkdir()
    shutil.copy(fake_gpu["FAKE_GPU_LIB"], str(copy / "libnccl.so.2"))  # a separate copy of the fake
    run_mpi("gpu_nccl_copy", 2, timeout=120,
            env=dict(fake_gpu, PERSEUS_NCCL_LIB=str(copy / "libnccl.so.2"), OTHER_NCCL=other,
                     FAKE_NCCL_VERSION="23203", FAKE_GPU_ORDER_CHECK="0"))


FAILURE_CASES = {
    "nccl_init_fails_on_rank_1": (2, {"GPU_FAILURE": "init", "FAKE_NCCL_FAIL_INIT_RANK": "1"}),
    "nccl_fails_midway": (1, {"GPU_FAILURE": "midway", "FAKE_NCCL_FAIL_ALLREDUCE_AFTER": "1"}),
    "second_device_in_a_process": (2, {"GPU_FAILURE": "devices", "FAKE_CUDA_DEVICES": "2"}),
    "gpu_operations_differ": (2, {"GPU_FAILURE": "operations"}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(FAILURE_CASES))
def test_gpu_failures_on_fake_gpu(run_mpi, fake_gpu, case):
    nprocs, env = FAILURE_CASES[case]
    run_mpi("gpu_failures", nprocs, env=dict(fake_gpu, **env), timeout=120)


# The fake's device model by itself (tests/rank_scripts/gpu_device_model.py): NCCL kernels hold a
# slot of their GPU until every peer starts them, so two communicators launched in
# opposite orders on two ranks deadlock a GPU of one slot; the fake reports the cycle,
# naming both calls, their communicators and the ranks, and fails them instead of
# hanging. With two slots they run; a call a peer never makes ends in the bounded wait.
DEVICE_MODEL_CASES = {
    "opposite_orders_deadlock-np2": (2, {"DEVICE_CASE": "opposite"}),
    "opposite_orders_deadlock-np4": (4, {"DEVICE_CASE": "opposite"}),
    "opposite_orders_fit_two_slots-np2": (2, {"DEVICE_CASE": "opposite", "FAKE_GPU_KERNEL_SLOTS": "2"}),
    "same_order_launch_race-np2": (2, {"DEVICE_CASE": "same", "DEVICE_RACE": "1"}),
    "missing_call_bounded_wait-np2": (2, {"DEVICE_CASE": "missing", "FAKE_GPU_DEVICE_TIMEOUT_S": "4"}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(DEVICE_MODEL_CASES))
def test_fake_gpu_device_model(run_mpi, fake_gpu, case):
    nprocs, env = DEVICE_MODEL_CASES[case]
    run_mpi("gpu_device_model", nprocs, env=dict(fake_gpu, FAKE_NCCL_VERSION="23203", **env), timeout=120)


# Lanes that cannot deadlock each other (tests/rank_scripts/gpu_launch_order.py): 4 lanes, a GPU of
# one kernel slot, launches and the lanes' waits for their inputs delayed differently on
# each rank; every rank must launch its device collectives in the one order the
# negotiation agreed. "implicit" reports NCCL 2.32.3, whose communicators Perseus makes
# with launchOrderImplicit=1 (and names after their set and lane); the fake then also
# checks that no two threads launch at once. "sets": process sets sharing two or more
# ranks with the global set (and each other) have batches in flight at once, so the
# ranks must also agree one launch order across sets (issue 36).
LAUNCH_ORDER = {"PERSEUS_ALLREDUCE_STREAMS": "4", "PERSEUS_FUSION_THRESHOLD": "65536",
                "FAKE_GPU_KERNEL_SLOTS": "1", "FAKE_GPU_LAUNCH_JITTER_US": "3000",
                "FAKE_GPU_WAIT_JITTER_US": "3000"}
LAUNCH_ORDER_CASES = {
    "np2-lanes4": (2, {}),
    "np4-lanes4": (4, {}),
    "np2-lanes4-implicit": (2, {"FAKE_NCCL_VERSION": "23203"}),
    "np4-lanes4-implicit": (4, {"FAKE_NCCL_VERSION": "23203"}),
    "np3-sets": (3, {"LAUNCH_ORDER_SETS": "0,1"}),
    "np4-sets": (4, {"LAUNCH_ORDER_SETS": "0,1,2;1,2,3"}),
    "np4-sets-implicit": (4, {"LAUNCH_ORDER_SETS": "0,1,2;1,2,3", "FAKE_NCCL_VERSION": "23203"}),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(LAUNCH_ORDER_CASES))
def test_device_lanes_launch_in_the_agreed_order(run_mpi, fake_gpu, case):
    nprocs, env = LAUNCH_ORDER_CASES[case]
    run_mpi("gpu_launch_order", nprocs, env=dict(fake_gpu, **LAUNCH_ORDER, **env), timeout=150)


@pytest.mark.mpi
def test_a_stopped_rank_outside_the_set_holds_its_launches_until_given_up(fake_gpu, tmp_path):
    """Every rank takes part in the rounds that order GPU launches across process sets, so
    a stopped rank 2 holds set {0, 1}'s GPU batch: the global set's stall inspector names
    it (warning at T) and gives it up at S; the batch then launches and completes
    (tests/rank_scripts/gpu_launch_order.py, LAUNCH_ORDER_STOP). Without that wait in the
    inspector, nothing was reported and the batch waited forever."""
    from support.jobs import clean_env, find_mpirun, run_bounded
    env = dict(fake_gpu, **LAUNCH_ORDER, LAUNCH_ORDER_SETS="0,1", LAUNCH_ORDER_STEPS="2", LAUNCH_ORDER_STOP="1",
               PTEST_TMPDIR=str(tmp_path), PERSEUS_STALL_CHECK_TIME_SECONDS="2",
               PERSEUS_STALL_SHUTDOWN_TIME_SECONDS="3")
    cmd = [find_mpirun(), "-np", "3", sys.executable, str(TESTS_DIR / "rank_scripts" / "gpu_launch_order.py")]
    victim = tmp_path / "stopped"
    try:
        rc, out, err, _ = run_bounded(cmd, clean_env(env), 60)
    finally:
        if victim.exists():
            try:
                os.kill(int(victim.read_text().split()[0]), 9)
            except ProcessLookupError:
                pass
    for rank in (0, 1):
        assert "SURVIVOR %d ok" % rank in out, "rc %d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err[-6000:])


# The stress run scripts/gpu_check.sh makes on a GPU (tests/rank_scripts/gpu_stress.py: random
# bursts of every boundary on 4 lanes and two process sets, each result checked against
# the host's), a few steps on the fake so that it is known to work before a GPU runs it;
# the second case as on the lent GPU machine: ranks sharing one GPU through NCCL 2.32.
STRESS = {"STRESS_DEVICE": "fake", "STRESS_STEPS": "6", "STRESS_LARGEST": "300000", "GPU_MODE": "nccl",
          "PERSEUS_ALLREDUCE_STREAMS": "4", "FAKE_GPU_LAUNCH_JITTER_US": "500", **SMALL_LIMITS}
STRESS_CASES = {
    "np2-lanes4": (2, {}),
    "np4-lanes4-one_gpu_nccl_2.32": (4, dict(SHARED_GPU, FAKE_NCCL_VERSION="23203", NCCL_MULTI_RANK_GPU_ENABLE="1")),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(STRESS_CASES))
def test_stress_run_on_fake_gpu(run_mpi, fake_gpu, case):
    nprocs, env = STRESS_CASES[case]
    run_mpi("gpu_stress", nprocs, env=dict(fake_gpu, **STRESS, **env), timeout=150)


@pytest.mark.mpi
def test_stress_watchdog_turns_a_hang_into_a_failure_naming_the_step(fake_gpu):
    from support.jobs import clean_env, find_mpirun
    script = str(TESTS_DIR / "rank_scripts" / "gpu_stress.py")
    result = subprocess.run([find_mpirun(), "-np", "2", sys.executable, script],
                            cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=120,
                            env=clean_env(dict(fake_gpu, **dict(STRESS, STRESS_STEPS="1000", STRESS_STEP_TIMEOUT_S="0"))))
    assert result.returncode != 0, result.stdout + result.stderr
    import re
    assert re.search(r"HANG: step \d+ \(set \d, \d+ requests: [a-z]+ .*\) did not finish in 0 s", result.stdout), \
        result.stdout

