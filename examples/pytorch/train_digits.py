"""Data-parallel classification of scikit-learn's handwritten digits (8x8 images,
10 classes, 1797 samples) with an MLP on Perseus' Horovod API.

    python examples/pytorch/train_digits.py                  # one process
    mpirun -np 2 python examples/pytorch/train_digits.py     # two ranks
    perseusrun -np 2 python examples/pytorch/train_digits.py
    mpirun -np 2 ./train.sh                                  # the same, AIACC style

Each rank trains on its own shard of the training set (DistributedSampler), the
gradients are averaged by hvd.DistributedOptimizer, and the learning rate is scaled
by the number of ranks (the global batch is batch_size x size). Test accuracy is
computed over the whole test set (each rank scores a slice; the counts are summed).
Rank 0 alone prints and writes the checkpoint, by default to
~/.cache/perseus/checkpoints/train_digits.pt ($XDG_CACHE_HOME/perseus/... where set);
--resume restores it on rank 0 and broadcasts it to the others, and trains on to
--epochs (see --help). The checkpoint's folder must be the user's own and writable by
no one else, and the checkpoint no symbolic link or other user's file
(perseus.common.private_files): else every rank stops, saying why.

Where torch sees CUDA devices, rank r trains on GPU local_rank % device count (one
process per GPU: `mpirun -np <GPUs> ./train.sh`) and the gradients go over NCCL;
ranks that share a GPU are reduced host-staged through MPI, with one warning. Else,
or with --device cpu, it trains on the CPU. Each epoch prints the samples per second
over all ranks; the end prints the run's, and whether every rank holds the same weights.

--elastic trains inside hvd.elastic.run, committing every --commit-every batches: on Open
MPI 5 with ULFM (`bash scripts/elastic_demo.sh`, which also SIGKILLs a rank with
--kill-rank) a rank that dies is left behind and the others go on from the last commit.

Settings: command-line options, or environment variables EPOCHS, BATCH_SIZE, LR,
MOMENTUM, WEIGHT_DECAY, SEED, CHECKPOINT, HIDDEN, DEVICE (an option given on the command
line wins).
"""

import argparse
import math
import os
import signal
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import perseus.torch.horovod as hvd
from perseus.common import private_files


def env(name, default, cast):
    value = os.environ.get(name)
    return default if value in (None, "") else cast(value)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Data-parallel MLP on scikit-learn's digits",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=int, default=env("EPOCHS", 20, int),
                   help="epochs in all; the learning rate decays over them (cosine)")
    p.add_argument("--batch-size", type=int, default=env("BATCH_SIZE", 32, int),
                   help="batch size per rank")
    p.add_argument("--lr", type=float, default=env("LR", 0.02, float),
                   help="learning rate for one rank; multiplied by the number of ranks")
    p.add_argument("--momentum", type=float, default=env("MOMENTUM", 0.9, float))
    p.add_argument("--weight-decay", type=float, default=env("WEIGHT_DECAY", 1e-4, float))
    p.add_argument("--hidden", type=int, default=env("HIDDEN", 128, int), help="hidden layer width")
    p.add_argument("--seed", type=int, default=env("SEED", 42, int))
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--checkpoint", default=env("CHECKPOINT",
                                               private_files.default_checkpoint("train_digits.pt"), str),
                   help="where rank 0 saves the final model and optimizer state ('' for none)")
    p.add_argument("--resume", action="store_true",
                   help="start from --checkpoint if it exists: its weights, momentum and the "
                        "epoch it reached; the settings (--epochs, --lr, ...) are this run's, "
                        "and the schedule is rebuilt for this run's --epochs from the epoch "
                        "reached, the same on every rank (a checkpoint at or past --epochs "
                        "is only scored)")
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    p.add_argument("--progress", action="store_true", help="a progress bar per epoch on rank 0")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default=env("DEVICE", "auto", str),
                   help="auto: a GPU per rank where torch sees CUDA devices, else the CPU")
    p.add_argument("--elastic", action="store_true",
                   help="train inside hvd.elastic.run, committing every --commit-every "
                        "batches: where the job may outlive a rank (Open MPI 5 with ULFM: "
                        "scripts/elastic_demo.sh), the others go on from the last commit")
    p.add_argument("--commit-every", type=int, default=4, help="--elastic: batches per commit")
    p.add_argument("--kill-rank", type=int, default=None,
                   help="a demonstration of --elastic: this rank SIGKILLs itself ...")
    p.add_argument("--kill-at-epoch", type=int, default=1,
                   help="... at its third batch of this epoch (counting from 0)")
    args = p.parse_args(argv)
    if args.kill_rank is not None and not args.elastic:
        p.error("--kill-rank needs --elastic (without it a rank that dies ends the job)")
    if args.commit_every < 1:
        p.error("--commit-every must be at least 1")
    return args


