"""Randomized soak (tests/mpi/test_soak.py runs it at np 2 and 4 with 1-4 lanes and tiny
fusion thresholds).

Round after round, every rank draws the same random list of requests from a shared
seed: op (allreduce, in place or not, grouped; allgather and grouped; broadcast, in
place or not; alltoall with random splits; reducescatter and grouped), dtype, shape
(empty ones too), reduce op, scale factors and process set. Each rank submits its
share asynchronously in its own shuffled order, then waits in another.

Inputs are small integers from a generator seeded by (seed, round, request, rank),
so every rank rebuilds every input, and the reference is computed independently in
numpy (int64 / float64). Values and scale factors (powers of two) keep every result
exactly representable: results must equal the reference bit for bit. At the end the
ranks compare digests of the results they all hold, and the resident memory after
the run must be within a small bound of its size after warm-up.

PTEST_SOAK_ROUNDS (if set) and PTEST_SOAK_SECONDS bound the run, whichever is reached
first; PTEST_SOAK_SEED picks the sequence (printed, so a failure can be replayed).
"""
import gc
import os
import random
import time
import zlib

import numpy as np
import torch

from common import hvd, init, log, main

KINDS = ["allreduce", "allreduce_", "grouped_allreduce", "allgather", "grouped_allgather",
         "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter"]
NUMERIC = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64]
MOVABLE = NUMERIC + [torch.bool]  # allgather, broadcast, alltoall
REPLICATED = {"allreduce", "allreduce_", "grouped_allreduce", "allgather", "grouped_allgather",
              "broadcast", "broadcast_"}  # every member ends with the same result
MAX_REQUESTS = 10
MAX_COLLECTIVES = int(os.environ.get("PTEST_SOAK_COLLECTIVES", "50000"))
# By then torch and the allocator have seen most kinds of request. What the resident
# memory gains after is mostly the allocator's: it grows in steps of a few MB that a
# longer run does not multiply (np 4, 27 Nov: 9-14 MB after 15-45 s, the code of 26 Nov
# alike), so RSS_BOUND_MB catches only a large leak; a leak of tensors, however small,
# shows in the count of live tensors: besides the last round's own (a few), it must
# not grow, where one leaked tensor in 16 rounds would add about 70.
WARM_ROUNDS = 300
RSS_BOUND_MB = 16
LAST_ROUND_TENSORS = 32


def subsets(size):
    return {2: [[0], [1]], 4: [[0, 1], [1, 2, 3], [0, 2], [3]]}[size]


