"""What one call costs, counted rather than timed (issue 51): Python function calls on
the calling thread (sys.setprofile: Python functions and builtins called from Python)
and what the core asked of MPI (perseus_counters), per call in steady state, for:

- allreduce_4k: a repeated named in-place 4 KiB allreduce_ (hvd.allreduce_);
- optimizer_step: one DistributedOptimizer step of a small model (3 layers), from
  backward() through step();
- backend_all_reduce: one torch.distributed.all_reduce of 4 KiB on the "perseus"
  backend.

Rank 0 prints one line "BUDGET <json>" with the averages; tests/mpi/test_call_budget.py
holds them to their budgets. Each result is also checked against a reference, so a
cheaper call that is wrong cannot pass.
"""
import json
import sys

import torch
import torch.distributed as dist

from common import hvd, launcher_rank_size, main

import perseus.torch  # noqa: F401 - registers the backend
from perseus.common import requests as _requests

# Measured calls per case, after as many to warm up: more than the backend's 60 names
# in turn, so that every name it uses has been agreed before (steady state).
CALLS = 64


def count(call):
    """(Python calls, core counters) per call of call() over CALLS calls."""
    for _ in range(CALLS):
        call()
    python = [0]

    def profile(frame, event, arg):
        if event == "call" or event == "c_call":
            python[0] += 1

    before = _requests.counters()
    sys.setprofile(profile)
    try:
        for _ in range(CALLS):
            call()
    finally:
        sys.setprofile(None)
    after = _requests.counters()
    costs = {"python_calls": python[0] / CALLS}
    costs.update({name: (after[name] - before[name]) / CALLS for name in after})
    return costs


def body():
    rank, size = launcher_rank_size()
    hvd.init()
    results = {}

    t = torch.ones(1024)

    def allreduce_4k():
        t.fill_(rank + 1.0)
        hvd.allreduce_(t, name="budget.4k", op=hvd.Sum)

    results["allreduce_4k"] = count(allreduce_4k)
    assert torch.equal(t, torch.full((1024,), size * (size + 1) / 2.0)), t[:4]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.arange(32.0).reshape(4, 8) / 32 + rank

    def optimizer_step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    results["optimizer_step"] = count(optimizer_step)
    # Every rank applied the average of every rank's gradient: the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    assert all(torch.equal(gathered[0], row) for row in gathered), "ranks' parameters differ"

    dist.init_process_group("perseus")
    u = torch.ones(1024)

    def backend_all_reduce():
        u.fill_(rank + 1.0)
        dist.all_reduce(u)

    results["backend_all_reduce"] = count(backend_all_reduce)
    assert torch.equal(u, torch.full((1024,), size * (size + 1) / 2.0)), u[:4]
    dist.destroy_process_group()
    if rank == 0:
        print("BUDGET " + json.dumps(results), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