def load_digits_split(test_fraction, seed):
    """A fixed random train/test split (the same on every rank), features standardised."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    # Standardise each pixel with the training set's statistics (constant pixels stay 0).
    mean, std = x[train].mean(0), x[train].std(0).clamp_min(1.0)
    x = (x - mean) / std
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


class MLP(nn.Module):
    def __init__(self, hidden=128, inputs=64, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def choose_device(wanted):
    """This rank's device: GPU local_rank % device count (or the CPU), announced by rank
    0 for every rank."""
    if wanted == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch %s sees no CUDA device" % torch.__version__)
    if wanted != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
        what = "%s (%s)" % (device, torch.cuda.get_device_name(device))
    else:
        device, what = torch.device("cpu"), "cpu"
    where = hvd.allgather_object("%s: %s" % (hvd.rank(), what), name="train.devices")
    if hvd.rank() == 0:
        print("Devices, rank: device\n  " + "\n  ".join(where), flush=True)
    return device


def evaluate(model, test_set, device):
    """(mean loss, accuracy) over the whole test set: rank r scores items r, r+size, ...
    and the sums are allreduced."""
    model.eval()
    x, y = test_set.tensors
    x, y = x[hvd.rank()::hvd.size()].to(device), y[hvd.rank()::hvd.size()].to(device)
    with torch.no_grad():
        out = model(x)
        loss = F.cross_entropy(out, y, reduction="sum")
        correct = (out.argmax(1) == y).sum()
    totals = hvd.allreduce(torch.tensor([loss.item(), float(correct), float(len(y))],
                                        dtype=torch.float64), op=hvd.Sum, name="eval.totals")
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def learning_rate(args, size, epoch):
    """Cosine decay from lr x size at epoch 0 to 0 at --epochs. A function of the epoch
    alone, so every rank of a resumed run, whatever its --epochs, sets the same."""
    return args.lr * size * (1 + math.cos(math.pi * epoch / max(1, args.epochs))) / 2


def weights_spread(model):
    """The largest difference of a weight between ranks: 0 when every rank holds the same
    model, as data-parallel training keeps it."""
    flat = torch.cat([p.detach().double().flatten().cpu() for p in model.parameters()])
    high = hvd.allreduce(flat, op=hvd.Max, name="check.high")
    low = hvd.allreduce(flat, op=hvd.Min, name="check.low")
    return (high - low).max().item()


def progress(done, total, width=30):
    filled = int(width * done / total)
    print("\r  [%s%s] %d/%d" % ("#" * filled, "." * (width - filled), done, total),
          end="" if done < total else "\r" + " " * (width + 20) + "\r", flush=True)


def resume_state(args):
    """Rank 0: the checkpoint's state when resuming from one (else None), after checking
    that the checkpoint may be written at the end. A refusal stops every rank, saying why."""
    state, problem = None, None
    if args.checkpoint and hvd.rank() == 0:
        try:
            if args.resume and os.path.lexists(args.checkpoint):
                with private_files.open_private(args.checkpoint) as f:
                    state = torch.load(f, map_location="cpu")
            private_files.check_writable(args.checkpoint)
        except OSError as e:
            problem = str(e)
    problem = hvd.broadcast_object(problem, root_rank=0, name="checkpoint.problem")
    if problem:
        raise SystemExit("train_digits: %s\n(--checkpoint PATH or CHECKPOINT=PATH picks another "
                         "file, '' none)" % problem)
    return state


def train_elastic(args, train_set, model, optimizer, start_epoch, train_epoch):
    """The epochs inside hvd.elastic.run (Horovod's elastic API): the model, optimizer,
    epoch and the sampler's progress are committed every --commit-every batches; after a
    rank fails, the others restore the last commit, shrink to a world without it, take
    rank 0's state and go on with the rest of the epoch."""
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                   epoch=start_epoch)
    world_rank = hvd.rank()  # as launched: --kill-rank counts these

    def after_reset():
        if hvd.rank() == 0:
            print("A rank failed: going on with %d rank(s) from the last commit (epoch %d)"
                  % (hvd.size(), state.epoch + 1), flush=True)

    state.register_reset_callbacks([after_reset])

    def on_batch(i):
        if args.kill_rank == world_rank and state.epoch == args.kill_at_epoch and i == 2:
            print("Rank %d: SIGKILL to itself (--kill-rank)" % world_rank, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        sampler.record_batch(i, args.batch_size)
        if (i + 1) % args.commit_every == 0:
            state.commit()

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            # This epoch's samples not processed yet, split over the world as it is now.
            loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
            train_epoch(state.epoch, loader, on_batch)
            state.epoch += 1  # before the commit: a restore goes on with the next epoch
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)