def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_tensors():
    """The tensors Python holds, between rounds (no request in flight)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


# ---------------------------------------------------------------- drawing requests

def draw_shape(rng, first=None):
    ndim = rng.choice([1, 1, 2, 3])
    shape = [rng.choice([0, 1, 2, 3, 5, 8, 17, 64]) if rng.random() < 0.9 else 0 for _ in range(ndim)]
    if first is not None:
        shape[0] = first
    return tuple(shape)


def draw(rng, rnd, i, sets):
    """One request, identical on every rank: a dict the other functions read."""
    kind = rng.choice(KINDS)
    members = rng.choice(sets)
    # Odd rounds reuse a small pool of names (the negotiation cache meets them again,
    # often with other metadata); even rounds use fresh ones.
    name = "soak.%d" % i if rnd % 2 else "soak.%d.%d" % (rnd, i)
    req = {"name": name, "round": rnd, "kind": kind, "members": members,
           "count": rng.randint(2, 3) if kind.startswith("grouped") else 1}
    n = len(members)
    if kind in ("allreduce", "allreduce_", "grouped_allreduce", "reducescatter", "grouped_reducescatter"):
        req["dtype"] = rng.choice(NUMERIC)
        floating = req["dtype"].is_floating_point
        ops = ["Sum", "Average", "Min", "Max", "Product"] if "allreduce" in kind else ["Sum", "Average"]
        if floating and n & (n - 1):
            ops.remove("Average")  # dividing by 3 would round: results would not be exact
        req["op"] = rng.choice(ops)
        if floating and req["op"] in ("Sum", "Average"):
            req["prescale"], req["postscale"] = rng.choice([1.0, 0.5, 2.0]), rng.choice([1.0, 0.5, 2.0])
        else:
            req["prescale"] = req["postscale"] = 1.0
        if "reducescatter" in kind:
            req["shapes"] = [draw_shape(rng, rng.choice([0, 1, n, 2 * n + 1, 7])) for _ in range(req["count"])]
        else:
            req["shapes"] = [draw_shape(rng) for _ in range(req["count"])]
    else:
        req["dtype"] = rng.choice(MOVABLE)
        tail = draw_shape(rng)[1:]
        if kind in ("allgather", "grouped_allgather", "alltoall"):
            # The first dimension differs by rank: [member][tensor] shapes.
            req["shapes"] = [[(rng.choice([0, 1, 2, 4]),) + tail for _ in range(req["count"])]
                             for _ in members]
            if kind == "alltoall":  # splits[member][destination]
                req["splits"] = []
                for m in range(n):
                    rows = req["shapes"][m][0][0]
                    cuts = sorted(rng.randint(0, rows) for _ in range(n - 1))
                    req["splits"].append([b - a for a, b in zip([0] + cuts, cuts + [rows])])
        else:
            req["shapes"] = [draw_shape(rng)]
            req["root"] = rng.choice(members)
    return req


def make_input(seed, req, member_index, t, shape):
    """Member `member_index`'s t-th input as a numpy array (int64 or float64 values)."""
    g = np.random.default_rng([seed, req["round"], zlib.crc32(req["name"].encode()), member_index, t])
    dtype = req["dtype"]
    if dtype == torch.bool:
        return g.integers(0, 2, size=shape).astype(np.bool_)
    if req.get("op") == "Product":
        lo, hi = (0, 3) if dtype == torch.uint8 else (-3, 3)
    else:
        lo, hi = (0, 15) if dtype == torch.uint8 else (-8, 8)
    values = g.integers(lo, hi + 1, size=shape)
    return values.astype(np.float64) if dtype.is_floating_point else values.astype(np.int64)


def to_torch(array, dtype):
    if dtype == torch.bool:
        return torch.from_numpy(array.copy())
    return torch.from_numpy(array.copy()).to(dtype)


# ---------------------------------------------------------------- references

def reduce_reference(xs, req):
    """Exact numpy reduction, with the core's scaling: floats multiply, integers
    truncate toward zero (only powers of two and 1 are drawn, so floats stay exact)."""
    op, n = req["op"], len(xs)
    floating = req["dtype"].is_floating_point
    xs = [x * req["prescale"] for x in xs] if floating else xs
    stacked = np.stack(xs)
    if op in ("Sum", "Average"):
        total = stacked.sum(0)
        factor = req["postscale"] / n if op == "Average" else req["postscale"]
        if floating:
            return total * factor
        return np.trunc(total * factor).astype(np.int64) if factor != 1.0 else total
    return {"Min": stacked.min(0), "Max": stacked.max(0), "Product": stacked.prod(0)}[op]


