"""In-place collectives and autograd; arguments of the wrong kind (issue 37, points 1, 5,
6 and 7), in the torch front end.

Every rank makes every call, the bad ones included, so each rank must raise at once;
a correct call right after, under the same name, must then give the value computed
here with plain torch: nothing of the refused call left the rank, and the engine
still works.

1. An in-place collective (hvd's allreduce_, broadcast_, their async and grouped
   forms, torch.distributed's all_reduce and broadcast, sync and async) bumps its
   tensor's version counter when it is submitted, as torch's own in-place ops do, so
   reducing a tensor autograd saved for backward makes backward() raise autograd's
   "modified by an inplace operation" error (the gradient was silently wrong). A leaf
   that requires grad, or a view of one, is refused by hvd's calls while grad mode is
   on, as torch's in-place ops refuse it, and reduced under torch.no_grad();
   torch.distributed's all_reduce and broadcast write it, as torch's collectives do
   (the version still moves); a tensor that requires
   grad but is not a leaf is reduced, autograd taking the collective as the identity.
   broadcast_parameters(model.named_parameters()) still takes root's parameters.
5. A float or a string as a root rank, a process set's rank or an alltoall split is a
   TypeError naming it (float splits also stay the ValueError/RuntimeError Horovod
   scripts catch); numpy integers, 0-d integer tensors and bools are integers.
6. A numpy array, list, float or None given to a collective is a TypeError saying
   that a torch.Tensor is expected.
7. A name that is not valid Unicode text (a lone surrogate) is a ValueError naming it.
"""
import numpy as np
import torch

from common import assert_equal, expect_raises, hvd, init, log, main, make_tensor

import perseus.torch.distributed as dist
from perseus.torch import mpi_ops  # grouped_broadcast_: a Perseus extension

INPLACE_ERROR = "modified by an inplace operation"


# ---------------------------------------------------------------- 1. in place

def _blocking(call):
    def submit(tensor, name):
        call(tensor, name)
        return lambda: None
    return submit


def _handle(call):
    def submit(tensor, name):
        handle = call(tensor, name)
        return lambda: hvd.synchronize(handle)
    return submit


def _work(call):
    def submit(tensor, name):
        return call(tensor, name).wait
    return submit


def _root(values):
    return values[0]


def inplace_ops():
    """(what, submit(tensor, name) -> wait, reference(every rank's value)) for every
    in-place collective: submit() returns once the call is submitted (a blocking call
    has then finished), wait() once it has finished."""
    def other():
        return torch.zeros(2)
    return [
        ("allreduce_", _blocking(lambda t, n: hvd.allreduce_(t, name=n, op=hvd.Sum)), sum),
        ("allreduce_async_", _handle(lambda t, n: hvd.allreduce_async_(t, name=n, op=hvd.Sum)),
         sum),
        ("grouped_allreduce_", _blocking(
            lambda t, n: hvd.grouped_allreduce_([other(), t], name=n, op=hvd.Sum)), sum),
        ("grouped_allreduce_async_", _handle(
            lambda t, n: hvd.grouped_allreduce_async_([t, other()], name=n, op=hvd.Sum)), sum),
        ("broadcast_", _blocking(lambda t, n: hvd.broadcast_(t, 0, name=n)), _root),
        ("broadcast_async_", _handle(lambda t, n: hvd.broadcast_async_(t, 0, name=n)), _root),
        ("grouped_broadcast_", _blocking(
            lambda t, n: mpi_ops.grouped_broadcast_([t, other()], 0, name=n)), _root),
        ("grouped_broadcast_async_", _handle(
            lambda t, n: mpi_ops.grouped_broadcast_async_([other(), t], 0, name=n)), _root),
        ("dist.all_reduce", _blocking(lambda t, n: dist.all_reduce(t)), sum),
        ("dist.all_reduce async", _work(lambda t, n: dist.all_reduce(t, async_op=True)), sum),
        ("dist.broadcast", _blocking(lambda t, n: dist.broadcast(t, 0)), _root),
        ("dist.broadcast async", _work(lambda t, n: dist.broadcast(t, src=0, async_op=True)),
         _root),
    ]


def base_values(size):
    """Rank r's tensor before the collective: (1, 2) * (r + 1)."""
    return [torch.tensor([1.0, 2.0]) * (r + 1) for r in range(size)]


