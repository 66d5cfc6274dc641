"""Gluon training through perseus.mxnet equals one process training on the whole batch.

Every rank builds the same data; rank r trains on its slice of each batch with
DistributedTrainer (or gluon.Trainer + DistributedOptimizer), and also computes
the reference: a plain gluon.Trainer on the whole batch, from the same start. The
weights after several steps must agree (float64, tight tolerance).
broadcast_parameters must make differently initialised ranks identical, including
parameters whose initialization is deferred. As Horovod's: compressors of one's own
(also with num_groups) are used and their results written back; a rank outside the
trainer's process set keeps its own gradients; a DistributedOptimizer in a plain
gluon.Trainer scales by the wrapped optimizer's own rescale_grad.
"""
import warnings

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from common import assert_close, hvd, log, main
from perseus.common.compression import Compressor

STEPS = 4
PER_RANK = 3


def make_net(seed, in_units=5):
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(7, activation="tanh", in_units=in_units),
            gluon.nn.Dense(3, in_units=7))
    net.initialize(mx.init.Uniform(0.5))
    net.cast("float64")
    return net


def data(size):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(STEPS, PER_RANK * size, 5))
    y = rng.normal(size=(STEPS, PER_RANK * size, 3))
    return x, y


def weights(net):
    """Parameter values by position (names carry per-instance counters)."""
    return {i: p.data().asnumpy() for i, p in enumerate(net.collect_params().values())}


def copy_weights(source, target):
    for p, q in zip(source.collect_params().values(), target.collect_params().values()):
        q.set_data(p.data().copy())


def train(net, trainer, xs, ys, batch_size, rows):
    loss_fn = gluon.loss.L2Loss()
    for step in range(STEPS):
        x = mx.nd.array(xs[step][rows], dtype="float64")
        y = mx.nd.array(ys[step][rows], dtype="float64")
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch_size)
    return weights(net)


def reference(start, xs, ys, size, optimizer="sgd", params=None):
    net = make_net(0)
    copy_weights(start, net)
    trainer = gluon.Trainer(net.collect_params(), optimizer, params, kvstore=None)
    return train(net, trainer, xs, ys, PER_RANK * size, slice(None))


def check_broadcast_parameters(rank, size):
    net = make_net(100 + rank)
    hvd.broadcast_parameters(net.collect_params(), root_rank=size - 1, prefix="bp.")
    mine = weights(net)
    root = hvd.broadcast_object(mine, root_rank=size - 1)
    expected = weights(make_net(100 + size - 1))
    for name in mine:
        assert np.array_equal(mine[name], root[name]), name
        assert np.array_equal(mine[name], expected[name]), name
    # deferred initialization: the broadcast happens at the first forward pass
    mx.random.seed(200 + rank)
    deferred = gluon.nn.Dense(4)
    deferred.initialize(mx.init.Uniform(1.0))
    hvd.broadcast_parameters(deferred.collect_params(), root_rank=0, prefix="deferred.")
    deferred(mx.nd.ones((2, 6)))
    w = deferred.weight.data().asnumpy()
    assert w.shape == (4, 6)
    assert np.array_equal(w, hvd.broadcast_object(w, root_rank=0)), "deferred parameter"
    # a plain dict of NDArrays (Module.get_params()'s form)
    arrays = {"a": mx.nd.ones(3) * rank, "b": mx.nd.arange(4) + rank}
    hvd.broadcast_parameters(arrays, root_rank=1)
    assert arrays["a"].asnumpy().tolist() == [1.0] * 3
    assert arrays["b"].asnumpy().tolist() == [1.0, 2.0, 3.0, 4.0]
    try:
        hvd.broadcast_parameters([1, 2])
    except ValueError:
        pass
    else:
        raise AssertionError("a list is not a parameter dict")


def check_trainer(rank, size, **options):
    xs, ys = data(size)
    rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    net = make_net(10 + rank)  # different start on every rank ...
    hvd.broadcast_parameters(net.collect_params(), root_rank=0,
                             prefix="t%s." % sorted(options.items()))  # ... until here
    start = make_net(0)
    copy_weights(net, start)
    opt_params = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", dict(opt_params), **options)
    got = train(net, trainer, xs, ys, PER_RANK, rows)
    expected = reference(start, xs, ys, size, "sgd", dict(opt_params))
    rtol = 2e-3 if "compression" in options else 1e-10
    for name in got:
        assert_close(got[name], expected[name], "DistributedTrainer %s %s" % (options, name),
                     rtol=rtol, atol=rtol)


