"""perseus.torch.distributed: torch.distributed's API under mpirun.

init_process_group() with a script's contradicting arguments (one warning, MPI's
ranks win); ranks and sizes against the launcher's; every collective with torch's
signature and in-place semantics against a reference every rank computes from all
ranks' inputs (make_tensor), sync and async (wait, is_completed, get_future().then),
several dtypes and shapes; torch's own ReduceOp values; new_group on a subset; the
object collectives; and bad arguments raising clear errors.
"""
import warnings

import torch
import torch.distributed as tdist

from common import (assert_equal, assert_reduced, expect_raises, launcher_rank_size, log, main,
                    make_tensor)

import perseus.torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]
SHAPES = [(), (7,), (4, 3)]
OPS = [(dist.ReduceOp.SUM, "Sum"), (dist.ReduceOp.AVG, "Average"), (dist.ReduceOp.MIN, "Min"),
       (dist.ReduceOp.MAX, "Max"), (dist.ReduceOp.PRODUCT, "Product")]


def hvd_op(name):
    import perseus.torch.horovod as hvd
    return getattr(hvd, name)


def init(rank, size):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # What torch's ImageNet example passes when launched for one process.
        dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:88", world_size=1,
                                rank=0)
        dist.init_process_group(backend="nccl", world_size=1, rank=0)  # a second call: no-op
    contradiction = [w for w in caught if "contradicts" in str(w.message)]
    assert len(contradiction) == (1 if size > 1 else 0), [str(w.message) for w in caught]
    assert dist.use_perseus and dist.is_available() and dist.is_initialized()
    assert dist.get_rank() == rank and dist.get_world_size() == size
    assert 0 <= dist.get_local_rank() < dist.get_local_size() <= size
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


def group_tests(rank, size):
    members = [0, size - 1]
    group = dist.new_group(members)
    assert dist.new_group(members).process_set is group.process_set  # same ranks, same set
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
    else:
        assert dist.get_rank(group) == -1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert dist.all_reduce(torch.ones(1), group=group) is None
        assert any("not a member" in str(w.message) for w in caught)
    dist.destroy_process_group(group)
    dist.barrier()
    assert dist.barrier(async_op=True).is_completed()


def object_tests(rank, size):
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": "r%d" % rank})
    assert objects == [{"rank": r, "name": "r%d" % r} for r in range(size)], objects
    items = ["from", rank] if rank == size - 1 else [None, None]
    dist.broadcast_object_list(items, src=size - 1)
    assert items == ["from", size - 1], items


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
    expect_raises(NotImplementedError, "BAND", dist.all_reduce, t, op=dist.ReduceOp.BAND,
                  contains=("BAND",))
    expect_raises(ValueError, "bad op", dist.all_reduce, t, op="median", contains=("reduce op",))
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


def body():
    rank, size = launcher_rank_size()
    init(rank, size)
    all_reduce_tests(rank, size)
    data_movement_tests(rank, size)
    group_tests(rank, size)
    object_tests(rank, size)
    optimizer_state_test(rank, size)
    error_tests(rank, size)
    dist.destroy_process_group()
    assert not dist.is_initialized()
    log("distributed API: ok")


main(body)