def expected(seed, req, me):
    """The list of results member index `me` must get."""
    kind, n = req["kind"], len(req["members"])
    out = []
    for t in range(req["count"]):
        if kind in ("allreduce", "allreduce_", "grouped_allreduce"):
            xs = [make_input(seed, req, m, t, req["shapes"][t]) for m in range(n)]
            out.append(reduce_reference(xs, req))
        elif kind in ("reducescatter", "grouped_reducescatter"):
            xs = [make_input(seed, req, m, t, req["shapes"][t]) for m in range(n)]
            full = reduce_reference(xs, req)
            rows = [full.shape[0] // n + (1 if r < full.shape[0] % n else 0) for r in range(n)]
            start = sum(rows[:me])
            out.append(full[start:start + rows[me]])
        elif kind in ("allgather", "grouped_allgather"):
            out.append(np.concatenate([make_input(seed, req, m, t, req["shapes"][m][t]) for m in range(n)]))
        elif kind == "alltoall":
            parts = []
            for m in range(n):
                x = make_input(seed, req, m, 0, req["shapes"][m][0])
                start = sum(req["splits"][m][:me])
                parts.append(x[start:start + req["splits"][m][me]])
            out.append(np.concatenate(parts))
        else:  # broadcast
            root = req["members"].index(req["root"])
            out.append(make_input(seed, req, root, 0, req["shapes"][0]))
    return out


# ---------------------------------------------------------------- submitting

def submit(seed, req, me, process_set):
    """Starts this member's part of `req`; returns (handle, in-place tensors or None)."""
    kind, dtype = req["kind"], req["dtype"]

    def mine(t):
        shape = req["shapes"][me][t] if kind in ("allgather", "grouped_allgather", "alltoall") \
            else req["shapes"][t]
        return to_torch(make_input(seed, req, me, t, shape), dtype)

    xs = [mine(t) for t in range(req["count"])]
    name, ps = req["name"], process_set
    op = getattr(hvd, req.get("op", "Sum"))
    scales = dict(prescale_factor=req.get("prescale", 1.0), postscale_factor=req.get("postscale", 1.0))
    if kind == "allreduce":
        return hvd.allreduce_async(xs[0], name=name, op=op, process_set=ps, **scales), None
    if kind == "allreduce_":
        return hvd.allreduce_async_(xs[0], name=name, op=op, process_set=ps, **scales), xs
    if kind == "grouped_allreduce":
        return hvd.grouped_allreduce_async(xs, name=name, op=op, process_set=ps, **scales), None
    if kind == "reducescatter":
        return hvd.reducescatter_async(xs[0], name=name, op=op, process_set=ps, **scales), None
    if kind == "grouped_reducescatter":
        return hvd.grouped_reducescatter_async(xs, name=name, op=op, process_set=ps, **scales), None
    if kind == "allgather":
        return hvd.allgather_async(xs[0], name=name, process_set=ps), None
    if kind == "grouped_allgather":
        return hvd.grouped_allgather_async(xs, name=name, process_set=ps), None
    if kind == "alltoall":
        return hvd.alltoall_async(xs[0], splits=req["splits"][me], name=name, process_set=ps), None
    if kind == "broadcast":
        return hvd.broadcast_async(xs[0], req["root"], name=name, process_set=ps), None
    return hvd.broadcast_async_(xs[0], req["root"], name=name, process_set=ps), xs


def results_of(req, out, inplace):
    if inplace is not None:
        return inplace  # the caller's own tensors hold the results
    if req["kind"] == "alltoall":
        return [out[0]]
    return list(out) if req["kind"].startswith("grouped") else [out]


def check(req, got, want):
    dtype = req["dtype"]
    assert len(got) == len(want), "%s: %d results, expected %d" % (req["name"], len(got), len(want))
    for t, (g, w) in enumerate(zip(got, want)):
        ref = to_torch(np.asarray(w), dtype)
        if g.dtype != dtype or tuple(g.shape) != tuple(ref.shape) or not torch.equal(g, ref):
            raise AssertionError("%s[%d] (%s): got %s %s %s, expected %s %s"
                                 % (req["name"], t, {k: v for k, v in req.items() if k != "shapes"},
                                    g.dtype, tuple(g.shape), g.flatten()[:6].tolist(),
                                    tuple(ref.shape), ref.flatten()[:6].tolist()))


def digest(tensors, crc):
    for t in tensors:
        crc = zlib.crc32(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"", crc)
        crc = zlib.crc32(repr((str(t.dtype), tuple(t.shape))).encode(), crc)
    return crc


# ---------------------------------------------------------------- the run

def body():
    rank, size = init()
    seed = int(os.environ.get("PTEST_SOAK_SEED", "20240611"))
    budget_s = float(os.environ.get("PTEST_SOAK_SECONDS", "15"))
    max_rounds = int(os.environ.get("PTEST_SOAK_ROUNDS", "0")) or None
    sets = [hvd.global_process_set] + [hvd.add_process_set(m) for m in subsets(size)]
    members_of = {id(ps): list(range(size)) if ps is hvd.global_process_set else ps.ranks for ps in sets}
    draw_rng = random.Random(seed)          # the same on every rank
    order_rng = random.Random(seed + 1 + rank)  # this rank's own orders
    if rank == 0:
        log("seed %d, lanes %d, config %s" % (seed, hvd.lane_count(), hvd.config()))
    digests = {}
    collectives = 0
    warm_rss = warm_tensors = None
    start = time.monotonic()
    rnd = 0
    while True:
        if rnd % 10 == 0:
            # Rank 0 decides when to stop, so every rank runs the same rounds.
            more = time.monotonic() - start < budget_s and collectives < MAX_COLLECTIVES \
                and (max_rounds is None or rnd < max_rounds)
            more = torch.tensor([1 if more else 0])
            if hvd.broadcast(more, 0, name="soak.more").item() == 0:
                break
        if rnd == WARM_ROUNDS:
            warm_rss, warm_tensors = resident_mb(), live_tensors()
        reqs = [draw(draw_rng, rnd, i, [members_of[id(ps)] for ps in sets])
                for i in range(draw_rng.randint(1, MAX_REQUESTS))]
        ps_of = {tuple(members_of[id(ps)]): ps for ps in sets}
        mine = [r for r in reqs if rank in r["members"]]
        order_rng.shuffle(mine)
        pending = []
        for req in mine:
            me = req["members"].index(rank)
            handle, inplace = submit(seed, req, me, ps_of[tuple(req["members"])])
            pending.append((req, me, handle, inplace))
        order_rng.shuffle(pending)
        replicated = []
        for req, me, handle, inplace in pending:
            got = results_of(req, hvd.synchronize(handle), inplace)
            check(req, got, expected(seed, req, me))
            if req["kind"] in REPLICATED:
                replicated.append((req["name"], tuple(req["members"]), got))
        # One running digest per process set, folded in name order (the same on every
        # member whatever the completion order), so memory stays flat.
        for name, members, got in sorted(replicated, key=lambda x: x[0]):
            digests[members] = digest(got, digests.get(members, 0))
        collectives += len(reqs)
        rnd += 1
    end_rss, end_tensors = resident_mb(), live_tensors()

    # Bitwise identical across ranks: every member of a set holds the same digest.
    everyone = hvd.allgather_object(digests)
    for members, value in digests.items():
        for other in members:
            assert everyone[other].get(members) == value, \
                "results in process set %s differ between rank %d and rank %d" % (members, rank, other)
    log("%d rounds, %d collectives in %.1f s; digests of %d sets agree; "
        "resident %.1f MB after warm-up, %.1f MB at the end; live tensors %s then %d"
        % (rnd, collectives, time.monotonic() - start, len(digests), warm_rss or -1, end_rss, warm_tensors, end_tensors))
    assert rnd > WARM_ROUNDS, "too few rounds (%d) to judge memory" % rnd
    assert end_tensors <= warm_tensors + LAST_ROUND_TENSORS, \
        "live tensors grew from %d to %d: something keeps them after their requests ended" % (warm_tensors, end_tensors)
    assert end_rss - warm_rss < RSS_BOUND_MB, \
        "resident memory grew by %.1f MB (from %.1f to %.1f MB)" % (end_rss - warm_rss, warm_rss, end_rss)
    hvd.shutdown()


main(body)