def saved_for_backward_is_not_modified_silently(rank, size):
    values = base_values(size)
    for what, submit, reference in inplace_ops():
        # allreduce_ three times under one name: the third call reuses the packed request.
        for attempt in range(3 if what == "allreduce_" else 1):
            w = torch.tensor([1.0, 2.0], requires_grad=True)
            y = w * (rank + 1)
            z = (y * y).sum()  # saves y for backward
            before = y._version
            wait = submit(y, "ta.saved." + what)
            assert y._version > before, "%s did not bump the version at submission" % what
            wait()
            assert_equal(y.detach(), reference(values), what)
            expect_raises(RuntimeError, what + ": backward after it", z.backward,
                          contains=[INPLACE_ERROR])
    # Non-contiguous: reduced in a contiguous copy and written back; the view shares
    # its base's version counter.
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (w * (rank + 1)).repeat_interleave(2)[::2]
    assert not y.is_contiguous()
    z = (y * y).sum()
    hvd.allreduce_(y, name="ta.saved.view", op=hvd.Sum)
    assert_equal(y.detach(), sum(values), "allreduce_ of a strided view")
    expect_raises(RuntimeError, "backward after allreduce_ of a view", z.backward,
                  contains=[INPLACE_ERROR])


def leaves_are_refused_under_grad_mode(rank, size):
    values = base_values(size)
    for what, submit, reference in inplace_ops():
        name = "ta.leaf." + what
        leaf = values[rank].clone().requires_grad_()
        if what.startswith("dist."):  # as torch's collectives: written, the version moved
            before = leaf._version
            submit(leaf, name)()
            assert leaf.is_leaf and leaf.requires_grad and leaf._version > before, what
            assert_equal(leaf.detach(), reference(values), what + " of a leaf in grad mode")
            continue
        expect_raises(RuntimeError, what + " of a leaf", submit, leaf, name,
                      contains=["leaf Variable that requires grad"], within_s=5)
        expect_raises(RuntimeError, what + " of a view of a leaf", submit, leaf[:1], name,
                      contains=["view of a leaf Variable"], within_s=5)
        with torch.no_grad():  # as torch: allowed without grad mode
            before = leaf._version
            submit(leaf, name)()
        assert leaf.is_leaf and leaf.requires_grad and leaf._version > before, what
        assert_equal(leaf.detach(), reference(values), what + " of a leaf under no_grad")
    # A tensor that requires grad but is not a leaf is reduced; autograd takes the
    # in-place collective as the identity (as Horovod and torch.distributed do).
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    y = w * (rank + 1)
    hvd.allreduce_(y, name="ta.nonleaf", op=hvd.Sum)
    assert_equal(y.detach(), sum(values), "allreduce_ of a non-leaf")
    (y * torch.tensor([3.0, 5.0])).sum().backward()
    assert_equal(w.grad, torch.tensor([3.0, 5.0]) * (rank + 1), "gradient through allreduce_")


def broadcast_parameters_in_grad_mode(rank, size):
    """broadcast_parameters(model.named_parameters()) takes the parameters (leaves that
    require grad) in grad mode, as in Horovod. (With broadcast_optimizer_state and
    DistributedOptimizer's own in-place reductions it is checked against plain torch
    in tests/rank_scripts/broadcast_state.py and optimizer*.py, which test_training_api.py runs.)"""
    torch.manual_seed(100 + rank)  # every rank starts elsewhere
    model = torch.nn.Linear(4, 3)
    torch.manual_seed(100)
    reference = torch.nn.Linear(4, 3)  # rank 0's start
    assert torch.is_grad_enabled() and model.weight.requires_grad and model.weight.is_leaf
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.is_leaf and p.requires_grad, name
        assert_equal(p.detach(), q.detach(), "broadcast_parameters: " + name)


# ---------------------------------------------------------------- 5. integers

