"""The core's #include arrows run one way, down the layers that scripts/check_layers.py
declares; and that check finds an arrow that does not, naming file, line and layers."""
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECK = REPO_ROOT / "scripts" / "check_layers.py"


def run_check(root):
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)],
                          capture_output=True, text=True, timeout=60)


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_every_include_of_the_core_runs_down_the_layers():
    result = run_check(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("0 include arrow(s) not running down the layers")


def test_an_upward_include_is_reported_with_its_file_line_and_layers(tmp_path):
    write(tmp_path, "csrc/include/perseus/perseus.h", "")
    write(tmp_path, "csrc/src/common/status.h", '#include "perseus/perseus.h"\n')
    write(tmp_path, "csrc/src/engine/engine.h", '#include "common/status.h"\n')
    write(tmp_path, "csrc/src/mpi/mpi_status.h",
          '#include "common/status.h"\n\n#include "engine/engine.h"\n')
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        'csrc/src/mpi/mpi_status.h:3: #include "engine/engine.h": '
        "layer mpi -> layer engine runs up: engine stands on mpi",
        "1 include arrow(s) not running down the layers"]


def test_sibling_layers_may_not_include_each_other(tmp_path):
    # lanes/ and the engine both stand on lane_api/; neither sees the other, and the
    # engine sees no CUDA header.
    write(tmp_path, "csrc/src/lane_api/lane.h", "")
    write(tmp_path, "csrc/src/lanes/mpi_lane.h", '#include "lane_api/lane.h"\n')
    write(tmp_path, "csrc/src/cuda/device_backend.h", "")
    write(tmp_path, "csrc/src/engine/engine.h",
          '#include "lane_api/lane.h"\n#include "lanes/mpi_lane.h"\n#include "cuda/device_backend.h"\n')
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        'csrc/src/engine/engine.h:2: #include "lanes/mpi_lane.h": '
        "layer engine -> layer lanes runs across: lanes is not below engine",
        'csrc/src/engine/engine.h:3: #include "cuda/device_backend.h": '
        "layer engine -> layer cuda runs across: cuda is not below engine",
        "2 include arrow(s) not running down the layers"]


def test_a_directory_outside_the_declared_layers_is_reported(tmp_path):
    write(tmp_path, "csrc/src/common/status.h", "")
    write(tmp_path, "csrc/src/extras/tool.cc", '#include "common/status.h"\n')
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert "csrc/src/extras/tool.cc: in no declared layer ('extras')" in result.stdout


def test_a_subfolder_of_cuda_is_a_layer_of_its_own(tmp_path):
    # The runtime loader is cuda/'s lowest sub-layer: it may not include an NCCL op.
    # The files directly in cuda/ stand on every subfolder, and a kernel folder below
    # memory/ is memory's.
    write(tmp_path, "csrc/src/common/status.h", "")
    write(tmp_path, "csrc/src/cuda/nccl/nccl_ops.h", "")
    write(tmp_path, "csrc/src/cuda/memory/kernels/table.h", "")
    write(tmp_path, "csrc/src/cuda/memory/batched_copy.h",
          '#include "cuda/memory/kernels/table.h"\n#include "cuda/nccl/nccl_ops.h"\n')
    write(tmp_path, "csrc/src/cuda/runtime/cuda_api.h",
          '#include "common/status.h"\n#include "cuda/nccl/nccl_ops.h"\n')
    write(tmp_path, "csrc/src/cuda/device_runner.cc",
          '#include "cuda/nccl/nccl_ops.h"\n#include "cuda/runtime/cuda_api.h"\n')
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        'csrc/src/cuda/memory/batched_copy.h:2: #include "cuda/nccl/nccl_ops.h": '
        "layer cuda/memory -> layer cuda/nccl runs up: cuda/nccl stands on cuda/memory",
        'csrc/src/cuda/runtime/cuda_api.h:2: #include "cuda/nccl/nccl_ops.h": '
        "layer cuda/runtime -> layer cuda/nccl runs up: cuda/nccl stands on cuda/runtime",
        "2 include arrow(s) not running down the layers"]


# ---- the Python package's layers (scripts/check_python_layers.py)

PYTHON_CHECK = REPO_ROOT / "scripts" / "check_python_layers.py"


def run_python_check(root):
    return subprocess.run([sys.executable, str(PYTHON_CHECK), "--root", str(root)],
                          capture_output=True, text=True, timeout=60)


def test_every_import_of_the_package_runs_down_its_layers():
    """Issue 50: the torch faces (Horovod's API, the drop-in, the c10d backend) import
    only the operations layer below them, never each other."""
    result = run_python_check(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_face_importing_a_sibling_or_a_lower_layer_importing_up_is_reported(tmp_path):
    for rel in ("perseus/__init__.py", "perseus/common/__init__.py", "perseus/torch/__init__.py",
                "perseus/torch/adapter.py", "perseus/torch/ops/__init__.py",
                "perseus/torch/mpi_ops.py", "perseus/torch/distributed/__init__.py",
                "perseus/torch/c10d/__init__.py"):
        write(tmp_path, rel, "")
    write(tmp_path, "perseus/torch/distributed/collectives.py",
          "from perseus.torch import ops\n"          # down: fine
          "from perseus.torch import mpi_ops\n")     # a sibling face
    write(tmp_path, "perseus/torch/c10d/backend.py",
          "import perseus.torch.distributed.collectives\n")
    write(tmp_path, "perseus/torch/ops/work.py", "def f():\n    from perseus.torch import mpi_ops\n")
    result = run_python_check(tmp_path)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(line.startswith("perseus/torch/distributed/collectives.py:2:") and
               "a sibling (torch: Horovod's API)" in line for line in lines), lines
    assert any(line.startswith("perseus/torch/c10d/backend.py:1:") and
               "a sibling (torch: the drop-in)" in line for line in lines), lines
    assert any(line.startswith("perseus/torch/ops/work.py:2:") and
               "a higher layer (faces)" in line for line in lines), lines
    assert len(lines) == 3, lines
