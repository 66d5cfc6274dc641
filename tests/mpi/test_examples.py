"""The PyTorch examples run end to end under mpirun: the digits training reaches the
accuracy the README promises, the synthetic benchmark prints Horovod's format, and the
torch-DDP ImageNet-style script runs through `JOB=imagenet_ddp mpirun -np 2 ./train.sh`
with its one-process command line."""
import math
import os
import re
import stat
import sys

import pytest

import perseus.torch.horovod as hvd
from support.jobs import REPO_ROOT, clean_env, find_mpirun, run_bounded, run_job

EXAMPLES = REPO_ROOT / "examples" / "pytorch"
NOBODY = 65534

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


def test_train_digits_two_ranks(tmp_path):
    """20 epochs reach 95 %; the checkpoint goes by default to the user's cache folder
    ($XDG_CACHE_HOME/perseus/checkpoints), in a folder that only the user may write."""
    cache = tmp_path / "cache"
    out = run_example(2, [EXAMPLES / "train_digits.py"], env={"XDG_CACHE_HOME": str(cache)})
    epochs = re.findall(r"^Epoch +\d+/20: .*test accuracy ([\d.]+)%$", out, re.M)
    assert len(epochs) == 20, out  # rank 0 alone prints
    final = re.search(r"^Final test accuracy: ([\d.]+)% on 2 rank\(s\)", out, re.M)
    assert final and float(final.group(1)) >= 95.0, out
    assert "Ranks' weights: identical" in out, out
    checkpoint = cache / "perseus" / "checkpoints" / "train_digits.pt"
    assert "Checkpoint saved to %s" % checkpoint in out, out
    folder = checkpoint.parent.stat()
    assert folder.st_uid == os.geteuid() and stat.S_IMODE(folder.st_mode) == 0o700
    assert checkpoint.stat().st_uid == os.geteuid()
    assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o600

    import torch
    state = torch.load(checkpoint, map_location="cpu")
    assert state["size"] == 2 and state["epoch"] == 20 and state["accuracy"] >= 0.95


def test_train_digits_refuses_a_planted_link(tmp_path):
    """A symbolic link at the checkpoint's name: every rank stops before training,
    naming it, and the file it points to is left as it was."""
    folder = tmp_path / "checkpoints"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (folder / "train_digits.pt").symlink_to(victim)
    cmd = [find_mpirun(), "-np", "2", sys.executable, EXAMPLES / "train_digits.py", "--epochs", "0",
           "--checkpoint", folder / "train_digits.pt"]
    code, out, err, _ = run_bounded(cmd, clean_env(), 60)
    assert victim.read_bytes() == b"precious", (out, err)
    assert code != 0, (out, err)
    refusal = "train_digits: refusing to write %s: it is a symbolic link" % (folder / "train_digits.pt")
    assert err.count(refusal) == 2, err  # on both ranks


def digits_checkpoint(path, epoch, hidden):
    """A checkpoint of train_digits.py's shape (MLP, SGD) at `epoch`."""
    import torch
    import torch.nn as nn
    model = nn.Module()
    model.fc1, model.fc2, model.fc3 = nn.Linear(64, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch, "accuracy": 0.0, "size": 1}, path)


def test_train_digits_resumes_only_the_users_own_file(tmp_path):
    """--resume (one process) loads the user's checkpoint, and refuses another user's
    (as root) or a symbolic link to one of the user's (tests/unit/test_private_files.py checks
    both), naming it, before training."""
    folder = tmp_path / "checkpoints"
    folder.mkdir(mode=0o700)
    checkpoint = folder / "digits.pt"
    digits_checkpoint(checkpoint, epoch=1, hidden=8)

    def resume():  # a finished run: resuming only scores it
        cmd = [sys.executable, EXAMPLES / "train_digits.py", "--resume", "--epochs", "1",
               "--hidden", "8", "--checkpoint", checkpoint]
        code, out, err, _ = run_bounded(cmd, clean_env({"XDG_CACHE_HOME": str(tmp_path / "cache")}), 60)
        return code, out + err

    code, out = resume()
    assert code == 0 and "Resumed from %s (epoch 1)" % checkpoint in out, out
    if os.geteuid() == 0:
        os.chown(checkpoint, NOBODY, -1)
        why = "it belongs to uid %d" % NOBODY
    else:
        mine = tmp_path / "elsewhere.pt"
        checkpoint.rename(mine)
        checkpoint.symlink_to(mine)
        why = "it is a symbolic link"
    code, out = resume()
    assert code != 0 and "Resumed" not in out, out
    assert "refusing to read %s: %s" % (checkpoint, why) in out, out