def integer_arguments(rank, size):
    xs = [make_tensor("ta.root", r, (3,), torch.float32) for r in range(size)]
    roots = [  # (what, call(root), the argument the error must name)
        ("broadcast", lambda r: hvd.broadcast(xs[rank], r, name="ta.root"), "root_rank"),
        ("broadcast (requires grad)",
         lambda r: hvd.broadcast(xs[rank].clone().requires_grad_(), r, name="ta.root"),
         "root_rank"),
        ("broadcast_", lambda r: hvd.broadcast_(xs[rank].clone(), r, name="ta.root"), "root_rank"),
        ("broadcast_async", lambda r: hvd.broadcast_async(xs[rank], r, name="ta.root"),
         "root_rank"),
        ("broadcast_async_", lambda r: hvd.broadcast_async_(xs[rank].clone(), r, name="ta.root"),
         "root_rank"),
        ("broadcast_object", lambda r: hvd.broadcast_object(rank, root_rank=r), "root_rank"),
        ("dist.broadcast", lambda r: dist.broadcast(xs[rank].clone(), r), "src"),
        ("dist.broadcast group_src", lambda r: dist.broadcast(xs[rank].clone(), group_src=r),
         "group_src"),
    ]
    for bad in (1.5, 0.9, "1", float(size - 1), np.float64(0.0), torch.tensor(0.0)):
        for what, call, argument in roots:
            expect_raises(TypeError, "%s(%r)" % (what, bad), call, bad,
                          contains=[argument, type(bad).__name__], within_s=5)
    for root in (size - 1, np.int64(size - 1), np.int32(0), True, torch.tensor(size - 1)):
        assert_equal(hvd.broadcast(xs[rank], root, name="ta.root"), xs[int(root)],
                     "broadcast from root %r" % (root,))
    assert hvd.broadcast_object(rank * 10, root_rank=np.int64(size - 1)) == (size - 1) * 10

    for bad in ([0, 1.5], [0.0, 1.0], ["0", "1"], [0, None], [np.float32(1.0)]):
        for what, call in (("add_process_set", hvd.add_process_set), ("ProcessSet", hvd.ProcessSet),
                           ("dist.new_group", dist.new_group)):
            expect_raises(TypeError, "%s(%r)" % (what, bad), call, bad, contains=["rank"],
                          within_s=5)
    assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {0: list(range(size))}
    # numpy integers are integers: the set of ranks 1 .. size - 1.
    others = hvd.add_process_set([np.int64(size - 1)] + [np.int32(r) for r in range(1, size - 1)])
    assert others.ranks == list(range(1, size)), others.ranks
    if rank > 0:
        out = hvd.allreduce(xs[rank], name="ta.others", op=hvd.Sum, process_set=others)
        assert_equal(out, sum(xs[1:]), "allreduce on the set added with numpy ranks")
    hvd.remove_process_set(others)

    rows = make_tensor("ta.a2a", rank, (2 * size, 3), torch.float32)
    for bad in ([2.0] * size, [2] * (size - 1) + [2.5], ["2"] * size, np.full(size, 2.0),
                torch.full((size,), 2.0)):
        e = expect_raises(TypeError, "alltoall splits %r" % (bad,), hvd.alltoall, rows,
                          splits=bad, name="ta.a2a", contains=["split"], within_s=5)
        # What Horovod raises for float splits, so its scripts' except clauses still catch it.
        assert isinstance(e, ValueError) and isinstance(e, RuntimeError), type(e)
    out, received = hvd.alltoall(rows, splits=[np.int64(2)] * size, name="ta.a2a")
    expected = torch.cat([make_tensor("ta.a2a", r, (2 * size, 3), torch.float32)
                          [2 * rank:2 * rank + 2] for r in range(size)])
    assert_equal(out, expected, "alltoall with numpy integer splits")
    assert received.tolist() == [2] * size


# ---------------------------------------------------------------- 6. not a tensor

