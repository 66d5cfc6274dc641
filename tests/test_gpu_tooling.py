"""The GPU tooling that runs on a CPU-only machine: library folder discovery and the
once-only hand-over to the core (perseus.common.gpu), Horovod's *_built answers,
benchmarks/gpu_bench.py and scripts/gpu_check.sh without a CUDA device.

The GPU work itself is in tests/test_gpu.py (skipped here)."""
import ctypes
import glob
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, clean_env
from perseus.common import gpu


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def _write_program(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def site(tmp_path):
    """A fake site-packages with torch and the nvidia wheels of CUDA 12 and 13."""
    root = tmp_path / "site-packages"
    for rel in ("torch/__init__.py", "torch/lib/libtorch_cuda.so",
                "nvidia/nccl/lib/libnccl.so.2",               # nvidia-nccl-cu12 / -cu13
                "nvidia/cu13/lib/libcudart.so.13",            # nvidia-cuda-runtime (CUDA 13)
                "nvidia/cuda_runtime/lib/libcudart.so.12",    # nvidia-cuda-runtime-cu12
                "nvidia/cu13/include/cuda.h"):
        _touch(str(root / rel))
    return root


def test_framework_library_dirs(site):
    dirs = gpu.framework_library_dirs(str(site / "torch"))
    assert dirs == [str(site / "torch" / "lib"), str(site / "nvidia" / "cu13" / "lib"),
                    str(site / "nvidia" / "cuda_runtime" / "lib"), str(site / "nvidia" / "nccl" / "lib")]


def test_framework_without_lib_or_wheels(tmp_path):
    _touch(str(tmp_path / "pkg" / "__init__.py"))
    assert gpu.framework_library_dirs(str(tmp_path / "pkg")) == []


def test_loaded_library_dirs_from_maps(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    maps = "\n".join([
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f02-7f03 r-xp 00000000 08:01 2 %s/libnccl.so.2" % b,
        "7f04-7f05 r--p 00000000 08:01 3 %s/libcudart.so.13" % a,
        "7f06-7f07 r-xp 00000000 08:01 2 %s/libnccl.so.2" % b,
        "7f08-7f09 rw-p 00000000 00:00 0 [heap]",
        "7f0a-7f0b r-xp 00000000 08:01 4 %s/libnccl_net.so" % a,  # a plugin, not NCCL itself
    ])
    assert gpu.loaded_library_dirs(maps) == [str(b), str(a)]
    assert gpu.loaded_library_dirs("") == []


def test_default_dirs_find_installed_wheels():
    # Whatever nvidia/*/lib folders this Python can see (setup.sh installs
    # nvidia-nccl-cu13 into .venv) are searched.
    expected = [os.path.realpath(d) for entry in sys.path if entry and os.path.isdir(entry)
                for d in glob.glob(os.path.join(entry, "nvidia", "*", "lib"))]
    dirs = gpu.default_dirs()
    for d in expected:
        assert d in dirs
    assert len(dirs) == len(set(dirs))
    assert all(os.path.isdir(d) for d in dirs)


def test_default_dirs_put_the_asking_framework_first(site, monkeypatch):
    other = site.parent / "other"
    _touch(str(other / "tensorflow" / "__init__.py"))
    _touch(str(other / "tensorflow" / "lib" / "x.so"))
    found = {"torch": str(site / "torch"), "tensorflow": str(other / "tensorflow")}
    monkeypatch.setattr(gpu, "package_dir", found.get)
    monkeypatch.setattr(gpu, "loaded_library_dirs", lambda: [])
    dirs = gpu.default_dirs(first="tensorflow")
    assert dirs[0] == str(other / "tensorflow" / "lib")
    assert dirs[1] == str(site / "torch" / "lib")


def test_package_dir_does_not_import(run_python):
    code = ("import sys; from perseus.common import gpu; d = gpu.package_dir('torch'); "
            "assert d and d.endswith('torch'), d; assert 'torch' not in sys.modules; "
            "assert gpu.package_dir('no_such_package_here') is None")
    res = run_python(code)
    assert res.returncode == 0, res.stderr


def test_nccl_version_code():
    assert gpu.nccl_version_code("NCCL 2.32.3 from /x/python3.12/nvidia/nccl/lib/libnccl.so.2") == 23203
    assert gpu.nccl_version_code("CUDA runtime 13.0.1\nnccl: /a/libnccl.so.2 (version 2.18.10)") == 21810
    assert gpu.nccl_version_code("nccl: not found; tried /usr/lib/python3.12.1/x") == 0
    assert gpu.nccl_version_code("") == 0


@pytest.fixture
def fake_core(monkeypatch):
    """perseus_set_gpu_library_dirs / perseus_gpu_load / perseus_gpu_describe stand-ins
    that record their calls, and a fresh once-only state."""
    calls = {"dirs": [], "load": 0}

    def set_dirs(raw):
        calls["dirs"].append(raw.decode())
        return 0

    def load(cuda_ok, nccl_ok):
        calls["load"] += 1
        ctypes.cast(cuda_ok, ctypes.POINTER(ctypes.c_int32))[0] = 1
        ctypes.cast(nccl_ok, ctypes.POINTER(ctypes.c_int32))[0] = 1
        return 0

    monkeypatch.setattr(gpu._lib, "perseus_set_gpu_library_dirs", set_dirs, raising=False)
    monkeypatch.setattr(gpu._lib, "perseus_gpu_load", load, raising=False)
    monkeypatch.setattr(gpu._lib, "perseus_gpu_describe",
                        lambda: b"libcudart.so.13: /x/libcudart.so.13 (CUDA 13.0)\n"
                                b"NCCL 2.32.3: /y/libnccl.so.2\ndevices: 1", raising=False)
    monkeypatch.setattr(gpu, "_prepared", None)
    monkeypatch.setattr(gpu, "_loaded", None)
    return calls


def test_prepare_once(fake_core, site):
    first = [str(site / "nvidia" / "nccl" / "lib"), str(site / "torch" / "lib")]
    assert gpu.prepare(first + [str(site / "missing")]) == first  # absent folders dropped
    assert gpu.prepare([str(site / "nvidia" / "cu13" / "lib")]) == first
    assert fake_core["dirs"] == [os.pathsep.join(first)]


def test_load_prepares_defaults_and_asks_once(fake_core, monkeypatch):
    monkeypatch.setattr(gpu, "default_dirs", lambda first=None: [])
    assert gpu.load() == (True, True)
    assert gpu.cuda_built() is True
    assert gpu.nccl_built() == 23203
    assert fake_core["dirs"] == [""] and fake_core["load"] == 1


def test_load_after_the_core_chose_its_folders(fake_core, monkeypatch):
    # The core refuses other folders once it loaded the libraries: load() still answers.
    def refuse(raw):
        fake_core["dirs"].append(raw.decode())
        return 1  # PERSEUS_INVALID_ARGUMENT
    monkeypatch.setattr(gpu._lib, "perseus_set_gpu_library_dirs", refuse, raising=False)
    monkeypatch.setattr(gpu._lib, "perseus_last_error", lambda: b"already loaded", raising=False)
    assert gpu.load() == (True, True) and fake_core["load"] == 1


def test_built_answers_are_truthful():
    """On this machine, against the real core: the answers follow what loads (the CPU
    machine has no libcudart, so CUDA never loads here), and nothing raises."""
    code = ("from perseus.common import gpu, basics; import json; "
            "print(json.dumps([gpu.supported(), basics.cuda_built(), basics.nccl_built(), gpu.describe()]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    import json
    supported, cuda, nccl, text = json.loads(res.stdout)
    assert isinstance(cuda, bool) and isinstance(nccl, int)
    assert text  # always says something: versions, or why not
    if not supported:
        assert not cuda and nccl == 0 and "missing" in text
    if nccl:
        assert cuda, "NCCL counted as built without the CUDA runtime"


def test_missing_loader_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(gpu._lib, "perseus_gpu_load", None, raising=False)
    monkeypatch.setattr(gpu, "_prepared", None)
    assert gpu.cuda_built() is False and gpu.nccl_built() == 0
    with pytest.raises(gpu.GpuSupportMissing, match="pip install"):
        gpu.prepare()


# ---------------------------------------------------------------- without a CUDA device

needs_no_cuda = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the behaviour on a machine without CUDA")


@needs_no_cuda
def test_gpu_bench_says_no_device():
    res = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "gpu_bench.py")], cwd=str(REPO_ROOT),
                         env=clean_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no CUDA device" in res.stdout and "nothing to measure" in res.stdout


def _gpu_check(tmp_path, *args):
    env = clean_env({"PYTHON": sys.executable, "PERSEUS_GPU_VENV": str(tmp_path / "venv"),
                     "PERSEUS_GPU_REPORT": str(tmp_path / "report.md"),
                     "PERSEUS_GPU_LOGS": str(tmp_path / "logs"), "PERSEUS_WHEELS": str(tmp_path / "wheels")})
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh")] + list(args),
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=240)


