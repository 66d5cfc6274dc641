"""Every rank ends an allreduce with the same bits, NaN, Inf and -0.0 included.

Inputs hold NaNs (both signs, several payloads), infinities and zeros of both signs
at positions that differ by rank. For every op, float dtype and shape, alone and
fused in a group, with and without scaling, the result bytes are compared across
ranks (one allgather of the bytes of every result of a dtype and op) and the values
against a float64 reference in which NaN propagates, as in numpy and torch (Max/Min
of anything and NaN is NaN). The bytes being the same on every rank, each result's
values are checked on one rank, the ranks taking turns (the references' cost spread
over the ranks instead of repeated on each).
Adasum is checked across ranks only. tests/mpi/test_multiprocess.py runs it at several
sizes, lane counts and chunk sizes, which change the MPI algorithms underneath.
"""
import torch

from common import FLOAT_DTYPES, check_engine_settings, dtype_name, hvd, init, main, make_tensor, \
    op_name, reference_reduce, seed_of

SHAPES = [(1,), (37,), (3, 1000), (70001,)]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
# (bits dtype, exponent mask, sign bit) of each float dtype.
LAYOUT = {torch.float16: (torch.int16, 0x7C00, 0x8000),
          torch.bfloat16: (torch.int16, 0x7F80, 0x8000),
          torch.float32: (torch.int32, 0x7F800000, 1 << 31),
          torch.float64: (torch.int64, 0x7FF0000000000000, 1 << 63)}


def specials(tag, rank, shape, dtype, kind):
    """make_tensor's input with NaNs (random sign and payload), infinities and signed
    zeros sprinkled in; a pure function of its arguments."""
    x = make_tensor(tag, rank, shape, dtype, kind).flatten()
    g = torch.Generator().manual_seed(seed_of(tag + "|specials", rank))
    n = x.numel()
    what = torch.randint(0, 20, (n,), generator=g)  # 0: NaN, 1: Inf, 2-3: zero, else keep
    negative = torch.randint(0, 2, (n,), generator=g).bool()
    bits_dtype, exponent, sign = LAYOUT[dtype]
    width = torch.iinfo(bits_dtype).bits
    mantissa_bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}[dtype]
    payload = torch.randint(1, 1 << min(mantissa_bits, 30), (n,), generator=g, dtype=torch.int64)
    nan_bits = (exponent | payload).to(torch.int64)
    sign_bits = torch.where(negative, torch.tensor(sign, dtype=torch.int64) if width < 64
                            else torch.tensor(-(1 << 63), dtype=torch.int64), torch.tensor(0))
    nan_bits = nan_bits | sign_bits
    if width < 64:  # into the signed range of the bits dtype
        nan_bits = torch.where(nan_bits >= (1 << (width - 1)), nan_bits - (1 << width), nan_bits)
    nans = nan_bits.to(bits_dtype).view(dtype)
    infs = torch.where(negative, -torch.inf, torch.inf).to(dtype)
    zeros = torch.where(negative, -0.0, 0.0).to(dtype)
    x = torch.where(what == 0, nans, x)
    x = torch.where(what == 1, infs, x)
    x = torch.where((what == 2) | (what == 3), zeros, x)
    return x.reshape(shape)


def check_value(got, inputs, op, dtype, what, prescale, postscale):
    if op in (hvd.Min, hvd.Max):  # a selection of prescaled inputs, each rounded to dtype
        inputs = [(x.to(torch.float64) * prescale).to(dtype) for x in inputs]
        prescale = 1.0
    expected, bound = reference_reduce(inputs, op, dtype, prescale, postscale)
    got = got.to(torch.float64)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan), "%s: NaN at %s, expected at %s" % (
        what, got.isnan().nonzero()[:5].flatten().tolist(), nan.nonzero()[:5].flatten().tolist())
    inf = expected.isinf()
    assert torch.equal(got[inf], expected[inf]), "%s: infinities differ" % what
    finite = ~nan & ~inf
    diff = (got[finite] - expected[finite]).abs()
    bad = ~(diff <= bound[finite])
    assert not bad.any(), "%s: %d finite values off, first got %r expected %r" % (
        what, int(bad.sum()), got[finite][bad][0].item(), expected[finite][bad][0].item())


