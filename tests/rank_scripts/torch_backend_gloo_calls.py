"""The "perseus" torch backend's calls that only gloo had among CPU backends (issue 48,
part 2): each as gloo does it, so that a script written for gloo runs (the same
results, the same kind of error, gloo's words where a script may look for them).
Results against references computed here with plain torch from every rank's input.

1. all_gather_coalesced: torch's cases (inputs of 1 to 3 dims, float and complex, empty
   ones among them), int64, async (the future holds the output lists, as gloo's) and a
   group; wrong output lists raise a RuntimeError before anything is sent, and ranks
   whose shapes differ fail on every rank, and the next call works.
2. all_reduce of a sparse COO tensor (SUM): sparse and dense dimensions, duplicate
   entries, a rank without entries, int64, async; the result coalesced, in place.
   Other ops, CSR tensors and sizes that differ raise. (DDP with a sparse embedding:
   torch_backend.py, where DDP is built anyway; its first build takes seconds.)
3. monitored_barrier: passes when all come; a rank that does not is named by rank 0
   (the first; every one with wait_all_ranks), the others say they reached it; a
   missing rank 0 is named too. After the timeout, within a probe (half a second).
4. barrier() alone in a new_group(timeout=1 s) raises after the timeout, soon, naming
   the ranks that did not come (the default group's: torch_backend_faults.py).
"""
import datetime
import time
import warnings

import torch
import torch.distributed as dist

from common import expect_raises, launcher_rank_size, log, main

import perseus.torch  # noqa: F401 - registers the backend

RANK, SIZE = launcher_rank_size()


