"""Every collective of perseus.mxnet x dtype against numpy references; errors.

Each op's result is compared exactly with the reduction/concatenation every rank
computes itself from the other ranks' deterministic inputs; op=Adasum (collectives,
DistributedOptimizer, DistributedTrainer) against tests/support/adasum_reference.py.
"""
import os
import time
import zlib

import mxnet as mx
import numpy as np

from common import (DTYPES, FLOAT_DTYPES, assert_close, assert_equal, hvd, log, main,
                    make_array, nd)
from support.adasum_reference import adasum, assert_adasum_close  # tests/, on the path via common

REDUCERS = {hvd.Sum: ("sum", lambda xs: np.sum(xs, axis=0)),
            hvd.Min: ("sum", lambda xs: np.min(xs, axis=0)),
            hvd.Max: ("sum", lambda xs: np.max(xs, axis=0)),
            hvd.Product: ("product", lambda xs: np.prod(xs, axis=0))}


def check_allreduce(rank, size):
    for dtype in DTYPES:
        for op, (kind, reduce) in REDUCERS.items():
            tag = "ar-%s-%s" % (np.dtype(dtype).name, op)
            inputs = [make_array(tag, r, (3, 5), dtype, kind) for r in range(size)]
            expected = reduce(np.stack(inputs)).astype(dtype)
            x = nd(inputs[rank])
            out = hvd.allreduce(x, op=op, name=tag, priority=1)
            assert_equal(out, expected, tag)
            assert_equal(x, inputs[rank], tag + " input untouched")
            y = nd(inputs[rank])
            assert hvd.allreduce_(y, op=op) is y
            assert_equal(y, expected, tag + " in place")
        if dtype in FLOAT_DTYPES:  # Average and scale factors on floats
            tag = "avg-%s" % np.dtype(dtype).name
            inputs = [make_array(tag, r, (4,), dtype) for r in range(size)]
            expected = (np.sum(np.stack(inputs).astype(np.float64), axis=0) / size)
            assert_close(hvd.allreduce(nd(inputs[rank])), expected.astype(dtype), tag,
                         rtol=1e-3 if dtype == np.float16 else 1e-6)
            scaled = hvd.allreduce(nd(inputs[rank]), op=hvd.Sum, prescale_factor=2.0,
                                   postscale_factor=0.5)
            assert_close(scaled, np.sum(np.stack(inputs).astype(np.float64), axis=0)
                         .astype(dtype), tag + " scaled", rtol=1e-3)


