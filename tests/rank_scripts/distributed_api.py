"""perseus.torch.distributed: torch.distributed's API under mpirun.

init_process_group() with a script's contradicting arguments (one warning, MPI's
ranks win); ranks and sizes against the launcher's; every collective with torch's
signature and in-place semantics against a reference every rank computes from all
ranks' inputs (make_tensor), sync and async (wait, is_completed, get_future().then),
several dtypes and shapes, complex ones too (complex_checks.py); the rooted
collectives (reduce, gather, scatter) from every root and the list ones
(reduce_scatter, all_to_all); point-to-point (send, recv from a
rank and from any, isend/irecv, batch_isend_irecv); torch's own ReduceOp values;
new_group on a subset; new_subgroups and new_subgroups_by_enumeration; the object
collectives; monitored_barrier; the availability checks (is_nccl_available, ...) and
get_node_local_rank; and bad arguments raising clear errors.
"""
import datetime
import time
import warnings

import torch
import torch.distributed as tdist

from common import (assert_equal, assert_reduced, expect_raises, launcher_rank_size, log, main,
                    make_tensor, touch, wait_for)
from complex_checks import check_complex
from tensor_write_checks import (check_bitwise_reductions, check_bool_reductions,
                                 check_tensor_writes)

import perseus.torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]
SHAPES = [(), (7,), (4, 3)]
OPS = [(dist.ReduceOp.SUM, "Sum"), (dist.ReduceOp.AVG, "Average"), (dist.ReduceOp.MIN, "Min"),
       (dist.ReduceOp.MAX, "Max"), (dist.ReduceOp.PRODUCT, "Product")]


def hvd_op(name):
    import perseus.torch.horovod as hvd
    return getattr(hvd, name)


def availability_tests():
    """Before init: the availability checks answer from this process's transports."""
    import perseus.torch.horovod as hvd
    assert dist.is_mpi_available() is True and dist.is_gloo_available() is False
    assert dist.is_nccl_available() is bool(hvd.nccl_built())
    assert dist.is_torchelastic_launched() is False  # mpirun started us
    assert dist.Backend.NCCL == "nccl" and dist.Backend is tdist.Backend
    # As torch answers it: gloo, nccl and mpi by their checks, other names torch knows.
    assert dist.is_backend_available("mpi") and dist.is_backend_available("perseus")
    assert not dist.is_backend_available("gloo") and not dist.is_backend_available("glooo")
    assert dist.is_backend_available("cpu:mpi,cuda:nccl") is dist.is_nccl_available()
    assert dist.get_default_backend_for_device("cpu") == "gloo"
    for name in ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "Store",
                 "TCPStore", "FileStore", "HashStore", "PrefixStore"):
        assert getattr(dist, name) is getattr(tdist, name), name
    assert dist.GroupMember.WORLD != dist.GroupMember.NON_GROUP_MEMBER  # before init too
    store = dist.PrefixStore("p/", dist.HashStore())
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert dist.get_node_local_rank(fallback_rank=5) == 5
    expect_raises(RuntimeError, "get_node_local_rank before init", dist.get_node_local_rank,
                  contains=("init_process_group", "fallback_rank"))


def init(rank, size):
    availability_tests()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # What torch's ImageNet example passes when launched for one process.
        dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:88", world_size=1,
                                rank=0, timeout=datetime.timedelta(minutes=5))
        # A second call: no-op
        dist.init_process_group(backend=dist.Backend.NCCL, world_size=1, rank=0)
    contradiction = [w for w in caught if "contradicts" in str(w.message)]
    assert len(contradiction) == (1 if size > 1 else 0), [str(w.message) for w in caught]
    assert dist.use_perseus and dist.is_available() and dist.is_initialized()
    assert dist.get_rank() == rank and dist.get_world_size() == size
    assert 0 <= dist.get_local_rank() < dist.get_local_size() <= size
    assert dist.get_node_local_rank() == dist.get_node_local_rank(fallback_rank=9) == dist.get_local_rank()
    if dist.get_local_size() == size:  # one host: the node-local rank is the rank
        assert dist.get_node_local_rank() == rank
    assert dist.get_rank(dist.group.WORLD) == rank and dist.get_world_size(dist.group.WORLD) == size