def check_optimizer(rank, size):
    """DistributedOptimizer in a plain gluon.Trainer, as Horovod's examples use it: the
    wrapped optimizer's own rescale_grad (1 / batch size) scales the gradients, and
    what Trainer.step writes to the wrapper does not reach it (Horovod's wrapper keeps
    it), with one warning."""
    xs, ys = data(size)
    rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for make in (lambda **kw: mx.optimizer.Adam(learning_rate=0.05, **kw),
                 lambda **kw: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, **kw)):
        net = make_net(0)
        start = make_net(0)
        opt = hvd.DistributedOptimizer(make(rescale_grad=1.0 / PER_RANK),
                                       gradient_predivide_factor=2.0)
        trainer = gluon.Trainer(net.collect_params(), opt, kvstore=None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(net, trainer, xs, ys, PER_RANK, rows)
        expected = reference(start, xs, ys, size, make())
        what = "DistributedOptimizer(%s)" % type(opt._optimizer).__name__
        for name in got:
            assert_close(got[name], expected[name], "%s %s" % (what, name), rtol=1e-9,
                         atol=1e-10)
        kept = [w for w in caught if "does not reach the wrapped optimizer" in str(w.message)]
        assert len(kept) == 1, [str(w.message) for w in caught]


class Halving(Compressor):
    """A compressor of one's own with no ctx: Horovod writes its result back anyway."""
    calls = 0

    @staticmethod
    def compress(tensor):
        Halving.calls += 1
        return tensor * 0.5, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor * 2


def check_outside_the_set(rank, size):
    """A rank outside the trainer's process set keeps its own gradients (scaled as the
    set's members scale theirs), as Horovod's; the members average theirs."""
    members = list(range(size - 1)) if size > 2 else [0]
    pset = hvd.add_process_set(members)
    xs, ys = data(size)
    rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    net, start = make_net(0), make_net(0)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                     process_set=pset, prefix="outside")
    got = train(net, trainer, xs, ys, PER_RANK, rows)
    if rank in members:
        mine = np.concatenate([np.arange(r * PER_RANK, (r + 1) * PER_RANK) for r in members])
        expected = reference_rows(start, xs, ys, mine, len(members) * PER_RANK, 0.1)
    else:  # its own rows, each step's gradient scaled by 1 / (batch * members)
        expected = reference_rows(start, xs, ys, np.arange(rows.start, rows.stop), PER_RANK,
                                  0.1 / len(members))
    for name in got:
        # (1e-8: the reference scales by the lr, the trainer by rescale_grad)
        assert_close(got[name], expected[name], "rank %d, set %s: %s" % (rank, members, name),
                     rtol=1e-8, atol=1e-9)
    hvd.remove_process_set(pset)


def reference_rows(start, xs, ys, rows, batch_size, lr):
    net = make_net(0)
    copy_weights(start, net)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": lr}, kvstore=None)
    return train(net, trainer, xs, ys, batch_size, rows)


def conv_net(seed):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    # 8 and 16 channels: oneDNN's blocked layouts need multiples of 8
    net.add(gluon.nn.Conv2D(8, 3, in_channels=2, activation="relu"),
            gluon.nn.Conv2D(16, 3, in_channels=8), gluon.nn.Flatten(),
            gluon.nn.Dense(3, in_units=16 * 4 * 4))
    net.initialize(mx.init.Uniform(0.3))
    net.hybridize()
    return net


def check_conv(rank, size):
    """Convolutions (oneDNN arrays in blocked layouts, in the pip wheel) through
    DistributedTrainer equal one process on the whole batch (float32)."""
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(STEPS, PER_RANK * size, 2, 8, 8))
    ys = rng.normal(size=(STEPS, PER_RANK * size, 3))
    rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)

    def fit(net, trainer, batch_size, rows):
        loss_fn = gluon.loss.L2Loss()
        for step in range(STEPS):
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(xs[step][rows])), mx.nd.array(ys[step][rows]))
            loss.backward()
            trainer.step(batch_size)
        return [p.data().asnumpy() for p in net.collect_params().values()]

    net = conv_net(50 + rank)
    # An inference pass first: oneDNN then keeps convolution weights in its own
    # layout, which broadcast_parameters must cope with.
    net(mx.nd.array(xs[0][rows])).wait_to_read()
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix="conv.")
    start = [p.data().copy() for p in net.collect_params().values()]
    got = fit(net, hvd.DistributedTrainer(net.collect_params(), "sgd",
                                          {"learning_rate": 0.1, "momentum": 0.9},
                                          prefix="conv"), PER_RANK, rows)
    ref_net = conv_net(0)
    for p, value in zip(ref_net.collect_params().values(), start):
        p.set_data(value)
    expected = fit(ref_net, gluon.Trainer(ref_net.collect_params(), "sgd",
                                          {"learning_rate": 0.1, "momentum": 0.9},
                                          kvstore=None), PER_RANK * size, slice(None))
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_close(g, e, "conv parameter %d" % i, rtol=1e-4, atol=1e-5)


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_broadcast_parameters(rank, size)
    log("broadcast_parameters passed")
    check_trainer(rank, size)
    check_trainer(rank, size, num_groups=2, prefix="grouped")
    check_trainer(rank, size, gradient_predivide_factor=4.0, prefix="predivide")
    check_trainer(rank, size, compression=hvd.Compression.fp16, prefix="fp16")
    for num_groups in (0, 2):  # in groups too, as Horovod
        calls = Halving.calls
        check_trainer(rank, size, compression=Halving, num_groups=num_groups,
                      prefix="halving%d" % num_groups)
        assert Halving.calls > calls, "compression=Halving, num_groups=%d: unused" % num_groups
    check_outside_the_set(rank, size)
    log("DistributedTrainer passed")
    check_optimizer(rank, size)
    log("DistributedOptimizer passed")
    check_conv(rank, size)
    log("convolutions passed")
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