def test_gpu_check_prints_the_download_command(tmp_path):
    res = _gpu_check(tmp_path, "--print-download")
    assert res.returncode == 0, res.stderr
    command = res.stdout.replace("\\\n", " ")
    assert command.startswith("python3 -m pip download --only-binary=:all: --python-version 3.12")
    for part in ("-d wheels", '"mpich==', '"pytest-timeout==', "manylinux_2_28_x86_64", "manylinux1_x86_64"):
        assert part in command, part


@needs_no_cuda
def test_gpu_check_stops_without_cuda(tmp_path):
    res = _gpu_check(tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "NO CUDA DEVICE" in res.stdout
    # It stopped before changing anything.
    assert not (tmp_path / "venv").exists() and not (tmp_path / "logs").exists()


@needs_no_cuda
def test_gpu_check_dry_run_shows_the_plan(tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl").write_bytes(b"")
    res = _gpu_check(tmp_path, "--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "a real run would stop here with exit code 3" in out
    assert "would run: %s -m venv --system-site-packages" % sys.executable in out
    assert "--find-links %s --ignore-installed --no-deps mpich" % (tmp_path / "wheels") in out
    assert "PERSEUS_MPICXX=%s" % (tmp_path / "venv" / "bin" / "mpicxx") in out
    assert "--no-build-isolation --no-deps --no-index -e ." in out
    from test_gpu import CONFIGS
    for config in ["inproc"] + list(CONFIGS):
        assert "would run (test_%s," % config in out, config
    assert "would run (gpu_bench," in out and "dry run done" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"], "the dry run created files"


# ---------------------------------------------------------------- the test harness

def test_clean_env_passes_on_the_chosen_mpi_settings(monkeypatch):
    chosen = {"OMPI_MCA_plm_rsh_agent": "/usr/bin/false", "MPI4PY_LIBMPI": "/usr/lib/libmpi.so.40"}
    leaks = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_MCA_orte_hnp_uri": "x", "PMI_RANK": "1", "PMIX_RANK": "1",
             "HYDRA_CONTROL_FD": "3", "PERSEUS_FUSION_THRESHOLD": "0"}
    for name, value in dict(chosen, **leaks).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PERSEUS_KEEP_ENV", raising=False)
    assert "OMPI_MCA_plm_rsh_agent" not in clean_env()  # only what is named passes
    monkeypatch.setenv("PERSEUS_KEEP_ENV", " ".join(chosen))
    env = clean_env()
    assert {name: env.get(name) for name in chosen} == chosen
    assert not set(leaks) & set(env)


def test_find_mpirun_follows_perseus_mpirun(tmp_path, monkeypatch):
    from conftest import find_mpirun
    chosen = tmp_path / "usr" / "bin" / "mpirun"
    _write_program(chosen, "exit 1")
    monkeypatch.setenv("PERSEUS_MPIRUN", str(chosen))
    assert find_mpirun() == str(chosen)
    monkeypatch.delenv("PERSEUS_MPIRUN")
    assert find_mpirun() != str(chosen)


@needs_no_cuda
@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script, np", [("gpu_torch_training", 2), ("gpu_torch_ordering", 2),
                                        ("gpu_torch_collectives", 1)])
def test_gpu_scripts_run_on_the_cpu(run_mpi, script, np):
    """PTEST_GPU=cpu runs the torch CUDA scripts' own logic (helpers, references,
    tolerances) with CPU tensors, so they stay runnable between visits to a GPU machine.
    (gpu_torch_mismatch needs two device kinds.)"""
    run_mpi(script, np, env={"PTEST_GPU": "cpu"}, timeout=240)