def all_reduce_tests(rank, size):
    for dtype in DTYPES:
        for shape in SHAPES:
            for op, name in OPS:
                kind = "product" if name == "Product" else "sum"
                if name == "Average" and not dtype.is_floating_point:
                    continue
                tag = "ar.%s.%s.%s" % (name, dtype, shape)
                xs = [make_tensor(tag, r, shape, dtype, kind) for r in range(size)]
                t = xs[rank].clone()
                assert dist.all_reduce(t, op=op) is None
                assert_reduced(t, xs, hvd_op(name), dtype, tag)
    # async: wait, is_completed, result; the future's value and then().
    xs = [make_tensor("ar.async", r, (5,), torch.float64) for r in range(size)]
    t = xs[rank].clone()
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True and work.is_completed() and work.result()[0] is t
    assert_reduced(t, xs, hvd_op("Sum"), torch.float64, "all_reduce async")
    t = xs[rank].clone()
    doubled = dist.all_reduce(t, op=tdist.ReduceOp.SUM, async_op=True).get_future() \
        .then(lambda fut: fut.value()[0] * 2).wait()
    assert_reduced(doubled / 2, xs, hvd_op("Sum"), torch.float64, "all_reduce future")
    # Non-contiguous tensors are reduced in place too.
    base = torch.stack([xs[rank], xs[rank]], 1)
    dist.all_reduce(base[:, 1])
    assert_reduced(base[:, 1], xs, hvd_op("Sum"), torch.float64, "all_reduce non-contiguous")
    assert torch.equal(base[:, 0], xs[rank])


def data_movement_tests(rank, size):
    for dtype in DTYPES + [torch.bool]:
        for shape in SHAPES:
            tag = "move.%s.%s" % (dtype, shape)
            xs = [make_tensor(tag, r, shape, dtype) for r in range(size)]
            for src in range(size):
                t = xs[rank].clone()
                dist.broadcast(t, src=src)
                assert_equal(t, xs[src], "broadcast from %d" % src)
            out = [torch.empty(shape, dtype=dtype) for _ in range(size)]
            dist.all_gather(out, xs[rank])
            for r in range(size):
                assert_equal(out[r], xs[r], "all_gather row %d" % r)
            stacked = torch.empty((size,) + shape, dtype=dtype)
            dist.all_gather_into_tensor(stacked, xs[rank])
            assert_equal(stacked, torch.stack(xs), "all_gather_into_tensor stacked")
            if shape:
                cat = torch.empty((size * shape[0],) + shape[1:], dtype=dtype)
                work = dist.all_gather_into_tensor(cat, xs[rank], async_op=True)
                work.wait()
                assert_equal(cat, torch.cat(xs), "all_gather_into_tensor concatenated")
    # reduce_scatter_tensor: world chunks of the output's shape.
    for dtype in (torch.float32, torch.int64):
        for out_shape in ((3,), (2, 2)):
            tag = "rs.%s.%s" % (dtype, out_shape)
            xs = [make_tensor(tag, r, (size * out_shape[0],) + out_shape[1:], dtype)
                  for r in range(size)]
            out = torch.empty(out_shape, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[rank].clone())
            rows = out_shape[0]
            assert_reduced(out, [x[rank * rows:(rank + 1) * rows] for x in xs], hvd_op("Sum"),
                           dtype, tag)
    # all_to_all_single, even and with splits (rank r sends r + j + 1 rows to rank j).
    xs = [make_tensor("a2a", r, (size * 2, 3), torch.float32) for r in range(size)]
    out = torch.empty(size * 2, 3)
    dist.all_to_all_single(out, xs[rank])
    assert_equal(out, torch.cat([x[rank * 2:(rank + 1) * 2] for x in xs]), "all_to_all_single")
    send = [[r + j + 1 for j in range(size)] for r in range(size)]
    xs = [make_tensor("a2a.splits", r, (sum(send[r]), 2), torch.int64) for r in range(size)]
    recv = [send[r][rank] for r in range(size)]
    out = torch.empty(sum(recv), 2, dtype=torch.int64)
    work = dist.all_to_all_single(out, xs[rank], output_split_sizes=recv,
                                  input_split_sizes=send[rank], async_op=True)
    work.wait()
    expected = torch.cat([x[sum(send[r][:rank]):sum(send[r][:rank + 1])]
                          for r, x in enumerate(xs)])
    assert_equal(out, expected, "all_to_all_single with splits")