def check_grouped(rank, size):
    shapes = [(2,), (3, 4), (0,), (1, 1, 5)]
    dtypes = [np.float32, np.int32, np.float64, np.int64]
    inputs = [[make_array("g%d" % i, r, s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
              for r in range(size)]
    expected = [np.sum(np.stack([inputs[r][i] for r in range(size)]), axis=0).astype(d)
                for i, d in enumerate(dtypes)]
    outs = hvd.grouped_allreduce([nd(a) for a in inputs[rank]], op=hvd.Sum, name="grp",
                                 priority=3)
    for i, (out, exp) in enumerate(zip(outs, expected)):
        assert_equal(out, exp, "grouped_allreduce[%d]" % i)
    arrays = [nd(a) for a in inputs[rank]]
    assert hvd.grouped_allreduce_(arrays, op=hvd.Sum) is arrays
    for i, (out, exp) in enumerate(zip(arrays, expected)):
        assert_equal(out, exp, "grouped_allreduce_[%d]" % i)
    # As Horovod: a tuple comes back as itself, reduced in place; an empty group as given.
    arrays = tuple(nd(a) for a in inputs[rank])
    assert hvd.grouped_allreduce_(arrays, op=hvd.Sum) is arrays
    assert_equal(arrays[0], expected[0], "grouped_allreduce_ of a tuple")
    for empty in ([], ()):
        assert hvd.grouped_allreduce(empty) is empty and hvd.grouped_allreduce_(empty) is empty


def check_allgather(rank, size):
    for dtype in DTYPES:
        tag = "ag-%s" % np.dtype(dtype).name
        inputs = [make_array(tag, r, (r + 1, 3), dtype) for r in range(size)]
        assert_equal(hvd.allgather(nd(inputs[rank]), name=tag, priority=2),
                     np.concatenate(inputs), tag)
    # an input still being computed by MXNet is waited for
    x = mx.nd.ones((2, 2)) * (rank + 1)
    assert_equal(hvd.allgather(x), np.concatenate(
        [np.full((2, 2), r + 1, dtype=np.float32) for r in range(size)]), "allgather pending")


def check_broadcast(rank, size):
    for dtype in DTYPES:
        for root in range(size):
            tag = "bc-%s-%d" % (np.dtype(dtype).name, root)
            inputs = [make_array(tag, r, (2, 3), dtype) for r in range(size)]
            out = hvd.broadcast(nd(inputs[rank]), root_rank=root, name=tag, priority=-1)
            assert_equal(out, inputs[root], tag)
            y = nd(inputs[rank])
            assert hvd.broadcast_(y, root) is y
            assert_equal(y, inputs[root], tag + " in place")


def check_alltoall(rank, size):
    for dtype in DTYPES:
        tag = "a2a-%s" % np.dtype(dtype).name
        # rank r sends (r + j) % 3 rows to rank j
        splits = [[(r + j) % 3 for j in range(size)] for r in range(size)]
        inputs = [make_array(tag, r, (sum(splits[r]), 2), dtype) for r in range(size)]
        pieces = []
        for r in range(size):
            start = sum(splits[r][:rank])
            pieces.append(inputs[r][start:start + splits[r][rank]])
        # with splits (a list, or an int32 NDArray): (output, received splits), as Horovod
        for given in (splits[rank], mx.nd.array(splits[rank], dtype=np.int32)):
            out, received = hvd.alltoall(nd(inputs[rank]), splits=given, name=tag, priority=4)
            assert_equal(out, np.concatenate(pieces), tag)
            assert_equal(received, np.array([splits[r][rank] for r in range(size)], np.int32),
                         tag + " received splits")
        # without: the output alone
        even = [make_array(tag + "e", r, (2 * size,), dtype) for r in range(size)]
        out = hvd.alltoall(nd(even[rank]))
        assert isinstance(out, mx.nd.NDArray), type(out)
        assert_equal(out, np.concatenate([e[2 * rank:2 * rank + 2] for e in even]), tag + " even")


def check_reducescatter(rank, size):
    for dtype in DTYPES:
        tag = "rs-%s" % np.dtype(dtype).name
        rows = 2 * size + 1  # uneven: the first rank gets one more row
        inputs = [make_array(tag, r, (rows, 3), dtype) for r in range(size)]
        total = np.sum(np.stack(inputs), axis=0).astype(dtype)
        counts = [rows // size + (r < rows % size) for r in range(size)]
        start = sum(counts[:rank])
        out = hvd.reducescatter(nd(inputs[rank]), op=hvd.Sum, name=tag, priority=5)
        assert_equal(out, total[start:start + counts[rank]], tag)


def check_grouped_allgather(rank, size):
    shapes = [(2,), (3, 4), (0, 2), (1, 1, 5)]
    for dtype in DTYPES:
        tag = "gag-%s" % np.dtype(dtype).name
        # dim 0 differs per rank, as allgather allows
        inputs = [[make_array("%s%d" % (tag, i), r, (s[0] + r,) + s[1:], dtype)
                   for i, s in enumerate(shapes)] for r in range(size)]
        outs = hvd.grouped_allgather([nd(a) for a in inputs[rank]], name=tag)
        assert isinstance(outs, list) and len(outs) == len(shapes), outs
        for i, out in enumerate(outs):
            assert_equal(out, np.concatenate([inputs[r][i] for r in range(size)]),
                         "%s[%d]" % (tag, i))
    evens = list(range(0, size, 2))
    ps = hvd.add_process_set(evens)
    try:
        if rank in evens:
            inputs = [[make_array("gag-ps%d" % i, r, (2, 3), np.int32) for i in range(2)]
                      for r in evens]
            outs = hvd.grouped_allgather([nd(a) for a in inputs[evens.index(rank)]],
                                         process_set=ps)
            for i, out in enumerate(outs):
                assert_equal(out, np.concatenate([x[i] for x in inputs]), "set grouped_allgather")
    finally:
        hvd.remove_process_set(ps)


def check_grouped_reducescatter(rank, size):
    counts = lambda rows, n, r: rows // n + (r < rows % n)  # noqa: E731
    shapes = [(2 * size + 1, 3), (size,), (size - 1, 2)]  # uneven, even, fewer rows than ranks
    for dtype in DTYPES:
        tag = "grs-%s" % np.dtype(dtype).name
        inputs = [[make_array("%s%d" % (tag, i), r, s, dtype) for i, s in enumerate(shapes)]
                  for r in range(size)]
        outs = hvd.grouped_reducescatter([nd(a) for a in inputs[rank]], op=hvd.Sum, name=tag)
        assert isinstance(outs, list) and len(outs) == len(shapes), outs
        for i, (out, shape) in enumerate(zip(outs, shapes)):
            total = np.sum(np.stack([inputs[r][i] for r in range(size)]), axis=0).astype(dtype)
            start = sum(counts(shape[0], size, r) for r in range(rank))
            assert_equal(out, total[start:start + counts(shape[0], size, rank)],
                         "%s[%d]" % (tag, i))
        if dtype in FLOAT_DTYPES:
            # Average (the default op) and pre/post scale factors
            rtol = 1e-2 if dtype == np.float16 else 1e-6
            for kwargs, factor in (({}, 1.0 / size),
                                   ({"op": hvd.Sum, "prescale_factor": 0.5,
                                     "postscale_factor": 3.0}, 1.5)):
                outs = hvd.grouped_reducescatter([nd(a) for a in inputs[rank]], **kwargs)
                for i, (out, shape) in enumerate(zip(outs, shapes)):
                    total = np.sum(np.stack([inputs[r][i] for r in range(size)])
                                   .astype(np.float64), axis=0) * factor
                    start = sum(counts(shape[0], size, r) for r in range(rank))
                    assert_close(out, total[start:start + counts(shape[0], size, rank)]
                                 .astype(dtype), "%s %s[%d]" % (tag, kwargs, i), rtol=rtol)
    evens = list(range(0, size, 2))
    ps = hvd.add_process_set(evens)
    try:
        if rank in evens:
            n, me = len(evens), evens.index(rank)
            inputs = [[make_array("grs-ps%d" % i, r, (2 * n, 2), np.int64) for i in range(2)]
                      for r in evens]
            outs = hvd.grouped_reducescatter([nd(a) for a in inputs[me]], op=hvd.Sum,
                                             process_set=ps)
            for i, out in enumerate(outs):
                total = np.sum(np.stack([x[i] for x in inputs]), axis=0)
                assert_equal(out, total[2 * me:2 * me + 2], "set grouped_reducescatter")
    finally:
        hvd.remove_process_set(ps)
    # A scalar in the group: ValueError at the call, as Horovod
    for bad in (lambda: hvd.grouped_reducescatter([mx.nd.zeros((3, 1)), mx.nd.array(rank)]),
                lambda: hvd.reducescatter(mx.nd.array(rank))):
        try:
            bad()
        except ValueError as e:
            assert "at least one dimension" in str(e), e
        else:
            raise AssertionError("a scalar reducescatter was not refused")


def check_horovod_error_types(rank, size):
    """What a Horovod MXNet script catches: (MXNetError, RuntimeError) for an uneven
    equal-split alltoall and for splits that do not fit; (MXNetError, ValueError) for
    float splits. Perseus' error is both a ValueError and a RuntimeError."""
    from mxnet.base import MXNetError
    cases = ((lambda: hvd.alltoall(mx.nd.ones(size + 1)), (MXNetError, RuntimeError)),
             (lambda: hvd.alltoall(mx.nd.ones(size - 1), mx.nd.ones(size, dtype=np.int32)),
              (MXNetError, RuntimeError)),
             (lambda: hvd.alltoall(mx.nd.ones(size), mx.nd.ones(size, dtype=np.float32)),
              (MXNetError, ValueError)),
             (lambda: hvd.alltoall(mx.nd.ones(size), [1.0] * size), (MXNetError, ValueError)))
    for i, (bad, horovod_catches) in enumerate(cases):
        try:
            bad()
        except horovod_catches as e:
            assert isinstance(e, ValueError) and isinstance(e, RuntimeError), (i, type(e))
            assert str(e), i
        else:
            raise AssertionError("case %d was not refused" % i)
    # Through the code every front end shares (issue 37): a root rank that is not an
    # integer, a name that is not valid Unicode text.
    mine = mx.nd.full((3,), rank, dtype=np.float32)
    for bad, exc_type, word in ((lambda: hvd.broadcast(mine, 0.5, name="et.root"), TypeError,
                                 "root_rank"),
                                (lambda: hvd.allreduce(mine, name="et.\udc80"), ValueError,
                                 "name")):
        try:
            bad()
        except exc_type as e:
            assert word in str(e), e
        else:
            raise AssertionError("%s was accepted" % word)
    assert_equal(hvd.broadcast(mine, size - 1, name="et.root"),
                 np.full(3, size - 1, np.float32), "broadcast after errors")
    # and the library keeps working
    assert_equal(hvd.alltoall(mx.nd.ones(size)), np.ones(size, np.float32), "after errors")


def normal_array(tag, rank, shape, dtype=np.float64):
    rng = np.random.default_rng(zlib.crc32(("%s|%d" % (tag, rank)).encode()))
    return rng.normal(0, 3, size=shape).astype(dtype)


def check_adasum(rank, size):
    for dtype in FLOAT_DTYPES:
        name = np.dtype(dtype).name
        for shape in [(3, 5), (), (0,), (17,)]:
            tag = "adasum-%s-%s" % (name, shape)
            xs = [normal_array(tag, r, shape, dtype) for r in range(size)]
            out = hvd.allreduce(nd(xs[rank]), op=hvd.Adasum, name=tag)
            assert out.dtype == dtype, tag
            assert_adasum_close(out.asnumpy(), xs, name, tag)
            y = nd(xs[rank])
            assert hvd.allreduce_(y, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0) is y
            assert_adasum_close(y.asnumpy(), xs, name, tag + " in place, scaled",
                                prescale=0.5, postscale=3.0)
    # Grouped: fused, each array with its own dot products.
    groups = [[normal_array("adasum-g%d" % i, r, s, np.float32) for r in range(size)]
              for i, s in enumerate([(4,), (2, 3), (), (30,)])]
    outs = hvd.grouped_allreduce([nd(g[rank]) for g in groups], op=hvd.Adasum, name="adasum-g")
    for i, (out, xs) in enumerate(zip(outs, groups)):
        assert_adasum_close(out.asnumpy(), xs, "float32", "grouped adasum [%d]" % i)

    # DistributedOptimizer(op=Adasum): plain SGD (lr 1, rescale_grad 1) moves the weight
    # by minus the Adasum of the ranks' gradients, not their average.
    gs = [normal_array("adasum-opt", r, (5,)) for r in range(size)]
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0), op=hvd.Adasum)
    weight = mx.nd.zeros(5, dtype=np.float64)
    opt.update(0, weight, nd(gs[rank]), opt.create_state(0, weight))
    assert_close(weight, -adasum(gs), "DistributedOptimizer Adasum", rtol=1e-10, atol=1e-12)

    # DistributedTrainer(op=Adasum): loss = sum(w * c_r), so each rank's gradient is c_r.
    cs = [normal_array("adasum-trainer", r, (3,), np.float32) for r in range(size)]
    w = mx.gluon.Parameter("w", shape=(3,), init=mx.init.Zero(), dtype=np.float32)
    w.initialize()
    trainer = hvd.DistributedTrainer([w], "sgd", {"learning_rate": 1.0}, op=hvd.Adasum)
    with mx.autograd.record():
        loss = (w.data() * nd(cs[rank])).sum()
    loss.backward()
    trainer.step(1)
    assert_adasum_close(-w.data().asnumpy(), cs, "float32", "DistributedTrainer Adasum")


def check_errors(rank, size):
    # Shapes that differ across ranks: a clear error on every rank, raised by the
    # read of the output, and the library keeps working afterwards.
    # (Under MXNET_ENGINE_TYPE=NaiveEngine the call itself raises.)
    try:
        hvd.allreduce(mx.nd.ones((rank + 1,)), name="mismatch").asnumpy()
    except RuntimeError as e:  # MXNetError from the engine
        assert "mismatch" in str(e) and "shape" in str(e), e
    else:
        raise AssertionError("mismatched shapes were not reported")
    try:
        hvd.allgather(mx.nd.ones((1, rank + 2)), name="mismatch_ag")
    except Exception as e:
        assert "shape" in str(e), e
    else:
        raise AssertionError("mismatched allgather shapes were not reported")
    for bad, exc in ((lambda: hvd.allreduce(mx.nd.ones(2, dtype=np.bool_)), ValueError),
                     (lambda: hvd.allreduce(np.ones(2)), TypeError),
                     (lambda: hvd.allreduce(mx.nd.ones(2, dtype=np.int32), op=hvd.Adasum),
                      ValueError),
                     (lambda: hvd.reducescatter(mx.nd.ones(2), op=hvd.Adasum), NotImplementedError),
                     (lambda: hvd.DistributedOptimizer(mx.optimizer.SGD(), op=hvd.Sum), ValueError),
                     (lambda: hvd.broadcast(mx.nd.ones(2), root_rank=size), ValueError)):
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError("expected %s" % exc.__name__)
    assert_equal(hvd.allreduce(mx.nd.ones(2), op=hvd.Sum), np.full(2, size, np.float32),
                 "after errors")


def check_asynchronous(rank, size):
    """allreduce returns before the collective has run: rank 0 goes on while the
    last rank is 1.5 s late, and only reading the result waits for it."""
    if os.environ.get("MXNET_ENGINE_TYPE") == "NaiveEngine":
        return  # NaiveEngine runs everything at once, by design
    x = mx.nd.ones(1000) * (rank + 1)
    if rank == size - 1:
        time.sleep(1.5)
    start = time.monotonic()
    y = hvd.allreduce(x, op=hvd.Sum, name="late_peer")
    returned = time.monotonic() - start
    z = (y * 2).asnumpy()  # an MXNet op queued behind the collective, then a read
    waited = time.monotonic() - start
    assert np.array_equal(z, np.full(1000, size * (size + 1), np.float32)), z[:4]
    if rank == 0:
        assert returned < 0.5 and waited > 1.0, (returned, waited)
        log("allreduce returned after %.4f s, result read after %.2f s" % (returned, waited))


def check_process_set(rank, size):
    evens = list(range(0, size, 2))
    ps = hvd.add_process_set(evens)
    try:
        if rank in evens:
            inputs = [make_array("ps", r, (3,), np.int32) for r in evens]
            assert_equal(hvd.allreduce(nd(inputs[evens.index(rank)]), op=hvd.Sum,
                                       process_set=ps),
                         np.sum(np.stack(inputs), axis=0).astype(np.int32), "set allreduce")
            assert_equal(hvd.broadcast(nd(inputs[evens.index(rank)]), root_rank=evens[-1],
                                       process_set=ps), inputs[-1], "set broadcast")
            assert_equal(hvd.allgather(nd(inputs[evens.index(rank)]), process_set=ps),
                         np.concatenate(inputs), "set allgather")
        else:
            try:
                hvd.allreduce(mx.nd.ones(2), process_set=ps)
            except ValueError:
                pass
            else:
                raise AssertionError("a rank outside the set was not refused")
    finally:
        hvd.remove_process_set(ps)


def check_same_name(rank, size):
    """Requests of one name pushed back to back run one after the other (the core
    refuses a name twice in flight; MXNet would otherwise run them at once)."""
    outs = [hvd.allreduce(mx.nd.ones(3) * i, name="same", op=hvd.Sum) for i in range(5)]
    outs += hvd.grouped_allreduce([mx.nd.ones(2), mx.nd.ones(2)], name="same_group", op=hvd.Sum)
    outs += hvd.grouped_allreduce([mx.nd.ones(2), mx.nd.ones(2)], name="same_group", op=hvd.Sum)
    expected = [i * size for i in range(5)] + [size] * 4
    assert [o.asnumpy()[0] for o in outs] == expected, [o.asnumpy()[0] for o in outs]


def check_objects(rank, size):
    obj = hvd.broadcast_object({"rank": rank, "list": list(range(rank + 2))}, root_rank=size - 1)
    assert obj == {"rank": size - 1, "list": list(range(size + 1))}, obj
    assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
    # Functions travel too (cloudpickle, as Horovod): a lambda and a closure.
    scale = rank + 2
    fn = hvd.broadcast_object(lambda x: x * scale, root_rank=size - 1)
    assert fn(10) == 10 * (size + 1), fn(10)
    fns = hvd.allgather_object(lambda: scale)
    assert [f() for f in fns] == [r + 2 for r in range(size)]


def check_horovod_modules(rank, size):
    """horovod.mxnet.mpi_ops and the rest hold the package's objects (the basics too);
    _basics lists the sets; gpu_available is False (CPU arrays only)."""
    from perseus.mxnet import compression, functions, mpi_ops
    for attr in ("allreduce", "Average", "size", "rank", "shutdown", "init", "ProcessSet"):
        assert getattr(mpi_ops, attr) is getattr(hvd, attr), attr
    assert compression.Compression is hvd.Compression
    assert functions.broadcast_parameters is hvd.broadcast_parameters
    ids = mpi_ops._basics._get_process_set_ids_and_ranks
    assert ids() == {0: list(range(size))}, ids()
    assert hvd.gpu_available("mxnet") is False
    forged = hvd.ProcessSet([0])
    forged.process_set_id = 10  # names no registered set: ValueError before anything runs
    try:
        hvd.allreduce(mx.nd.ones((2,)), process_set=forged, name="forged")
    except ValueError as e:
        assert "is not registered" in str(e), e
    else:
        raise AssertionError("an allreduce on a set with a forged id ran")


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert (hvd.local_rank(), hvd.local_size()) == (rank, size)
    assert hvd.is_initialized() and hvd.cross_size() == 1 and hvd.is_homogeneous() is True
    for check in (check_horovod_modules, check_allreduce, check_adasum, check_grouped, check_allgather, check_broadcast,
                  check_alltoall, check_reducescatter, check_grouped_allgather,
                  check_grouped_reducescatter, check_horovod_error_types, check_objects,
                  check_same_name, check_process_set, check_asynchronous, check_errors):
        check(rank, size)
        log(check.__name__, "passed")
    mx.nd.waitall()
    hvd.shutdown()


main(body)
