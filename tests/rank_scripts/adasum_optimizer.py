"""DistributedOptimizer(op=Adasum): Horovod's delta-based optimizer against a simulation.

The reference runs in this one process with plain torch: one optimizer per rank (their
states differ), each stepping the shared weights on its rank's slice of the batch; the
per-rank deltas of every parameter are combined by the numpy Adasum of
tests/support/adasum_reference.py and added to the shared weights. After STEPS steps the
distributed weights must match it (float64) and be bit-identical on every rank.
Variants: SGD with momentum, Adam, backward_passes_per_step=2, num_groups, explicit
synchronize() before step(), a parameter without gradient, a process set.
"""
import os
import sys

import numpy as np
import torch

from common import hvd, init, log, main
from optimizer import BATCH, Net, adam, batch, loss_fn, make_model, same_on_every_rank, sgd
from optimizer import reference as whole_batch_reference

from perseus.torch.optimizer import DistributedOptimizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.adasum_reference import adasum  # noqa: E402

STEPS = 6
TOL = 1e-10


def rank_slice(r, n, passes=1, k=0):
    x, y = batch()
    rows = BATCH // n
    x, y = x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
    micro = rows // passes
    return x[k * micro:(k + 1) * micro], y[k * micro:(k + 1) * micro]


def reference(n, make_opt, passes=1, model_kwargs=None):
    """n simulated ranks: local steps, Adasum of the deltas (numpy), shared weights."""
    models = [make_model(Net, **(model_kwargs or {})) for _ in range(n)]
    opts = [make_opt(m) for m in models]
    for _ in range(STEPS):
        start = [p.detach().clone() for p in models[0].parameters()]
        deltas = []
        for r, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            for k in range(passes):
                x, y = rank_slice(r, n, passes, k)
                (loss_fn(model(x), y) / passes).backward()
            opt.step()
            deltas.append([(p.detach() - s).numpy() for p, s in zip(model.parameters(), start)])
        for i, s in enumerate(start):
            combined = torch.from_numpy(adasum([d[i] for d in deltas]))
            for model in models:
                list(model.parameters())[i].data.copy_(s + combined)
    return [p.detach().clone() for p in models[0].parameters()]


def distributed(me, n, make_opt, passes=1, model_kwargs=None, explicit_sync=False, **kwargs):
    model = make_model(Net, **(model_kwargs or {}))
    base = make_opt(model)
    opt = DistributedOptimizer(base, named_parameters=model.named_parameters(), op=hvd.Adasum,
                               backward_passes_per_step=passes, **kwargs)
    assert isinstance(opt, type(base))
    for step in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            x, y = rank_slice(me, n, passes, k)
            (loss_fn(model(x), y) / passes).backward()
        if step == 0:
            # The hooks started every delta's reduction in backward(), or gathered it
            # to start with others while the core holds.
            gathered = {id(p) for p in opt._gathered}
            started = [entry[1] is not None or key in gathered
                       for key, entry in opt._handles.items()]
            used = [p for p in model.parameters() if p.grad is not None]
            assert len(started) == len(used) and all(started), \
                "%d of %d reductions started during backward()" % (sum(started), len(used))
        if explicit_sync:
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


def compare(got, expected, what):
    worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    assert worst <= TOL, "%s: weights differ from the simulation by %.3g" % (what, worst)
    return worst


def body():
    rank, size = init()
    cases = [
        ("sgd", sgd, {}),
        ("adam", adam, {}),
        ("passes2", sgd, {"passes": 2}),
        ("num_groups", sgd, {"num_groups": 2}),
        ("explicit_sync", adam, {"explicit_sync": True}),
        ("unused_param", sgd, {"model_kwargs": {"unused": True}}),
    ]
    for what, make_opt, kwargs in cases:
        ref_kwargs = {k: v for k, v in kwargs.items() if k in ("passes", "model_kwargs")}
        expected = reference(size, make_opt, **ref_kwargs)
        got = distributed(rank, size, make_opt, **kwargs)
        worst = compare(got, expected, what)
        same_on_every_rank(got, "adasum." + what)
        if rank == 0:
            log("adasum %s: max |diff| %.3g" % (what, worst))

    # Adasum of deltas is not averaging gradients: the check can tell them apart.
    import optimizer
    optimizer.STEPS = STEPS
    averaged = whole_batch_reference(sgd)
    expected = reference(size, sgd)
    assert max(float((a - e).abs().max()) for a, e in zip(averaged, expected)) > 1e-6, \
        "the Adasum simulation equals plain averaging: the test would not notice"

    # On a process set of ranks 1 and 3 (the others stay out).
    if size >= 4:
        members = [1, 3]
        ps = hvd.add_process_set(members)
        if rank in members:
            got = distributed(members.index(rank), 2, sgd, process_set=ps)
            compare(got, reference(2, sgd), "process_set")
        hvd.remove_process_set(ps)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