def rooted_tests(rank, size):
    for dtype in DTYPES:
        for shape in SHAPES:
            tag = "rooted.%s.%s" % (dtype, shape)
            xs = [make_tensor(tag, r, shape, dtype) for r in range(size)]
            for root in range(size):
                t = xs[rank].clone()
                assert dist.reduce(t, dst=root) is None
                if rank == root:
                    assert_reduced(t, xs, hvd_op("Sum"), dtype, "reduce to %d" % root)
                else:
                    assert_equal(t, xs[rank], "reduce leaves rank %d's tensor" % rank)
                out = [torch.empty(shape, dtype=dtype) for _ in range(size)]
                assert dist.gather(xs[rank], out if rank == root else None, dst=root) is None
                if rank == root:
                    for r in range(size):
                        assert_equal(out[r], xs[r], "gather to %d, row %d" % (root, r))
                chunks = [make_tensor(tag + ".chunk%d" % r, root, shape, dtype)
                          for r in range(size)]
                t = torch.empty(shape, dtype=dtype)
                assert dist.scatter(t, chunks if rank == root else None, src=root) is None
                assert_equal(t, chunks[rank], "scatter from %d" % root)
    # Max to the last rank by group rank, async; the default roots (rank 0).
    xs = [make_tensor("rooted.max", r, (6,), torch.float32) for r in range(size)]
    t = xs[rank].clone()
    work = dist.reduce(t, op=dist.ReduceOp.MAX, group_dst=size - 1, async_op=True)
    assert work.wait() is True
    if rank == size - 1:
        assert_reduced(t, xs, hvd_op("Max"), torch.float32, "reduce MAX async")
    out = [torch.empty(6) for _ in range(size)] if rank == 0 else None
    dist.gather(xs[rank], out, async_op=True).wait()
    if rank == 0:
        assert_equal(torch.stack(out), torch.stack(xs), "gather to the default rank 0")
    t = torch.empty(6)
    dist.scatter(t, list(xs) if rank == 0 else None, async_op=True).wait()
    assert_equal(t, xs[rank], "scatter from the default rank 0")
    # reduce_scatter (a list per rank) and all_to_all (lists of different sizes).
    for dtype in (torch.float64, torch.int32):
        tag = "rs.list.%s" % dtype
        inputs = [[make_tensor(tag, r * size + j, (2, 3), dtype) for j in range(size)]
                  for r in range(size)]
        out = torch.empty(2, 3, dtype=dtype)
        assert dist.reduce_scatter(out, inputs[rank]) is None
        assert_reduced(out, [inputs[r][rank] for r in range(size)], hvd_op("Sum"), dtype,
                       "reduce_scatter")
    sizes = [[r + j + 1 for j in range(size)] for r in range(size)]  # rank r to rank j
    inputs = [[make_tensor("a2a.list", r * size + j, (sizes[r][j],), torch.int64)
               for j in range(size)] for r in range(size)]
    out = [torch.empty(sizes[r][rank], dtype=torch.int64) for r in range(size)]
    dist.all_to_all(out, inputs[rank], async_op=True).wait()
    for r in range(size):
        assert_equal(out[r], inputs[r][rank], "all_to_all from rank %d" % r)