def main(argv=None):
    args = parse_args(argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores among this node's ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    say = print if rank == 0 else (lambda *a, **k: None)
    device = choose_device(args.device)
    state = resume_state(args)  # before the work, so that a refused checkpoint costs none

    train_set, test_set = load_digits_split(args.test_fraction, args.seed)
    # Each rank draws a disjoint 1/size of the (reshuffled every epoch) training set.
    sampler = DistributedSampler(train_set, num_replicas=size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = MLP(args.hidden).to(device)
    # Scale the learning rate by the number of ranks: the global batch is size x batch_size.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    start_epoch = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        # This run's settings, not the checkpoint's (which ended at lr 0).
        for group in optimizer.param_groups:
            group.update(momentum=args.momentum, weight_decay=args.weight_decay)
        start_epoch = state["epoch"]
        say("Resumed from %s (epoch %d)" % (args.checkpoint, start_epoch))
    # Every rank starts from rank 0's weights, optimizer state and epoch.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start_epoch = int(hvd.broadcast(torch.tensor([start_epoch]), root_rank=0, name="start_epoch").item())

    say("Training an MLP on digits: %d train / %d test samples, %d rank(s), batch %d per rank, "
        "lr %.4g" % (len(train_set), len(test_set), size, args.batch_size, args.lr * size))
    began = time.monotonic()
    run = {"accuracy": 0.0, "trained": 0.0, "training_s": 0.0}

    def train_epoch(epoch, batches, on_batch=None):
        """One epoch over `batches` (x, y) on this rank; prints the epoch's line."""
        model.train()
        lr = learning_rate(args, hvd.size(), epoch)  # cosine decay: the last epochs settle
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum, seen = 0.0, 0
        epoch_began = time.monotonic()
        for i, (x, y) in enumerate(batches):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            seen += len(y)
            if on_batch is not None:
                on_batch(i)
            if args.progress and hvd.rank() == 0:
                progress(i + 1, len(batches))
        # loss.item() above waited for each step, so the GPU is done with the epoch here.
        epoch_s = time.monotonic() - epoch_began
        totals = hvd.allreduce(torch.tensor([loss_sum, float(seen)], dtype=torch.float64),
                               op=hvd.Sum, name="train.loss")
        train_loss = (totals[0] / max(1.0, totals[1])).item()
        slowest_s = hvd.allreduce(torch.tensor([epoch_s]), op=hvd.Max, name="train.epoch_s").item()  # the pace
        run["trained"] += totals[1].item()
        run["training_s"] += slowest_s
        test_loss, run["accuracy"] = evaluate(model, test_set, device)
        if hvd.rank() == 0:
            print("Epoch %2d/%d: lr %.4g  %.0f samples/s  train loss %.4f  test loss %.4f  test "
                  "accuracy %.2f%%" % (epoch + 1, args.epochs, lr, totals[1].item() / slowest_s,
                                       train_loss, test_loss, 100 * run["accuracy"]), flush=True)

    if args.elastic:
        train_elastic(args, train_set, model, optimizer, start_epoch, train_epoch)
    else:
        for epoch in range(start_epoch, args.epochs):
            sampler.set_epoch(epoch)
            train_epoch(epoch, loader)
    accuracy, trained, training_s = run["accuracy"], run["trained"], run["training_s"]
    rank, size = hvd.rank(), hvd.size()  # a world that lost a rank is smaller
    say = print if rank == 0 else (lambda *a, **k: None)

    if start_epoch >= args.epochs:  # resumed a finished run: just score it
        _, accuracy = evaluate(model, test_set, device)
    if size > 1:
        spread = weights_spread(model)
        say("Ranks' weights: %s" % ("identical" if spread == 0 else "differ by up to %.3g" % spread))
    say("Final test accuracy: %.2f%% on %d rank(s) in %.1f s" % (100 * accuracy, size, time.monotonic() - began))
    if training_s > 0:
        say("Throughput: %.0f samples/s over %d epoch(s), %d rank(s) on %s"
            % (trained / training_s, args.epochs - start_epoch, size, device.type.upper()))
    if args.checkpoint and rank == 0:
        with private_files.replace_privately(args.checkpoint) as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": max(start_epoch, args.epochs), "accuracy": accuracy, "size": size}, f)
        say("Checkpoint saved to %s" % args.checkpoint)
    hvd.shutdown()


if __name__ == "__main__":
    main()
