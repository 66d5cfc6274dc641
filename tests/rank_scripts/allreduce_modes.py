"""Allreduce under PERSEUS_ALLREDUCE_DTYPE and PERSEUS_ALLREDUCE_MODE (set by
tests/mpi/test_hierarchical.py): every op, dtype and scaling, sizes that do not divide by
the ranks per node, alone and fused, on several lanes and on process sets.

Every result's bytes are compared across the ranks of its set (one allgather of the
bytes of every result of a dtype and op), and its values against a float64 reference
(common.reference_reduce) on one member, the members taking turns (the bytes being
the same on every member, the values are right on all). With a wire dtype,
float32/float64 results must lie within the bounds of that dtype and must show its
rounding somewhere (so the setting took effect); integers and 16-bit floats are exact
or within their own bounds, as without it.
"""
import torch

from common import (DTYPES, check_engine_settings, hvd, init, main, make_tensor, op_name, dtype_name,
                    reference_reduce)
from identical_results import Identical

OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
# Element counts: 1, fewer than the ranks per node, odd, and several MPI pieces.
SHAPES = [(1,), (3,), (37,), (5, 201), (70001,)]
SCALES = [(1.0, 1.0), (0.5, 4.0), (0.3, 1.7)]
WIRE = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def check_value(got, inputs, op, dtype, wire, prescale, postscale, what):
    travels = wire if wire is not None and dtype in (torch.float32, torch.float64) else dtype
    expected, bound = reference_reduce(inputs, op, travels, prescale, postscale)
    got = got.to(torch.float64) if dtype.is_floating_point else got.to(torch.int64)
    if bound is None:
        assert torch.equal(got, expected), "%s: integer result differs" % what
        return
    if op in (hvd.Min, hvd.Max):
        # A selection of prescaled inputs, each rounded once to the dtype it travels
        # in (and again on the way back) and scaled.
        eps = torch.finfo(travels).eps
        bound = 2 * eps * expected.abs() + 2 * eps * (abs(prescale) + abs(postscale))
        if travels == dtype and prescale == 1.0:
            bound = torch.zeros_like(bound)
    diff = (got - expected).abs()
    bad = ~(diff <= bound)
    assert not bad.any(), "%s: %d values off, first got %r expected %r (bound %r)" % (
        what, int(bad.sum()), got[bad][0].item(), expected[bad][0].item(), bound[bad][0].item())


def check_rounded(got, inputs, op, dtype, wire, what):
    """With a wire dtype a float32/float64 Sum shows its rounding: the result is not the
    one computed in the tensor's own dtype."""
    if wire is None or dtype not in (torch.float32, torch.float64) or op != hvd.Sum:
        return
    own = torch.stack([x.to(torch.float64) for x in inputs]).sum(0)
    diff = (got.to(torch.float64) - own).abs().max().item()
    assert diff > torch.finfo(dtype).eps * 64, "%s: exact result, so the wire dtype was not used" % what


class Turns:
    """Which member checks a result's values: every member's bytes are compared with
    the first member's, so the members take turns (each reference computed once per
    job, not on every rank)."""

    def __init__(self, me, size):
        self.me, self.size, self.count = me, size, 0

    def mine(self):
        self.count += 1
        return self.count % self.size == self.me


def exercise(rank, size, wire, tag, members=None, process_set=None):
    members = members or list(range(size))
    me = members.index(rank)
    kw_set = {} if process_set is None else {"process_set": process_set}
    turns = Turns(me, len(members))
    for dtype in DTYPES:
        for op in OPS:
            kind = "product" if op == hvd.Product else "sum"
            same = Identical(process_set)  # the bytes of every result of this dtype and op, in one allgather
            for pre, post in SCALES:
                if (pre, post) != (1.0, 1.0) and not dtype.is_floating_point:
                    continue
                name = "%s.%s.%s.%s" % (tag, dtype_name(dtype), op_name(op), pre)
                kw = dict(kw_set, prescale_factor=pre, postscale_factor=post) if pre != 1.0 else kw_set
                shapes = SHAPES if pre == 1.0 else SHAPES[2:4]
                for shape in shapes:
                    what = "%s.%s" % (name, "x".join(map(str, shape)))
                    got = hvd.allreduce(make_tensor(what, rank, shape, dtype, kind), name=what, op=op, **kw)
                    same.add(got, what)
                    if turns.mine():
                        xs = [make_tensor(what, r, shape, dtype, kind) for r in members]
                        check_value(got, xs, op, dtype, wire, pre, post, what)
                        if shape == (70001,):
                            check_rounded(got, xs, op, dtype, wire, what)
                what = name + ".group"
                mine = [make_tensor("%s.%d" % (what, i), rank, s, dtype, kind) for i, s in enumerate(shapes)]
                outs = hvd.grouped_allreduce(mine, name=what, op=op, **kw)
                for i, (got, s) in enumerate(zip(outs, shapes)):
                    same.add(got, "%s.%d" % (what, i))
                    if turns.mine():
                        xs = [make_tensor("%s.%d" % (what, i), r, s, dtype, kind) for r in members]
                        check_value(got, xs, op, dtype, wire, pre, post, "%s.%d" % (what, i))
            same.check("%s.%s.%s" % (tag, dtype_name(dtype), op_name(op)))


def concurrent(rank, size, wire):
    """Many tensors in flight at once: they spread over the lanes."""
    handles = []
    for i in range(24):
        name = "modes.concurrent.%d" % i
        x = make_tensor(name, rank, (1000 + 37 * i,), torch.float32)
        handles.append((name, hvd.allreduce_async(x, name=name, op=hvd.Sum)))
    same, turns = Identical(), Turns(rank, size)
    for i, (name, handle) in enumerate(handles):
        got = hvd.synchronize(handle)
        same.add(got, name)
        if turns.mine():
            xs = [make_tensor(name, r, (1000 + 37 * i,), torch.float32) for r in range(size)]
            check_value(got, xs, hvd.Sum, torch.float32, wire, 1.0, 1.0, name)
    same.check("modes.concurrent")


def body():
    rank, size = init()
    check_engine_settings()  # the test runs the np 4 settings in one process
    wire = WIRE[hvd.config()["PERSEUS_ALLREDUCE_DTYPE"]]
    exercise(rank, size, wire, "modes")
    concurrent(rank, size, wire)
    # Sets: all but the last rank (spans simulated nodes unevenly), and the even ranks.
    for members in ([r for r in range(size - 1)], list(range(0, size, 2))):
        if len(members) < 2:
            continue
        ps = hvd.add_process_set(members)
        if rank in members:
            exercise(rank, size, wire, "modes.set%s" % "".join(map(str, members)), members, ps)
        hvd.remove_process_set(ps)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