def point_to_point_tests(rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    for dtype in (torch.float32, torch.int64, torch.bool):
        for shape in ((5,), (2, 3)):
            tag = "p2p.%s.%s" % (dtype, shape)
            xs = [make_tensor(tag, r, shape, dtype) for r in range(size)]
            # A ring, even ranks sending first: blocking calls that always meet.
            got = torch.empty(shape, dtype=dtype)
            if rank % 2 == 0:
                dist.send(xs[rank], dst=right)
                assert dist.recv(got, src=left) == left
            else:
                assert dist.recv(got, src=left) == left
                dist.send(xs[rank], dst=right)
            assert_equal(got, xs[left], "recv from %d" % left)
            # Every rank sends to rank 0, which receives from any rank.
            if rank == 0:
                senders = set()
                for _ in range(size - 1):
                    got = torch.empty(shape, dtype=dtype)
                    sender = dist.recv(got, tag=3)
                    assert_equal(got, xs[sender], "recv from any: rank %d's" % sender)
                    senders.add(sender)
                assert senders == set(range(1, size)), senders
            else:
                dist.send(xs[rank], dst=0, tag=3)
    # isend/irecv both ways at once, tags telling two messages to one peer apart.
    xs = [make_tensor("p2p.async", r, (4,), torch.float64) for r in range(size)]
    second = torch.empty(4, dtype=torch.float64)
    works = [dist.irecv(second, src=left, tag=2)]
    got = torch.empty(4, dtype=torch.float64)
    works.append(dist.irecv(got, group_src=left, tag=1))
    works += [dist.isend(xs[rank], dst=right, tag=1), dist.isend(xs[rank] * 2, dst=right, tag=2)]
    for work in works:
        work.wait()
    assert_equal(got, xs[left], "irecv tag 1")
    assert_equal(second, xs[left] * 2, "irecv tag 2")
    # batch_isend_irecv: a ring both ways, with torch's own isend/irecv in a P2POp too.
    from_left, from_right = torch.empty(4, dtype=torch.float64), torch.empty(4, dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, xs[rank], right), dist.P2POp(tdist.irecv, from_left, left),
           dist.P2POp(dist.isend, xs[rank] + 1, group_peer=left),
           dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_equal(from_left, xs[left], "batch_isend_irecv from the left")
    assert_equal(from_right, xs[right] + 1, "batch_isend_irecv from the right")
    # Objects to the right, received from the left by rank and from any rank.
    objects = [{"from": rank}, "x" * (rank * 50), list(range(rank))]
    got = [None] * 3
    if rank % 2 == 0:
        dist.send_object_list(objects, dst=right)
        assert dist.recv_object_list(got, src=left) == left
    else:
        assert dist.recv_object_list(got) == left
        dist.send_object_list(objects, group_dst=right)
    assert got == [{"from": left}, "x" * (left * 50), list(range(left))], got
    # To itself: refused (torch's gloo allows an isend and irecv pair), before anything
    # is queued.
    expect_raises(RuntimeError, "isend to itself", dist.isend, xs[rank], dst=rank,
                  contains=("this rank itself",))


def ranks_tests(rank, size):
    assert dist.get_process_group_ranks(None) == list(range(size))
    group = dist.new_group([size - 1, 0])
    assert dist.get_process_group_ranks(group) == [0, size - 1]
    assert dist.get_global_rank(group, 1) == size - 1 and dist.get_group_rank(group, 0) == 0
    expect_raises(ValueError, "get_group_rank outside", dist.get_group_rank, group, size,
                  contains=("not part of group",))
    expect_raises(ValueError, "get_global_rank outside", dist.get_global_rank, group, 2,
                  contains=("not part of group",))
    # WORLD's ranks are answered as they are, unchecked, as torch answers.
    assert dist.get_global_rank(dist.group.WORLD, size + 2) == size + 2
    assert dist.get_group_rank(dist.group.WORLD, size + 2) == size + 2
    dist.monitored_barrier()
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    if rank in (0, size - 1):
        dist.monitored_barrier(group=group)
        # Rooted calls within the group: global and group ranks, and the group's order.
        xs = {r: make_tensor("group.rooted", r, (3,), torch.float32) for r in (0, size - 1)}
        t = xs[rank].clone()
        dist.reduce(t, dst=size - 1, group=group)
        if rank == size - 1:
            assert_reduced(t, list(xs.values()), hvd_op("Sum"), torch.float32, "group reduce")
        out = [torch.empty(3) for _ in range(2)] if rank == 0 else None
        dist.gather(xs[rank], out, group=group)  # to rank 0 by default
        if rank == 0:
            assert_equal(torch.stack(out), torch.stack([xs[0], xs[size - 1]]), "group gather")
        got = torch.empty(3)
        if rank == 0:
            dist.send(xs[0], group_dst=1, group=group)
        else:
            assert dist.recv(got, group=group) == 0
            assert_equal(got, xs[0], "group recv")
    dist.destroy_process_group(group)


def monitored_timeout_test(rank, size):
    """monitored_barrier when ranks do not come: rank 0 alone names every other rank,
    then the others alone (once rank 0 gave up) say they reached it and name rank 0.
    Each side used one barrier, so the world's calls line up again after."""
    short = datetime.timedelta(seconds=0.3)
    if rank == 0:
        start = time.monotonic()
        expect_raises(RuntimeError, "monitored_barrier alone", dist.monitored_barrier,
                      timeout=short, wait_all_ranks=True, within_s=3.3,
                      contains=("[Rank 0]: Ranks %s failed to pass monitoredBarrier in 300 ms"
                                % ", ".join(str(r) for r in range(1, size)),
                                "rank(s) %s had not submitted it" % list(range(1, size))))
        assert time.monotonic() - start >= 0.25, "monitored_barrier gave up early"
        touch("rank0.gave.up")
    else:
        wait_for("rank0.gave.up")
        expect_raises(RuntimeError, "monitored_barrier without rank 0", dist.monitored_barrier,
                      timeout=short, within_s=3.3,
                      contains=("Rank %d successfully reached monitoredBarrier" % rank,
                                "rank(s) [0"))  # a rank late to come may be named too
    dist.barrier()


def group_timeout_test(rank, size):
    """A group's timeout: rank 0 alone in an all_reduce fails after it, naming every
    other rank; then the others alone (once rank 0 gave up, asynchronously) fail naming
    rank 0, so the calls line up again; then an all_gather the other way round. A
    receive nobody sends to fails too."""
    group = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=0.5))
    assert dist.new_group(list(range(size))).bound is None  # its own timeout: none
    t = torch.ones(3)
    if rank == 0:
        start = time.monotonic()
        expect_raises(RuntimeError, "all_reduce alone", dist.all_reduce, t, group=group,
                      within_s=3.5, contains=("rank(s) %s had not submitted it within the "
                                              "process group's timeout of 0.5 s"
                                              % list(range(1, size)),))
        assert time.monotonic() - start >= 0.45, "all_reduce gave up early"
        expect_raises(RuntimeError, "recv from nobody", dist.recv, t, src=size - 1, tag=77,
                      group=group, within_s=3.5, contains=("timeout of 0.5 s",))
        touch("rank0.timed.out")
    else:
        wait_for("rank0.timed.out")
        work = dist.all_reduce(t, group=group, async_op=True)
        expect_raises(RuntimeError, "all_reduce without rank 0", work.wait, within_s=3.5,
                      contains=("rank(s) [0",))  # a rank late to come may be named too
        # Then the other way round, in an all_gather.
        expect_raises(RuntimeError, "all_gather without rank 0", dist.all_gather,
                      [torch.empty(3) for _ in range(size)], t, group=group, within_s=3.5,
                      contains=("rank(s) [0",))
        touch("rank%d.timed.out" % rank)
    if rank == 0:
        for r in range(1, size):
            wait_for("rank%d.timed.out" % r)
        expect_raises(RuntimeError, "all_gather alone", dist.all_gather,
                      [torch.empty(3) for _ in range(size)], t, group=group, within_s=3.5,
                      contains=("rank(s) %s had not" % list(range(1, size)),))
    dist.barrier()
    x = make_tensor("after.timeout", rank, (3,), torch.float32)
    everyone = [make_tensor("after.timeout", r, (3,), torch.float32) for r in range(size)]
    dist.all_reduce(x, group=group)
    assert_reduced(x, everyone, hvd_op("Sum"), torch.float32, "all_reduce after the timeouts")


