"""The PyTorch examples run end to end under mpirun: the digits training reaches the
accuracy the README promises, the synthetic benchmark prints Horovod's format, and the
torch-DDP ImageNet-style script runs through `JOB=imagenet_ddp mpirun -np 2 ./train.sh`
with its one-process command line."""
import re
import sys

import pytest

import perseus.torch.horovod as hvd
from conftest import REPO_ROOT, clean_env, find_mpirun, run_bounded

EXAMPLES = REPO_ROOT / "examples" / "pytorch"

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not all(hasattr(hvd, name) for name in (
        "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state")),
        reason="perseus.torch.horovod has no DistributedOptimizer / broadcast_parameters / "
               "broadcast_optimizer_state yet; the examples need them"),
]


def run_example(np, argv, env=None, timeout=60):
    """`mpirun -np N python <argv>` from the repo root -> stdout; fails the test, with the
    job's output, on a non-zero exit or a timeout (then every process is killed)."""
    return run_job(np, [sys.executable] + list(argv), env, timeout)


def run_job(np, argv, env=None, timeout=60):
    """`mpirun -np N <argv>` from the repo root -> stdout, as run_example."""
    cmd = [find_mpirun(), "-np", str(np)] + list(argv)
    code, out, err, seconds = run_bounded(cmd, clean_env(env), timeout)
    if code != 0:
        pytest.fail("%s exited with %d after %.1f s\nstdout:\n%s\nstderr:\n%s"
                    % (" ".join(map(str, cmd)), code, seconds, out, err), pytrace=False)
    return out


def test_train_digits_two_ranks(tmp_path):
    checkpoint = tmp_path / "digits.pt"
    out = run_example(2, [EXAMPLES / "train_digits.py", "--checkpoint", checkpoint])
    epochs = re.findall(r"^Epoch +\d+/20: .*test accuracy ([\d.]+)%$", out, re.M)
    assert len(epochs) == 20, out  # rank 0 alone prints
    final = re.search(r"^Final test accuracy: ([\d.]+)% on 2 rank\(s\)", out, re.M)
    assert final and float(final.group(1)) >= 95.0, out
    assert checkpoint.exists()

    import torch
    state = torch.load(checkpoint, map_location="cpu")
    assert state["size"] == 2 and state["epoch"] == 20 and state["accuracy"] >= 0.95


def test_collective_demo_two_ranks():
    out = run_example(2, [REPO_ROOT / "examples" / "collective_demo.py"])
    assert "alltoall: [0.0, 10.0]" in out and "demo finished: all results correct" in out, out


def test_synthetic_benchmark_two_ranks():
    out = run_example(2, [EXAMPLES / "pytorch_synthetic_benchmark.py", "--model", "mlp", "--no-cuda",
                          "--batch-size", "16", "--num-warmup-batches", "2",
                          "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce"])
    assert "Model: mlp" in out and "Batch size: 16" in out and "Number of GPUs: 2" in out, out
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per GPU$", out, re.M)) == 2, out
    per = re.search(r"^Img/sec per GPU: ([\d.]+) \+-([\d.]+)$", out, re.M)
    total = re.search(r"^Total img/sec on 2 GPU\(s\): ([\d.]+) \+-([\d.]+)$", out, re.M)
    assert per and total, out
    assert float(total.group(1)) == pytest.approx(2 * float(per.group(1)), rel=1e-2, abs=0.1)


def _imagenet_ddp(env, extra):
    out = run_job(2, [REPO_ROOT / "train.sh"] + extra, env=dict(env, JOB="imagenet_ddp",
                                                                  PYTHON=sys.executable))
    assert "on 2 process(es)" in out, out  # ranks from MPI, not --world-size 1
    assert re.search(r"^Epoch: \[0\]\[ +\d+/ +\d+\]\tTime", out, re.M), out
    final = re.findall(r"^ \* Acc@1 ([\d.]+) Acc@5 ([\d.]+) Loss ([\d.]+)$", out, re.M)
    assert final and all(float(loss) > 0 for _, _, loss in final), out
    return out


def test_imagenet_ddp_through_train_sh(tmp_path):
    checkpoint = tmp_path / "imagenet.pt"
    _imagenet_ddp({"EPOCHS": "2", "CHECKPOINT": str(checkpoint)},
                  ["--train-samples", "128", "--val-samples", "32"])
    import torch
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["epoch"] == 2 and all(k.startswith("module.") for k in state["state_dict"])


def test_imagenet_ddp_resnet50():
    _imagenet_ddp({"ARCH": "resnet50", "EPOCHS": "1", "BATCH_SIZE": "2"},
                  ["--train-samples", "4", "--val-samples", "4"])
