"""The pack kernel of the GPU lanes (cuda/memory/kernels/batched_copy.cu) where no GPU is:

- the PTX the core embeds (batched_copy_ptx.inc) is what scripts/gen_pack_ptx.sh makes
  from the source (skipped, saying why, without nvcc or with an nvcc release other than
  the one that made it);
- (tests/cpp/pack_kernel_test.cc, run by tests/unit/test_cpp.py: the kernel's device code
  runs on the CPU over tables the core fills, under UBSan's alignment check.)

How the lanes use it, and its fallbacks, on the fake CUDA runtime: test_gpu_core.py
(test_packing_on_fake_gpu).
"""
import os
import re
import shutil
import subprocess

import pytest

from support.jobs import REPO_ROOT

KERNELS = REPO_ROOT / "csrc" / "src" / "cuda" / "memory" / "kernels"
RELEASE = re.compile(r"release (\d+\.\d+), V([\d.]+)")


def test_committed_ptx_is_what_the_script_makes(tmp_path):
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (nor $NVCC): cannot regenerate the pack kernel's PTX")
    committed = (KERNELS / "batched_copy_ptx.inc").read_text()
    made_by = RELEASE.search(committed)
    assert made_by, "the committed PTX does not name the nvcc that made it"
    here = RELEASE.search(subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                         check=True).stdout)
    if here.group(2) != made_by.group(2):
        pytest.skip("the committed PTX was made by nvcc V%s and this one is V%s, whose output may "
                    "differ; compare with the same release" % (made_by.group(2), here.group(2)))
    out = tmp_path / "batched_copy_ptx.inc"
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gen_pack_ptx.sh"), str(out)],
                            env=dict(os.environ, NVCC=nvcc), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.read_text() == committed, (
        "csrc/src/cuda/memory/kernels/batched_copy_ptx.inc is stale: run scripts/gen_pack_ptx.sh")