def group_tests(rank, size):
    members = [0, size - 1]
    group = dist.new_group(members)
    twin = dist.new_group(members)
    assert twin.process_set is group.process_set  # same ranks, same set
    # torch's test for a rank outside the group; WORLD is the default group.
    assert (group == dist.GroupMember.NON_GROUP_MEMBER) is (rank not in members)
    assert (group != dist.GroupMember.NON_GROUP_MEMBER) is (rank in members)
    assert dist.GroupMember.WORLD is dist.group.WORLD
    assert dist.group.WORLD != dist.GroupMember.NON_GROUP_MEMBER
    if rank in members:
        assert dist.get_rank(group) == members.index(rank) and dist.get_world_size(group) == 2
        xs = {r: make_tensor("group", r, (4,), torch.float32) for r in members}
        t = xs[rank].clone()
        dist.all_reduce(t, group=group)
        assert_reduced(t, list(xs.values()), hvd_op("Sum"), torch.float32, "group all_reduce")
        t = xs[rank].clone()
        dist.broadcast(t, group=group, group_src=1)
        assert_equal(t, xs[size - 1], "group broadcast from group rank 1")
        dist.barrier(group=group)
    else:  # torch's answers on a rank outside the group
        assert dist.get_rank(group) == -1 and dist.get_world_size(group) == -1
        expect_raises(ValueError, "get_backend outside", dist.get_backend, group,
                      contains=("Invalid process group specified",))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert dist.all_reduce(torch.ones(1), group=group) is None
        assert any("not a member" in str(w.message) for w in caught)
    destroying_a_group_of_shared_ranks(rank, members, group, twin)
    dist.barrier()
    assert dist.barrier(async_op=True).is_completed()


