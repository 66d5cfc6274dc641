"""Bad input: non-contiguous tensors, and arguments that must fail on the calling rank.

1. Non-contiguous inputs (transposes, strided views, slices) give correct results for
   every collective; in-place ops write the result back into the caller's view and
   leave the rest of its base tensor alone; out-of-place ops leave the input alone.
2. Unsupported dtypes, broadcast roots out of range (or outside the process set),
   alltoall splits that do not fit the tensor, a process set this rank is not in, and
   an in-place op on an expanded tensor raise ValueError on the calling rank at once.
   Only the last rank makes these calls. Then every rank runs a correct request under
   each of the same names: had anything been enqueued or sent, that name would still
   be in flight on the culprit or would not match, so this proves nothing left the
   rank and the engine kept working. A set this rank is not in is refused with the
   core's own message (its one owner), as a raw perseus_enqueue gives it.
"""
import numpy as np
import torch

from perseus.common import builder, library, ops

from common import (assert_equal, assert_reduced, assert_unchanged, expect_raises, hvd, init,
                    main, make_tensor, split_rows)


def noncontiguous(rank, size):
    # allreduce, out of place, of a transpose.
    xs = [make_tensor("bi.t", r, (4, 6), torch.float32, "exact") for r in range(size)]
    arg = xs[rank].t()
    assert not arg.is_contiguous()
    before = arg.clone()
    out = hvd.allreduce(arg, name="bi.t", op=hvd.Sum)
    assert_reduced(out, [x.t() for x in xs], hvd.Sum, torch.float32, "allreduce of a transpose", exact=True)
    assert_unchanged(arg, before, "allreduce of a transpose")

    # allreduce_ in place on a strided view: the view gets the result, the rest stays.
    for dtype in (torch.float64, torch.int32):
        bases = [make_tensor("bi.view.%s" % dtype, r, (5, 6), dtype, "exact") for r in range(size)]
        base = bases[rank].clone()
        view = base[:, 1::2]
        returned = hvd.allreduce_(view, name="bi.view.%s" % dtype, op=hvd.Sum)
        assert returned is view, "allreduce_ must return the caller's tensor"
        assert_reduced(view, [b[:, 1::2] for b in bases], hvd.Sum, dtype, "allreduce_ of a view", exact=True)
        assert_equal(base[:, 0::2], bases[rank][:, 0::2], "columns outside the view")

    # allreduce_async_ and grouped_allreduce_ on views.
    bases = [make_tensor("bi.async", r, (6, 4), torch.float32, "exact") for r in range(size)]
    base = bases[rank].clone()
    handle = hvd.allreduce_async_(base[1:5, 2], name="bi.async", op=hvd.Sum)
    hvd.synchronize(handle)
    assert_reduced(base[1:5, 2], [b[1:5, 2] for b in bases], hvd.Sum, torch.float32, "allreduce_async_", exact=True)
    assert_equal(base[:, :2], bases[rank][:, :2], "columns outside the async view")
    base = bases[rank].clone()
    views = [base[:, 0], base.t()[1:3]]
    hvd.grouped_allreduce_(views, name="bi.grouped", op=hvd.Max)
    assert_reduced(views[0], [b[:, 0] for b in bases], hvd.Max, torch.float32, "grouped_allreduce_ [0]")
    assert_reduced(views[1], [b.t()[1:3] for b in bases], hvd.Max, torch.float32, "grouped_allreduce_ [1]")

    # broadcast_ in place on a view, from the last rank.
    bases = [make_tensor("bi.bc", r, (4, 4), torch.int64) for r in range(size)]
    base = bases[rank].clone()
    hvd.broadcast_(base.t()[::2], size - 1, name="bi.bc")
    assert_equal(base.t()[::2], bases[size - 1].t()[::2], "broadcast_ of a view")
    assert_equal(base.t()[1::2], bases[rank].t()[1::2], "rows outside the broadcast view")
    assert_equal(hvd.broadcast(bases[rank].t(), 0, name="bi.bc.out"), bases[0].t(), "broadcast of a transpose")

    # allgather, alltoall and reducescatter of non-contiguous inputs.
    xs = [make_tensor("bi.ag", r, (3, r + 1), torch.float16) for r in range(size)]
    assert_equal(hvd.allgather(xs[rank].t(), name="bi.ag"), torch.cat([x.t() for x in xs]), "allgather of a transpose")
    xs = [make_tensor("bi.a2a", r, (2 * size, 3), torch.int16, "exact") for r in range(size)]
    out = hvd.alltoall(xs[rank][::2], name="bi.a2a")
    assert_equal(out, torch.cat([x[::2][rank:rank + 1] for x in xs]), "alltoall of a strided slice")
    xs = [make_tensor("bi.rs", r, (3, 2 * size + 1), torch.float64, "exact") for r in range(size)]
    rows = split_rows(2 * size + 1, size)
    start = sum(rows[:rank])
    out = hvd.reducescatter(xs[rank].t(), name="bi.rs", op=hvd.Sum)
    assert_reduced(out, [x.t()[start:start + rows[rank]] for x in xs], hvd.Sum, torch.float64,
                   "reducescatter of a transpose", exact=True)