def non_tensors(rank, size):
    """(what, call(value), name of a correct call to make afterwards)."""
    one = torch.ones(2)
    calls = [
        ("allreduce", lambda v: hvd.allreduce(v, name="ta.nt.ar")),
        ("allreduce fp16", lambda v: hvd.allreduce(v, name="ta.nt.ar",
                                                   compression=hvd.Compression.fp16)),
        ("allreduce_", lambda v: hvd.allreduce_(v, name="ta.nt.ar")),
        ("allreduce_async", lambda v: hvd.allreduce_async(v, name="ta.nt.ar")),
        ("allreduce_async_", lambda v: hvd.allreduce_async_(v, name="ta.nt.ar")),
        ("grouped_allreduce", lambda v: hvd.grouped_allreduce([one, v], name="ta.nt.ar")),
        ("grouped_allreduce_", lambda v: hvd.grouped_allreduce_([one.clone(), v], name="ta.nt.ar")),
        ("grouped_allreduce_async", lambda v: hvd.grouped_allreduce_async([v], name="ta.nt.ar")),
        ("allgather", lambda v: hvd.allgather(v, name="ta.nt.ag")),
        ("allgather_async", lambda v: hvd.allgather_async(v, name="ta.nt.ag")),
        ("grouped_allgather", lambda v: hvd.grouped_allgather([one, v], name="ta.nt.ag")),
        ("broadcast", lambda v: hvd.broadcast(v, 0, name="ta.nt.bc")),
        ("broadcast_", lambda v: hvd.broadcast_(v, 0, name="ta.nt.bc")),
        ("broadcast_async", lambda v: hvd.broadcast_async(v, 0, name="ta.nt.bc")),
        ("broadcast_async_", lambda v: hvd.broadcast_async_(v, 0, name="ta.nt.bc")),
        ("grouped_broadcast_", lambda v: mpi_ops.grouped_broadcast_([v, one], 0, name="ta.nt.bc")),
        ("alltoall", lambda v: hvd.alltoall(v, name="ta.nt.a2a")),
        ("alltoall_async", lambda v: hvd.alltoall_async(v, name="ta.nt.a2a")),
        ("reducescatter", lambda v: hvd.reducescatter(v, name="ta.nt.rs")),
        ("reducescatter_async", lambda v: hvd.reducescatter_async(v, name="ta.nt.rs")),
        ("grouped_reducescatter", lambda v: hvd.grouped_reducescatter([v], name="ta.nt.rs")),
        ("sparse_allreduce_async", lambda v: hvd.sparse_allreduce_async(v, "ta.nt.sp", hvd.Sum)),
        ("dist.all_reduce", lambda v: dist.all_reduce(v)),
        ("dist.broadcast", lambda v: dist.broadcast(v, 0)),
        ("dist.all_gather", lambda v: dist.all_gather([torch.ones(2) for _ in range(size)], v)),
        ("dist.all_gather_into_tensor", lambda v: dist.all_gather_into_tensor(v, one)),
        ("dist.reduce_scatter_tensor", lambda v: dist.reduce_scatter_tensor(one, v)),
        ("dist.all_to_all_single", lambda v: dist.all_to_all_single(v, one)),
    ]
    for value in (np.ones(2, dtype=np.float32), [1.0, 2.0], 1.0, None):
        for what, call in calls:
            expect_raises(TypeError, "%s(%s)" % (what, type(value).__name__), call, value,
                          contains=["torch.Tensor", type(value).__name__], within_s=5)
    xs = [make_tensor("ta.nt", r, (2 * size,), torch.float32, "exact") for r in range(size)]
    assert_equal(hvd.allreduce(xs[rank], name="ta.nt.ar", op=hvd.Sum), sum(xs), "allreduce after")
    assert_equal(hvd.allgather(xs[rank], name="ta.nt.ag"), torch.cat(xs), "allgather after")
    assert_equal(hvd.broadcast(xs[rank], 0, name="ta.nt.bc"), xs[0], "broadcast after")
    assert_equal(hvd.alltoall(xs[rank], name="ta.nt.a2a"),
                 torch.cat([x[2 * rank:2 * rank + 2] for x in xs]), "alltoall after")
    assert_equal(hvd.reducescatter(xs[rank], name="ta.nt.rs", op=hvd.Sum),
                 sum(xs)[2 * rank:2 * rank + 2], "reducescatter after")


# ---------------------------------------------------------------- 7. names

def names_that_are_not_text(rank, size):
    bad = "a\udc80b"
    xs = [make_tensor("ta.name", r, (2 * size,), torch.float32, "exact") for r in range(size)]
    calls = [
        ("allreduce", lambda: hvd.allreduce(xs[rank], name=bad)),
        ("allreduce_", lambda: hvd.allreduce_(xs[rank].clone(), name=bad)),
        ("allreduce_async_", lambda: hvd.allreduce_async_(xs[rank].clone(), name=bad)),
        ("grouped_allreduce", lambda: hvd.grouped_allreduce([xs[rank]], name=bad)),
        ("allgather", lambda: hvd.allgather(xs[rank], name=bad)),
        ("broadcast_", lambda: hvd.broadcast_(xs[rank].clone(), 0, name=bad)),
        ("alltoall", lambda: hvd.alltoall(xs[rank], name=bad)),
        ("reducescatter", lambda: hvd.reducescatter(xs[rank], name=bad)),
        ("broadcast_object", lambda: hvd.broadcast_object(rank, 0, name=bad)),
        ("allgather_object", lambda: hvd.allgather_object(rank, name=bad)),
    ]
    for what, call in calls:
        for attempt in range(3):  # allreduce_'s second and third calls take its packed path
            expect_raises(ValueError, what, call, contains=["name", repr(bad)[1:-1]], within_s=5)
    good = "a\u00e9b"  # not ASCII, but text
    assert_equal(hvd.allreduce(xs[rank], name=good, op=hvd.Sum), sum(xs), "allreduce after")
    assert hvd.broadcast_object(rank, 0, name=good) == 0


def body():
    rank, size = init()
    dist.init_process_group()
    for check in (saved_for_backward_is_not_modified_silently, leaves_are_refused_under_grad_mode,
                  broadcast_parameters_in_grad_mode, integer_arguments, non_tensors,
                  names_that_are_not_text):
        check(rank, size)
        log(check.__name__, "ok")
    hvd.shutdown()


main(body)