def destroying_a_group_of_shared_ranks(rank, members, group, twin):
    """Groups of the same ranks share a process set: destroying one leaves the others
    working, as in torch (it broke them all), and the destroyed one refuses every use.
    The set goes with the last of them; the world's never does."""
    everyone = dist.new_group(range(dist.get_world_size()))
    dist.destroy_process_group(group)
    for what, call in (("get_rank", lambda: dist.get_rank(group)),
                       ("all_reduce", lambda: dist.all_reduce(torch.ones(1), group=group)),
                       ("destroy again", lambda: dist.destroy_process_group(group))):
        expect_raises(ValueError, what + " of a destroyed group", call,
                      contains=("was destroyed by destroy_process_group()",))
    xs = {r: make_tensor("twin", r, (3,), torch.float64) for r in members}
    if rank in members:
        assert dist.get_rank(twin) == members.index(rank)
        t = xs[rank].clone()
        dist.all_reduce(t, group=twin)
        assert_reduced(t, list(xs.values()), hvd_op("Sum"), torch.float64, "the twin's all_reduce")
    else:
        assert dist.get_rank(twin) == -1
    dist.destroy_process_group(twin)
    # The last group of those ranks: its set is unregistered, unless it is the world's.
    assert (twin.process_set.process_set_id is None) is (len(members) < dist.get_world_size())
    dist.destroy_process_group(everyone)  # the world's set stays
    x = make_tensor("world.after", rank, (2,), torch.float32)
    dist.all_reduce(x)
    assert_reduced(x, [make_tensor("world.after", r, (2,), torch.float32)
                       for r in range(dist.get_world_size())], hvd_op("Sum"), torch.float32,
                   "all_reduce after destroying a group of every rank")


def subgroup_tests(rank, size):
    def sums_over(subgroup, ranks, what):
        x = make_tensor("subgroup", rank, (5,), torch.float64)
        dist.all_reduce(x, group=subgroup)
        assert_reduced(x, [make_tensor("subgroup", r, (5,), torch.float64) for r in ranks],
                       hvd_op("Sum"), torch.float64, what)

    mine, pairs = dist.new_subgroups(group_size=2)
    assert [dist.get_process_group_ranks(g) for g in pairs] == [[i, i + 1] for i in range(0, size, 2)]
    first = rank - rank % 2
    assert dist.get_process_group_ranks(mine) == [first, first + 1] and dist.get_rank(mine) == rank % 2
    sums_over(mine, [first, first + 1], "all_reduce in a subgroup of 2")
    whole, groups = dist.new_subgroups()  # one host: the node's ranks are every rank
    assert len(groups) == 1 and dist.get_process_group_ranks(whole) == list(range(size))
    outer = dist.new_group(range(1, size)) if size > 2 else None
    if outer is not None:  # the subgroups of a group: its ranks, split
        mine, ones = dist.new_subgroups(group_size=1, group=outer)
        assert [dist.get_process_group_ranks(g) for g in ones] == [[r] for r in range(1, size)]
        assert (mine is None) == (rank == 0)
    for bad, why in ((0, "positive"), (3, "cannot be split"), (size + 1, "cannot be split")):
        expect_raises(ValueError, "new_subgroups(group_size=%d)" % bad, dist.new_subgroups,
                      group_size=bad, contains=(why,))
    enumerated = [[size - 1], list(range(size - 1))]
    mine, groups = dist.new_subgroups_by_enumeration(enumerated)
    assert [dist.get_process_group_ranks(g) for g in groups] == enumerated
    expected = enumerated[0] if rank == size - 1 else enumerated[1]
    assert dist.get_process_group_ranks(mine) == expected
    sums_over(mine, expected, "all_reduce in an enumerated subgroup")
    mine, _ = dist.new_subgroups_by_enumeration([[0]])
    assert (mine is None) == (rank != 0)
    expect_raises(ValueError, "a rank in two subgroups", dist.new_subgroups_by_enumeration,
                  [[0, 1], [1]], contains=("rank 1 is in subgroup 0 and in subgroup 1",))
    expect_raises(ValueError, "no subgroups", dist.new_subgroups_by_enumeration, [],
                  contains=("empty",))
    dist.barrier()


