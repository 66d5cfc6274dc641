"""What lightning_mpi.py, deepspeed_mpi.py and accelerate_mpi.py share: scikit-learn's
handwritten digits, a small MLP, the check that every rank ends with the same weights,
and the one-process training those weights should equal (tests/mpi/test_torch_tools.py
compares them).

Each global step trains on `batch x ranks` training samples, split evenly between the
ranks: in a fixed order, or in the order torch's DistributedSampler(shuffle=True,
seed=0) draws for each epoch (what Lightning's DDP and deepspeed_mpi.py use). Every
tool splits a global batch between the ranks its own way, but the average gradient is
the same, so a single process that trains on the whole global batches (reference())
takes the same steps, to rounding.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

TRAIN = 1440  # samples; divisible by every global batch the examples use (16 x 2, ...)


def arguments(description, save_help="rank 0 writes the final weights here (torch.save)"):
    """The options every tool example takes; an example adds its own before parsing."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", default="perseus", help="torch.distributed backend")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--save", help=save_help)
    return p


def digits():
    """(train, test) TensorDatasets: pixels scaled to [0, 1], the first TRAIN samples for
    training, the other 357 for testing."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    return TensorDataset(x[:TRAIN], y[:TRAIN]), TensorDataset(x[TRAIN:], y[TRAIN:])


def mlp(seed=0):
    """64 -> 64 -> 64 -> 10, the same weights on every rank (seeded)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def flat(parameters):
    """The parameters as one float32 vector (a copy)."""
    return torch.cat([p.detach().reshape(-1).float().clone() for p in parameters])


def accuracy(model, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def check_and_report(weights, accuracy_, what, save=None):
    """Every rank's weights digest, gathered over the default process group; rank 0
    prints whether they agree and the test accuracy, and saves `weights` to `save`.
    Returns True where all ranks agree (the examples exit 1 otherwise)."""
    import torch.distributed as dist

    digest = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    same = len(set(digests)) == 1
    if dist.get_rank() == 0:
        print("%s: test accuracy %.1f%% on %d rank(s) over %s" % (
            what, 100 * accuracy_, dist.get_world_size(), dist.get_backend()), flush=True)
        print("Ranks' weights: %s" % ("identical (sha256 %s)" % digest[:16] if same else
                                      "DIFFER: %s" % [d[:16] for d in digests]), flush=True)
        if save:
            torch.save(weights, save)
    return same


def reference(epochs, batch, ranks, lr, momentum, shuffle, seed=0):
    """The weights of one process that trains mlp() with SGD on whole global batches of
    batch x ranks samples, as the data-parallel examples do: the samples that rank r
    takes at step k are those DistributedSampler(shuffle=shuffle, seed=seed) gives rank
    r for its k-th batch (with shuffle=False, the next batch x ranks in order)."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x, y = digits()[0].tensors
    for epoch in range(epochs):
        # DistributedSampler's order: a permutation seeded by seed + epoch; rank r takes
        # every ranks-th sample of it from the r-th on
        order = (torch.randperm(len(x), generator=torch.Generator().manual_seed(seed + epoch))
                 if shuffle else torch.arange(len(x)))
        for k in range(len(x) // (batch * ranks)):
            chosen = torch.cat([order[r::ranks][k * batch:(k + 1) * batch] for r in range(ranks)])
            optimizer.zero_grad()
            F.cross_entropy(model(x[chosen]), y[chosen]).backward()
            optimizer.step()
    return flat(model.parameters())