def test_train_digits_resumes_with_another_epoch_count(tmp_path):
    """`EPOCHS=2 mpirun -np 2 ./train.sh`, then `mpirun -np 2 ./train.sh --resume` (20
    epochs): the schedule is rebuilt for 20 epochs from epoch 2 (the printed lr is this
    test's formula) on every rank, so the ranks end with the same weights (before the
    fix rank 0 restored the 2-epoch schedule, the others started one: they differed by
    0.875), and the run reaches a fresh run's accuracy (issue 49, point 2)."""
    folder = tmp_path / "checkpoints"
    folder.mkdir(mode=0o700)
    env = {"CHECKPOINT": str(folder / "digits.pt")}

    def train(*argv, **more):
        cmd = [find_mpirun(), "-np", "2", REPO_ROOT / "train.sh"] + list(argv)
        code, out, err, _ = run_bounded(cmd, clean_env(dict(env, **more)), 60)
        assert code == 0, out + err
        epochs = re.findall(r"^Epoch +(\d+)/(\d+): lr ([\d.e-]+) .*test loss ([\d.]+) .*"
                            r"test accuracy ([\d.]+)%$", out, re.M)
        return out, err, [(int(e) - 1, int(n), float(lr), float(loss), float(accuracy))
                          for e, n, lr, loss, accuracy in epochs]

    _, _, first = train(EPOCHS="2")
    out, err, resumed = train("--resume")
    assert "Resumed from %s (epoch 2)" % env["CHECKPOINT"] in out, out
    assert "Ranks' weights: identical" in out, out
    assert "lr_scheduler.step()" not in err, err  # no rank restarts a schedule of its own
    final = re.search(r"^Final test accuracy: ([\d.]+)% on 2 rank\(s\)", out, re.M)
    assert final and float(final.group(1)) >= 95.0, out  # a fresh 20-epoch run's promise
    assert [e for e, *_ in first] == [0, 1] and [e for e, *_ in resumed] == list(range(2, 20)), out
    for epoch, epochs, lr, _, _ in first + resumed:
        expected = 0.02 * 2 * (1 + math.cos(math.pi * epoch / epochs)) / 2
        assert lr == pytest.approx(expected, rel=1e-3, abs=1e-6), (epoch, epochs, lr, out)
    assert resumed[0][3] != first[-1][3], out  # the first resumed epoch learned


def test_collective_demo_two_ranks():
    out = run_example(2, [REPO_ROOT / "examples" / "collective_demo.py"])
    assert "alltoall: [0.0, 10.0]" in out and "demo finished: all results correct" in out, out


def test_help_says_what_a_script_does_without_running_it():
    """`collective_demo.py --help` ran the demo; `./train.sh --help` showed only
    train_digits.py's options, not train.sh's own settings (EPOCHS, JOB, ...)."""
    code, out, err, _ = run_bounded([sys.executable, REPO_ROOT / "examples" / "collective_demo.py",
                                     "--help"], clean_env(), 60)
    assert code == 0 and out.startswith("usage: collective_demo.py"), out + err
    assert "Perseus demo on" not in out, out
    code, out, err, _ = run_bounded([REPO_ROOT / "train.sh", "--help"],
                                    clean_env({"PYTHON": sys.executable}), 60)
    assert code == 0, out + err
    assert "JOB picks the example" in out and "Settings, from the environment" in out, out
    settings = out.split("Settings, from the environment", 1)[1].split("examples/pytorch/")[0]
    assert all(name in settings for name in ("EPOCHS (20", "BATCH_SIZE", "LR", "CHECKPOINT")), out
    assert "examples/pytorch/train_digits.py (JOB=digits)" in out and "--resume" in out, out


def test_synthetic_benchmark_two_ranks():
    out = run_example(2, [EXAMPLES / "pytorch_synthetic_benchmark.py", "--model", "mlp", "--no-cuda",
                          "--batch-size", "16", "--num-warmup-batches", "2",
                          "--num-batches-per-iter", "2", "--num-iters", "2", "--fp16-allreduce"])
    # Horovod's format, counting CPU ranks as "CPUs" (it said GPUs on a CPU run)
    assert "Model: mlp" in out and "Batch size: 16" in out and "Number of CPUs: 2" in out, out
    assert len(re.findall(r"^Iter #\d+: [\d.]+ img/sec per CPU$", out, re.M)) == 2, out
    per = re.search(r"^Img/sec per CPU: ([\d.]+) \+-([\d.]+)$", out, re.M)
    total = re.search(r"^Total img/sec on 2 CPU\(s\): ([\d.]+) \+-([\d.]+)$", out, re.M)
    assert per and total, out
    assert float(total.group(1)) == pytest.approx(2 * float(per.group(1)), rel=1e-2, abs=0.1)


def test_synthetic_benchmark_defaults_fit_a_cpu():
    """Without CUDA the default model is the small ResNet, not ResNet-50 (minutes on a
    CPU before the first result)."""
    sys.path.insert(0, str(EXAMPLES))
    import pytorch_synthetic_benchmark as bench
    assert bench.parse_args(["--no-cuda"]).model == "resnet_small"
    assert bench.parse_args(["--no-cuda", "--model", "resnet50"]).model == "resnet50"


def _imagenet_ddp(env, extra):
    cmd = [find_mpirun(), "-np", "2", REPO_ROOT / "train.sh"] + extra
    code, out, err, _ = run_bounded(cmd, clean_env(dict(env, JOB="imagenet_ddp",
                                                        PYTHON=sys.executable)), 60)
    assert code == 0, out + err
    assert "on 2 process(es)" in out, out  # ranks from MPI
    # train.sh gave a one-process command line (--world-size 1 --rank 0), so every run
    # warned on every rank that it contradicts MPI
    assert "contradicts" not in err, err
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