def same(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape and \
        torch.equal(got, expected), "%s: got %s, expected %s" % (what, got, expected)


# ---------------------------------------------------------------- 1. all_gather_coalesced

def inputs_of(rank, count, dtype):
    """torch's test_all_gather_coalesced_* inputs: tensor k (1..count-1) has k dims of
    size k, filled with rank + k."""
    return [torch.full([k] * k, float(rank + k), dtype=dtype) for k in range(1, count)]


def check_all_gather_coalesced():
    warnings.simplefilter("ignore")  # all_gather_coalesced is deprecated in torch
    for dtype in (torch.float32, torch.cfloat):
        for count in range(2, 5):
            outputs = [[torch.full_like(t, -1) for t in inputs_of(0, count, dtype)]
                       for _ in range(SIZE)]
            dist.all_gather_coalesced(outputs, inputs_of(RANK, count, dtype))
            for r in range(SIZE):
                for got, expected in zip(outputs[r], inputs_of(r, count, dtype)):
                    same(got, expected, "all_gather_coalesced %s from rank %d" % (dtype, r))
    # torch's with_empty case, and int64
    mine = [RANK * torch.ones(2, 2), torch.ones(0), (RANK + 1) * torch.ones(3, 3), torch.ones(0)]
    outputs = [[-torch.ones_like(t) for t in mine] for _ in range(SIZE)]
    dist.all_gather_coalesced(outputs, mine)
    for r in range(SIZE):
        for got, expected in zip(outputs[r], [r * torch.ones(2, 2), torch.ones(0),
                                              (r + 1) * torch.ones(3, 3), torch.ones(0)]):
            same(got, expected, "all_gather_coalesced with empty inputs, rank %d" % r)
    outputs = [[torch.zeros(2, dtype=torch.int64)] for _ in range(SIZE)]
    future = dist.all_gather_coalesced(outputs, [torch.tensor([RANK, 7])], async_op=True)
    value = future.wait()
    assert value is not None and len(value) == SIZE and value[SIZE - 1][0] is outputs[SIZE - 1][0]
    same(torch.stack([o[0] for o in outputs]), torch.tensor([[r, 7] for r in range(SIZE)]),
         "all_gather_coalesced async int64")
    pair = [0, SIZE - 1]
    group = dist.new_group(pair)
    if RANK in pair:
        outputs = [[torch.zeros(3)] for _ in pair]
        dist.all_gather_coalesced(outputs, [torch.full((3,), float(RANK))], group=group)
        same(torch.stack([o[0] for o in outputs]),
             torch.tensor([[float(r)] * 3 for r in pair]), "all_gather_coalesced in %s" % pair)
    # gloo's checks: a RuntimeError before anything is sent (the call takes no turn)
    expect_raises(RuntimeError, "all_gather_coalesced, a list short", dist.all_gather_coalesced,
                  [[torch.zeros(2)]] * (SIZE - 1), [torch.zeros(2)], contains=["one per rank"])
    expect_raises(RuntimeError, "all_gather_coalesced, an output's shape",
                  dist.all_gather_coalesced, [[torch.zeros(2, 1)] for _ in range(SIZE)],
                  [torch.zeros(2)], contains=["shape (2, 1)"])
    # ranks whose shapes differ (gloo: wrong values, or an abort): an error everywhere
    n = 2 + (RANK == 0)
    expect_raises(RuntimeError, "all_gather_coalesced of shapes that differ",
                  dist.all_gather_coalesced, [[torch.zeros(n)] for _ in range(SIZE)],
                  [torch.zeros(n)], contains=["shape"])
    outputs = [[torch.zeros(1)] for _ in range(SIZE)]
    dist.all_gather_coalesced(outputs, [torch.tensor([RANK + 0.5])])
    same(torch.cat([o[0] for o in outputs]), torch.arange(SIZE) + 0.5, "after the errors")
    log("all_gather_coalesced: ok")


# ---------------------------------------------------------------- 2. sparse all_reduce

def sparse_of(rank, sparse_dims=1, dense_dims=0):
    """torch's simple_sparse_reduce_tests input: entries 0..rank of the first sparse
    dimension (the others 0), values one."""
    indices = torch.cat([torch.arange(rank + 1).view(1, -1)] +
                        [torch.zeros(1, rank + 1, dtype=torch.int64)] * (sparse_dims - 1))
    shape = [SIZE] * sparse_dims + [2] * dense_dims
    return torch.sparse_coo_tensor(indices, torch.ones([rank + 1] + [2] * dense_dims), shape)


def total(make):
    """The sum of every rank's make(rank), here."""
    result = make(0)
    for r in range(1, SIZE):
        result = result + make(r)
    return result


def sparse_same(got, expected, what):
    expected = expected.coalesce()
    assert got.layout == torch.sparse_coo and got.is_coalesced(), "%s: not coalesced" % what
    same(got.indices(), expected.indices(), what + " (indices)")
    same(got.values(), expected.values(), what + " (values)")
    assert got.shape == expected.shape, what


def check_sparse_all_reduce():
    cases = {"sparse dims %d" % d: (lambda r, d=d: sparse_of(r, sparse_dims=d)) for d in (1, 2, 3)}
    cases.update({"dense dims %d" % d: (lambda r, d=d: sparse_of(r, dense_dims=d)) for d in (1, 2)})
    # duplicate entries (uncoalesced), no entries on rank 0, int64 values
    cases["duplicates"] = lambda r: torch.sparse_coo_tensor([[0, 0, SIZE - 1]], [1.0, 2.0, r],
                                                            (SIZE,))
    cases["none on rank 0"] = lambda r: torch.sparse_coo_tensor(
        torch.tensor([[r], [1]])[:, :min(r, 1)], torch.tensor([5 * r])[:min(r, 1)], (SIZE, 3))
    for what, make in cases.items():
        t = make(RANK)
        dist.all_reduce(t)
        sparse_same(t, total(make), "sparse all_reduce, %s" % what)
    t = sparse_of(RANK)
    work = dist.all_reduce(t, async_op=True)
    value = work.get_future().wait()
    assert work.wait() and value[0] is t
    sparse_same(t, total(sparse_of), "sparse all_reduce async")
    expect_raises(RuntimeError, "sparse all_reduce MAX", dist.all_reduce, sparse_of(RANK),
                  op=dist.ReduceOp.MAX, contains=["SUM"])
    expect_raises(NotImplementedError, "CSR all_reduce", dist.all_reduce,
                  torch.eye(2).to_sparse_csr(), contains=["sparse_csr"])
    expect_raises(RuntimeError, "sparse all_reduce of sizes that differ", dist.all_reduce,
                  torch.sparse_coo_tensor([[0]], [1.0], (SIZE + RANK,)), contains=["sizes differ"])
    t = sparse_of(RANK)
    dist.all_reduce(t)
    sparse_same(t, total(sparse_of), "sparse all_reduce after the errors")
    log("sparse all_reduce: ok")


# ---------------------------------------------------------------- 3, 4. timeouts

def alone(what, call, absent, timeout_s, contains):
    """call() on a fresh group of every rank but `absent`, which go on to the default
    group's barrier: the error must come after timeout_s, soon, and say `contains`.
    (A rank slow to come may be named too: the lists are matched up to their first.)"""
    group = dist.new_group(list(range(SIZE)))  # a failure leaves its turns out of step
    if RANK not in absent:
        start = time.monotonic()
        expect_raises(RuntimeError, what, call, group, within_s=timeout_s + 3,
                      contains=contains)
        waited = time.monotonic() - start
        assert waited >= timeout_s - 0.05, "%s: raised after %.2f s" % (what, waited)
    dist.barrier()


def check_monitored_barrier():
    td = datetime.timedelta
    dist.monitored_barrier(timeout=td(seconds=5))
    dist.monitored_barrier(timeout=td(seconds=5), wait_all_ranks=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's: a float timeout, converted
        dist.monitored_barrier(timeout=5.0)
    dist.group.WORLD.monitored_barrier(td(seconds=5))  # the group's own, as torch's tests call
    if SIZE > 2 and RANK == 2:
        time.sleep(0.2)  # a rank late, within the timeout
    dist.monitored_barrier(timeout=td(seconds=5))
    reached = ["Rank %d successfully reached monitoredBarrier, but received errors while "
               "waiting for send/recv from rank 0" % RANK]
    short = 0.3

    def monitored(**kwargs):
        return lambda group: dist.monitored_barrier(group, td(seconds=short), **kwargs)

    alone("monitored_barrier without rank 1", monitored(), [1], short,
          ["[Rank 0]: Rank 1 failed to pass monitoredBarrier in 300 ms", "rank(s) [1"]
          if RANK == 0 else reached)
    everyone = ", ".join(str(r) for r in range(1, SIZE))
    alone("monitored_barrier alone, wait_all_ranks", monitored(wait_all_ranks=True),
          range(1, SIZE), short, ["Ranks %s failed to pass monitoredBarrier" % everyone,
                                  "Rank 0 timed out in monitoredBarrier"])
    alone("monitored_barrier without rank 0", monitored(), [0], short, reached + ["rank(s) [0"])
    log("monitored_barrier: ok")


def check_group_timeout():
    group = dist.new_group(list(range(SIZE)), timeout=datetime.timedelta(seconds=1))
    if RANK == 0:
        start = time.monotonic()
        expect_raises(RuntimeError, "barrier alone in a group", dist.barrier, group,
                      within_s=2.5, contains=[" timeout ", "rank(s) %s had not submitted it"
                                              % list(range(1, SIZE))])
        waited = time.monotonic() - start
        assert waited >= 0.95, "barrier gave up after %.2f s, before the timeout" % waited
    dist.barrier()
    log("barrier under a group's timeout: ok")


def body():
    dist.init_process_group("perseus")
    check_all_gather_coalesced()
    check_sparse_all_reduce()
    check_monitored_barrier()
    check_group_timeout()
    dist.destroy_process_group()


main(body)
