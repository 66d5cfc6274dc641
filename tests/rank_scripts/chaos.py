"""Chaos: correct requests with bad ones among them, at random, and nothing may hang.

Every rank draws the same plan from PTEST_CHAOS_SEED (printed, so a failure
reproduces): per step, one to three requests submitted together, each either correct
or made bad on one random rank by a different collective under the same name, a
different group size, reduce op, dtype or shape. Names come from a small pool, so the
negotiation cache sees names whose metadata changes.

Checks: a bad request raises HorovodInternalError on every rank, within BOUND_S, with
the same message everywhere; a correct one matches a reference computed here, and its
result is bit-identical on every rank (compared through files at the end, not through
the library under test).
"""
import hashlib
import json
import os
import random
import time

import torch

from common import (assert_equal, assert_reduced, check_engine_settings, exists, hvd, init, log,
                    main, make_tensor, touch)

BOUND_S = 10.0  # an error must arrive within this (about a second, with room for load)
STEPS = int(os.environ.get("PTEST_CHAOS_STEPS", "30"))
NAMES = ["chaos.%d" % i for i in range(5)]
FAULTS = ["collective", "group", "op", "dtype", "shape"]
KINDS = ["allreduce", "grouped_allreduce", "allgather", "broadcast"]


def plan(seed, step, size):
    """[(name, kind, dtype, rows, op, fault, bad_rank)] for this step, alike on every rank."""
    rng = random.Random("%d/%d" % (seed, step))
    requests = []
    for name in rng.sample(NAMES, rng.randint(1, 3)):
        kind = rng.choice(KINDS)
        dtype = rng.choice([torch.float32, torch.float64, torch.int32])
        op = rng.choice([hvd.Sum, hvd.Max, hvd.Min])
        fault = rng.choice(FAULTS) if rng.random() < 0.4 else None
        if fault == "group" and kind != "grouped_allreduce":
            fault = "collective"
        if fault == "collective" and kind == "grouped_allreduce":
            fault = "group"  # a group's wire names are the members', "<name>.<i>"
        if fault == "op" and kind not in ("allreduce", "grouped_allreduce"):
            fault = "dtype"
        requests.append((name, kind, dtype, rng.randint(1, 4), op, fault, rng.randrange(size)))
    return requests


def submit(step, req, rank, size):
    """Starts this rank's side of `req`; returns (handle, inputs of every rank, what)."""
    name, kind, dtype, rows, op, fault, bad_rank = req
    bad = fault if rank == bad_rank else None
    tag = "%s@%d" % (name, step)
    count = 2
    if bad == "dtype":
        dtype = torch.float64 if dtype != torch.float64 else torch.float32
    shape = (rows, 4 if bad == "shape" else 3)  # (allgather's rows may differ by rank)
    if bad == "op":
        op = hvd.Product if op != hvd.Product else hvd.Sum
    if bad == "group":
        count = 3
    if bad == "collective":
        kind = "allgather" if kind != "allgather" else "allreduce"
        if kind == "allreduce":
            op = hvd.Sum
    xs = [[make_tensor("%s.%d" % (tag, i), r, shape, dtype) for r in range(size)]
          for i in range(count)]
    mine = [x[rank] for x in xs]
    if kind == "allreduce":
        handle = hvd.allreduce_async(mine[0], name=name, op=op)
    elif kind == "grouped_allreduce":
        handle = hvd.grouped_allreduce_async(mine, name=name, op=op)
    elif kind == "allgather":
        handle = hvd.allgather_async(mine[0], name=name)
    else:
        handle = hvd.broadcast_async(mine[0], bad_rank, name=name)
    return handle, xs, kind, op, dtype


def check(result, xs, kind, op, dtype, what):
    if kind == "allreduce":
        assert_reduced(result, xs[0], op, dtype, what)
        return [result]
    if kind == "grouped_allreduce":
        assert len(result) == 2, what
        for got, x in zip(result, xs):
            assert_reduced(got, x, op, dtype, what)
        return result
    if kind == "allgather":
        assert_equal(result, torch.cat(xs[0]), what)
        return [result]
    return [result]  # broadcast: checked by the caller, which knows the root


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(t.dtype).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def body():
    rank, size = init()
    check_engine_settings()  # the test runs two settings in one process
    seed = int(os.environ.get("PTEST_CHAOS_SEED", "1616"))
    if rank == 0:
        log("chaos seed %d (PTEST_CHAOS_SEED), %d steps" % (seed, STEPS))
    record = []  # (what, "ok" + digest | "error" + message), compared across ranks
    for step in range(STEPS):
        requests = plan(seed, step, size)
        started = [(req, submit(step, req, rank, size)) for req in requests]
        for req, (handle, xs, kind, op, dtype) in started:
            name, planned, _, _, _, fault, bad_rank = req
            what = "seed %d step %d %s (%s, fault %s on rank %d)" % (seed, step, name, planned,
                                                                   fault, bad_rank)
            start = time.monotonic()
            try:
                result = hvd.synchronize(handle)
            except hvd.HorovodInternalError as e:
                elapsed = time.monotonic() - start
                assert fault is not None, "%s: unexpected error %s" % (what, e)
                assert elapsed < BOUND_S, "%s: the error took %.1f s" % (what, elapsed)
                assert name in str(e), "%s: the error does not name it: %s" % (what, e)
                record.append((what, "error: %s" % e))
                continue
            assert fault is None, "%s: no error for a bad request, got a result" % what
            outs = check(result, xs, kind, op, dtype, what)
            if kind == "broadcast":
                assert_equal(result, xs[0][bad_rank], what)
            record.append((what, "ok " + digest(outs)))
    # Every rank saw the same outcome for every request: the same error text, or
    # bit-identical results.
    path = os.path.join(os.environ["PTEST_TMPDIR"], "chaos.%d.json" % rank)
    with open(path, "w") as f:
        json.dump(record, f)
    touch("chaos.done.%d" % rank)
    deadline = time.monotonic() + 60
    while not all(exists("chaos.done.%d" % r) for r in range(size)):
        assert time.monotonic() < deadline, "the other ranks' records never came"
        time.sleep(0.01)
    for r in range(size):
        with open(os.path.join(os.environ["PTEST_TMPDIR"], "chaos.%d.json" % r)) as f:
            theirs = [tuple(x) for x in json.load(f)]
        for mine, other in zip(record, theirs):
            assert mine == other, "rank %d vs rank %d differ:\n%s\n%s" % (rank, r, mine, other)
        assert len(theirs) == len(record), (len(theirs), len(record))
    errors = sum(1 for _, outcome in record if outcome.startswith("error"))
    if rank == 0:
        log("chaos: %d requests, %d bad, all alike on %d ranks" % (len(record), errors, size))
    hvd.shutdown()


main(body)