class Identical:
    """Results whose bytes must be the same on every rank (of the process set), compared
    in one allgather:
    add() each, then check() (one synchronous round trip instead of one per result);
    a difference names the result, the rank and the first element that differs."""

    def __init__(self, process_set=None):
        self.items = []
        self.kw = {} if process_set is None else {"process_set": process_set}

    def add(self, got, what):
        self.items.append((got.contiguous().flatten().view(torch.uint8), got.element_size(), what))

    def check(self, name):
        items, self.items = self.items, []
        if not items:
            return
        mine = torch.cat([b for b, _, _ in items])
        every = hvd.allgather(mine.unsqueeze(0), name="identical.bytes." + name, **self.kw)
        if torch.equal(every, mine.unsqueeze(0).expand_as(every)):
            return
        offset = 0
        for b, esize, what in items:
            part = every[:, offset:offset + b.numel()]
            offset += b.numel()
            for r in range(1, part.shape[0]):
                differ = (part[r] != part[0]).nonzero()
                if differ.numel():
                    i = int(differ[0]) // esize
                    theirs = bytes(part[r][i * esize:(i + 1) * esize].tolist())[::-1].hex()
                    first = bytes(part[0][i * esize:(i + 1) * esize].tolist())[::-1].hex()
                    raise AssertionError("%s: member %d differs from member 0 at element %d: 0x%s vs 0x%s"
                                         % (what, r, i, theirs, first))
        raise AssertionError("%s: results differ across ranks" % name)


def body():
    rank, size = init()
    check_engine_settings()  # the test runs two settings in one process
    turn = 0  # results in turn: each rank checks the values of every size-th one
    for dtype in FLOAT_DTYPES:
        for op in OPS + [hvd.Adasum]:
            kind = "product" if op == hvd.Product else "sum"
            same = Identical()  # the bytes of every result of this dtype and op, in one allgather
            for scale in [(1.0, 1.0), (0.5, 4.0), (0.3, 1.7)]:
                if scale[0] == 0.3 and op in (hvd.Min, hvd.Max):
                    continue  # a non-power-of-two scale rounds: only the exact ones for selections
                tag = "id.%s.%s.%s" % (dtype_name(dtype), op_name(op), scale[0])
                kw = dict(prescale_factor=scale[0], postscale_factor=scale[1])
                # Alone, each shape.
                for shape in SHAPES:
                    what = "%s.%s" % (tag, "x".join(map(str, shape)))
                    got = hvd.allreduce(specials(what, rank, shape, dtype, kind), name=what, op=op, **kw)
                    same.add(got, what)
                    turn += 1
                    if op != hvd.Adasum and turn % size == rank:
                        inputs = [specials(what, r, shape, dtype, kind) for r in range(size)]
                        check_value(got, inputs, op, dtype, what, *scale)
                # Fused: every shape in one group.
                what = tag + ".group"
                mine = [specials("%s.%d" % (what, i), rank, s, dtype, kind) for i, s in enumerate(SHAPES)]
                outs = hvd.grouped_allreduce(mine, name=what, op=op, **kw)
                for i, (got, s) in enumerate(zip(outs, SHAPES)):
                    same.add(got, "%s.%d" % (what, i))
                    turn += 1
                    if op != hvd.Adasum and turn % size == rank:
                        xs = [specials("%s.%d" % (what, i), r, s, dtype, kind) for r in range(size)]
                        check_value(got, xs, op, dtype, "%s.%d" % (what, i), *scale)
            # Every rank's bytes equal rank 0's, so each value checked on one rank holds on all.
            same.check("id.%s.%s" % (dtype_name(dtype), op_name(op)))
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