def object_tests(rank, size):
    objects = [None] * size + ["kept"]  # entries past the size stay, as in torch
    dist.all_gather_object(objects, {"rank": rank, "name": "r%d" % rank})
    assert objects == [{"rank": r, "name": "r%d" % r} for r in range(size)] + ["kept"], objects
    items = ["from", rank] if rank == size - 1 else [None, None]
    dist.broadcast_object_list(items, src=size - 1)
    assert items == ["from", size - 1], items
    for root in range(size):
        gathered = [None] * size if rank == root else None
        dist.gather_object({"rank": rank, "pad": "x" * rank * 100}, gathered, dst=root)
        if rank == root:
            assert gathered == [{"rank": r, "pad": "x" * r * 100} for r in range(size)]
        out = [None]
        sent = [("to", r, list(range(r))) for r in range(size)] if rank == root else None
        dist.scatter_object_list(out, sent, src=root)
        assert out == [("to", rank, list(range(rank)))], out


def optimizer_state_test(rank, size):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    model(torch.full((1, 3), float(rank))).sum().backward()
    opt.step()  # momentum buffers differ by rank
    dist.broadcast_optimizer_state(opt, root_rank=size - 1)
    assert opt.param_groups[0]["lr"] == 0.1 * size, opt.param_groups[0]["lr"]
    for p in model.parameters():
        buf = opt.state[p]["momentum_buffer"]
        everyone = [torch.empty_like(buf) for _ in range(size)]
        dist.all_gather(everyone, buf)
        assert all(torch.equal(b, everyone[0]) for b in everyone), "momentum differs by rank"