def bad_calls(size, outside):
    """(name, call, words the message must contain). `outside`: a set without this rank."""
    f32 = torch.ones(2 * size)
    complex64 = torch.ones(2 * size, dtype=torch.complex64)
    return [
        ("bi.bad.ar", lambda n: hvd.allreduce(complex64, name=n), ["complex64"]),
        ("bi.bad.ar_", lambda n: hvd.allreduce_(torch.ones(3, dtype=torch.uint32), name=n), ["uint32"]),
        ("bi.bad.gar", lambda n: hvd.grouped_allreduce([f32, complex64], name=n), ["complex64"]),
        ("bi.bad.ag", lambda n: hvd.allgather(complex64, name=n), ["complex64"]),
        ("bi.bad.bc", lambda n: hvd.broadcast(complex64, 0, name=n), ["complex64"]),
        ("bi.bad.a2a", lambda n: hvd.alltoall(complex64, name=n), ["complex64"]),
        ("bi.bad.rs", lambda n: hvd.reducescatter(complex64, name=n), ["complex64"]),
        ("bi.root.bc", lambda n: hvd.broadcast(f32, size, name=n), ["root", str(size)]),
        ("bi.root_neg.bc", lambda n: hvd.broadcast_(f32.clone(), -1, name=n), ["root", "-1"]),
        ("bi.root_async.bc", lambda n: hvd.broadcast_async(f32, size + 3, name=n), ["root"]),
        ("bi.root_set.bc", lambda n: hvd.broadcast(f32, size - 1, name=n, process_set=outside),
         ["root_rank", str(size - 1)]),
        ("bi.splits_sum.a2a", lambda n: hvd.alltoall(f32, splits=[1] * size, name=n), ["sum to"]),
        ("bi.splits_len.a2a", lambda n: hvd.alltoall(f32, splits=[2 * size], name=n), ["one per rank"]),
        ("bi.splits_neg.a2a", lambda n: hvd.alltoall(f32, splits=[-1, 2 * size + 1] + [0] * (size - 2), name=n),
         ["non-negative"]),
        ("bi.member.ar", lambda n: hvd.allreduce(f32, name=n, process_set=outside), ["not a member"]),
        ("bi.member.ag", lambda n: hvd.allgather(f32, name=n, process_set=outside), ["not a member"]),
        ("bi.member.bc", lambda n: hvd.broadcast(f32, 0, name=n, process_set=outside), ["not a member"]),
        ("bi.member.a2a", lambda n: hvd.alltoall(f32, name=n, process_set=outside), ["not a member"]),
        ("bi.member.rs", lambda n: hvd.reducescatter(f32, name=n, process_set=outside), ["not a member"]),
        ("bi.expanded.ar_", lambda n: hvd.allreduce_(torch.ones(1).expand(4), name=n), ["clone()"]),
    ]


def run_correctly(name, rank, size):
    """Every rank: a correct request of the same collective under `name`."""
    kind = name.rsplit(".", 1)[1]
    xs = [make_tensor(name, r, (2 * size, 3), torch.float32, "exact") for r in range(size)]
    what = "%s afterwards" % name
    if kind in ("ar", "ar_"):
        assert_reduced(hvd.allreduce(xs[rank], name=name, op=hvd.Sum), xs, hvd.Sum, torch.float32, what, exact=True)
    elif kind == "gar":
        outs = hvd.grouped_allreduce([xs[rank], xs[rank]], name=name, op=hvd.Sum)
        for out in outs:
            assert_reduced(out, xs, hvd.Sum, torch.float32, what, exact=True)
    elif kind == "ag":
        assert_equal(hvd.allgather(xs[rank], name=name), torch.cat(xs), what)
    elif kind == "bc":
        assert_equal(hvd.broadcast(xs[rank], 0, name=name), xs[0], what)
    elif kind == "a2a":
        out = hvd.alltoall(xs[rank], name=name)
        assert_equal(out, torch.cat([x[2 * rank:2 * rank + 2] for x in xs]), what)
    elif kind == "rs":
        out = hvd.reducescatter(xs[rank], name=name, op=hvd.Sum)
        assert_reduced(out, [x[2 * rank:2 * rank + 2] for x in xs], hvd.Sum, torch.float32, what, exact=True)
    else:
        raise AssertionError("no correct request for " + name)


def core_member_refusal(process_set):
    """What perseus_enqueue says, raw (no front end's check before it), of an
    allreduce on `process_set` from a rank that is not in it; nothing is enqueued."""
    data = np.zeros(4, dtype=np.float32)
    request = builder.Request(ops.ALLREDUCE, process_set.process_set_id, ops.FLOAT32, (4,),
                              data.ctypes.data, data.ctypes.data, b"bi.member.raw")
    buf, n = builder.pack([request])
    base = buf.buffer_info()[0]
    assert library.perseus_enqueue(base + 8 * n, n, base), "perseus_enqueue took it"
    return library.perseus_last_error().decode()


def body():
    rank, size = init()
    noncontiguous(rank, size)

    culprit = size - 1
    outside = hvd.add_process_set(list(range(size - 1)))  # every rank but the culprit
    calls = bad_calls(size, outside)
    if rank == culprit:
        member = core_member_refusal(outside)
        assert "not a member" in member, member
        calls = [(name, call, [member] if ".member." in name else words)
                 for name, call, words in calls]
        for name, call, words in calls:
            expect_raises(ValueError, name, call, name, contains=words, within_s=5)
    for name, _, _ in calls:
        run_correctly(name, rank, size)
    # The set the culprit is not in still works for its members.
    if rank != culprit:
        xs = [make_tensor("bi.outside", r, (3,), torch.float32, "exact") for r in range(size - 1)]
        assert_reduced(hvd.allreduce(xs[rank], name="bi.outside", op=hvd.Sum, process_set=outside),
                       xs, hvd.Sum, torch.float32, "allreduce on the set without the culprit", exact=True)
    hvd.shutdown()


main(body)