def error_tests(rank, size):
    t = torch.ones(3)
    expect_raises(NotImplementedError, "PREMUL_SUM", dist.all_reduce, t,
                  op=dist.ReduceOp.PREMUL_SUM, contains=("PREMUL_SUM",))
    for op in ("max", "median"):  # as torch's, a TypeError (the drop-in took "max" as MAX)
        expect_raises(TypeError, "op=%r" % op, dist.all_reduce, t, op=op, contains=("ReduceOp",))
    expect_raises(ValueError, "foreign group", dist.all_reduce, t, group=object(),
                  contains=("group must be",))
    expect_raises(ValueError, "all_gather list", dist.all_gather, [t] * (size + 1), t,
                  contains=("one per rank",))
    expect_raises(ValueError, "all_gather_into_tensor size", dist.all_gather_into_tensor,
                  torch.empty(size * 3 + 1), t, contains=("must hold",))
    expect_raises(ValueError, "reduce_scatter size", dist.reduce_scatter_tensor, torch.empty(2),
                  torch.empty(size * 2 + 1), contains=("must hold",))
    expect_raises(ValueError, "broadcast src and group_src", dist.broadcast, t, src=0,
                  group_src=0, contains=("exactly one",))
    expect_raises(ValueError, "new_group ranks", dist.new_group, [0, size],
                  contains=("outside",))
    assert dist.get_process_group_ranks(dist.new_group(r for r in (size - 1, 0))) == [0, size - 1]
    # Ranks that disagree fail on every rank, also where some find a set of their ranks
    # registered (the world's) and would skip the registration the others wait in.
    expect_raises(ValueError, "new_group ranks that differ", dist.new_group,
                  [0] if rank == 0 else None, within_s=30,
                  contains=("rank 0 [0]; rank 1 %s" % list(range(size)),))
    expect_raises(ValueError, "new_group rank not a number", dist.new_group,
                  [0, "one"] if rank == size - 1 else [0, 1],
                  contains=("rank %d (new_group rank must be an integer, got str 'one')" % (size - 1),
                            "rank 0 [0, 1]"))
    # Refused before anything is sent, so the ranks stay in step.
    expect_raises(ValueError, "reduce without dst", dist.reduce, t, contains=("exactly one",))
    expect_raises(ValueError, "reduce dst outside", dist.reduce, t, dst=size,
                  contains=("not a member",))
    expect_raises(ValueError, "scatter group_src outside", dist.scatter, t, group_src=size,
                  contains=("outside",))
    rows = [torch.empty(3) for _ in range(size)]
    if rank == 0:
        expect_raises(ValueError, "gather without a list", dist.gather, t,
                      contains=("gather_list must be given",))
        expect_raises(ValueError, "gather short list", dist.gather, t, rows[1:],
                      contains=("one per rank",))
        expect_raises(ValueError, "gather dtype", dist.gather, t,
                      [r.double() for r in rows], contains=("float64",))
        expect_raises(ValueError, "gather_object without a list", dist.gather_object, 1,
                      contains=("object_gather_list",))
        expect_raises(ValueError, "scatter_object_list short", dist.scatter_object_list,
                      [None], [1], contains=("one per rank",))
    else:
        expect_raises(ValueError, "gather list off the root", dist.gather, t, rows,
                      contains=("must not be given",))
        expect_raises(ValueError, "scatter list off the root", dist.scatter, t, rows,
                      contains=("must not be given",))
    expect_raises(ValueError, "reduce_scatter list", dist.reduce_scatter, torch.empty(3),
                  rows[1:], contains=("one per rank",))
    expect_raises(ValueError, "all_to_all lists", dist.all_to_all, rows, rows[1:],
                  contains=("one per rank",))
    expect_raises(ValueError, "send to itself", dist.send, t, dst=rank, contains=("itself",))
    expect_raises(ValueError, "negative tag", dist.isend, t, dst=0, tag=-1, contains=("tag",))
    expect_raises(ValueError, "P2POp op", dist.P2POp, dist.all_reduce, t, 0,
                  contains=("isend or irecv",))
    expect_raises(ValueError, "P2POp peers", dist.P2POp, dist.isend, t, 0, group_peer=0,
                  contains=("exactly one",))
    expect_raises(ValueError, "batch_isend_irecv empty", dist.batch_isend_irecv, [],
                  contains=("P2POp",))
    expect_raises(TypeError, "monitored_barrier int timeout", dist.monitored_barrier,
                  timeout=5, contains=("timedelta",))
    expect_raises(TypeError, "init_process_group int timeout", dist.init_process_group,
                  timeout=5, contains=("timedelta",))
    expect_raises(TypeError, "new_group int timeout", dist.new_group, timeout=5,
                  contains=("timedelta",))


def body():
    rank, size = launcher_rank_size()
    init(rank, size)
    all_reduce_tests(rank, size)
    data_movement_tests(rank, size)
    check_complex(dist, rank, size)
    check_tensor_writes(dist, rank, size, "dropin")
    check_bool_reductions(dist, rank, size, "dropin")
    check_bitwise_reductions(dist, rank, size, "dropin")
    rooted_tests(rank, size)
    point_to_point_tests(rank, size)
    ranks_tests(rank, size)
    group_tests(rank, size)
    subgroup_tests(rank, size)
    object_tests(rank, size)
    optimizer_state_test(rank, size)
    error_tests(rank, size)
    monitored_timeout_test(rank, size)
    group_timeout_test(rank, size)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    log("distributed API: ok")


main(body)
