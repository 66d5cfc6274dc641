"""The 'dist_sync_perseus' KVStore: push/pull/pushpull semantics, optimizer on the
store, optimizer states, compression, and training through gluon.Trainer and
Module.fit equal to one process on the whole batch."""
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from common import assert_close, assert_equal, hvd, log, main, make_array, nd

import training  # noqa: E402  (make_net, data, weights, copy_weights, train)


def check_basics(kv, rank, size):
    assert kv.type == "dist_sync_perseus"
    assert (kv.rank, kv.num_workers, kv.local_rank) == (rank, size, rank)
    assert isinstance(mx.kvstore.create("dist_sync_perseus"), hvd.kvstore.KVStore)
    assert hvd.create("local").type == "local"
    inputs = [make_array("kv", r, (2, 3), np.float32) for r in range(size)]
    total = np.sum(np.stack(inputs), axis=0)
    # init: rank 0's value is stored
    kv.init(3, nd(inputs[rank]))
    out = mx.nd.zeros((2, 3))
    kv.pull(3, out=out)
    assert_equal(out, inputs[0], "init/pull")
    # push: the sum over ranks replaces the stored value; the pushed array is untouched
    pushed = nd(inputs[rank])
    kv.push(3, pushed)
    kv.pull(3, out=out)
    assert_equal(out, total, "push/pull")
    assert_equal(pushed, inputs[rank], "pushed value untouched")
    # two pushes of a key in a row: the second sum is stored
    kv.push(3, nd(inputs[rank]))
    kv.push(3, nd(inputs[rank]) * 2)
    kv.pull(3, out=out)
    assert_equal(out, 2 * total, "push twice/pull")
    # a list of values per key (several devices in one process) is summed too
    kv.push(3, [nd(inputs[rank]), nd(inputs[rank]) * 2])
    outs = [mx.nd.zeros((2, 3)), mx.nd.zeros((2, 3))]
    kv.pull(3, out=outs)
    for o in outs:
        assert_equal(o, 3 * total, "push list/pull list")
    # several keys at once, str keys, pushpull in place and into out
    kv.init(["a", "b"], [mx.nd.zeros(2), mx.nd.zeros(4, dtype="float64")])
    a, b = mx.nd.ones(2) * (rank + 1), mx.nd.arange(4, dtype="float64") * rank
    kv.pushpull(["a", "b"], [a, b])
    assert_equal(a, np.full(2, size * (size + 1) / 2, np.float32), "pushpull a")
    assert_equal(b, np.arange(4) * (size * (size - 1) / 2), "pushpull b")
    c = mx.nd.zeros(2)
    kv.pushpull("a", mx.nd.ones(2), out=c)
    assert_equal(c, np.full(2, size, np.float32), "pushpull out")
    # broadcast: rank 0's value into out on every rank
    d = mx.nd.zeros(3)
    kv.broadcast("c", mx.nd.ones(3) * (rank + 7), out=d)
    assert_equal(d, np.full(3, 7, np.float32), "broadcast")
    for bad, exc in ((lambda: kv.pull("missing", out=c), KeyError),
                     (lambda: kv.push("a", mx.nd.ones(3)), ValueError),
                     (lambda: kv.save_optimizer_states("x"), RuntimeError),
                     (lambda: kv.set_gradient_compression({"type": "2bit"}),
                      NotImplementedError)):
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError("expected %s" % exc.__name__)


def check_optimizer(rank, size, scratch):
    kv = hvd.create("dist_sync_perseus")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9))
    w0 = make_array("w", 0, (5,), np.float64)
    kv.init(0, nd(make_array("w", rank, (5,), np.float64)))
    grads = [[make_array("g%d" % s, r, (5,), np.float64) for r in range(size)] for s in range(3)]
    # reference: SGD with momentum on the summed gradient, computed here
    w, m = w0.copy(), np.zeros(5)
    expected = []
    for s in range(3):
        m = 0.9 * m - 0.1 * np.sum(grads[s], axis=0)
        w = w + m
        expected.append(w.copy())
    out = mx.nd.zeros(5, dtype="float64")
    kv.pushpull(0, nd(grads[0][rank]), out=out)
    assert_close(out, expected[0], "update 1", rtol=1e-12)
    path = os.path.join(scratch, "opt-%d.states" % rank)
    kv.save_optimizer_states(path)
    kv.pushpull(0, nd(grads[1][rank]), out=out)
    assert_close(out, expected[1], "update 2", rtol=1e-12)
    # every rank holds the same weights
    mine = out.asnumpy()
    assert all(np.array_equal(mine, o) for o in hvd.allgather_object(mine)), "ranks differ"
    kv.load_optimizer_states(path)  # momentum back to after step 1, weight stays
    kv.pushpull(0, nd(grads[2][rank]), out=out)
    m1 = -0.1 * np.sum(grads[0], axis=0)
    after = expected[1] + 0.9 * m1 - 0.1 * np.sum(grads[2], axis=0)
    assert_close(out, after, "update after load_optimizer_states", rtol=1e-12)
    # fp16 compression
    kv2 = hvd.create("dist_sync_perseus")
    kv2.set_gradient_compression({"type": "fp16"})
    kv2.init("h", mx.nd.zeros(4))
    h = mx.nd.ones(4) * 0.5
    kv2.pushpull("h", h)
    assert_equal(h, np.full(4, 0.5 * size, np.float32), "fp16 pushpull")


def check_gluon(rank, size, update_on_kvstore):
    xs, ys = training.data(size)
    per = training.PER_RANK
    rows = slice(rank * per, (rank + 1) * per)
    # The same start on every rank: gluon.Trainer initializes the store (rank 0's
    # values) only at the first step(), after the first backward pass.
    net = training.make_net(30)
    start = training.make_net(30)
    params = {"learning_rate": 0.1, "momentum": 0.9}
    kv = hvd.create("dist_sync_perseus")
    trainer = gluon.Trainer(net.collect_params(), "sgd", dict(params), kvstore=kv,
                            update_on_kvstore=update_on_kvstore)
    # dist_sync semantics: gradients are summed, step() takes the global batch size
    got = training.train(net, trainer, xs, ys, per * size, rows)
    assert trainer._update_on_kvstore == bool(update_on_kvstore is not False)
    expected = training.reference(start, xs, ys, size, "sgd", dict(params))
    for name in got:
        assert_close(got[name], expected[name], "gluon kvstore %s" % name, rtol=1e-10,
                     atol=1e-12)


def mlp_symbol():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=7, name="fc1")
    hidden = mx.sym.Activation(hidden, act_type="tanh")
    out = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.LinearRegressionOutput(out, name="lro")


def fit_module(x, y, batch_size, kvstore, arg_params):
    it = mx.io.NDArrayIter(x, y, batch_size=batch_size, label_name="lro_label")
    mod = mx.mod.Module(mlp_symbol(), label_names=["lro_label"], context=mx.cpu())
    mod.fit(it, num_epoch=2, kvstore=kvstore, optimizer="sgd",
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            arg_params={k: v.copy() for k, v in arg_params.items()}, aux_params={},
            force_init=True)
    return {k: v.asnumpy() for k, v in mod.get_params()[0].items()}


def check_module(rank, size):
    per, steps = 4, 3
    rng = np.random.default_rng(11)
    x = rng.normal(size=(steps, per * size, 5)).astype(np.float32)
    y = rng.normal(size=(steps, per * size, 3)).astype(np.float32)
    init_rng = np.random.default_rng(12)
    arg_params = {"fc1_weight": init_rng.normal(0, 0.5, (7, 5)), "fc1_bias": np.zeros(7),
                  "fc2_weight": init_rng.normal(0, 0.5, (3, 7)), "fc2_bias": np.zeros(3)}
    arg_params = {k: mx.nd.array(v) for k, v in arg_params.items()}
    # rank r's data: its slice of every global batch, in batch order
    mine = np.concatenate([x[s, rank * per:(rank + 1) * per] for s in range(steps)])
    mine_y = np.concatenate([y[s, rank * per:(rank + 1) * per] for s in range(steps)])
    got = fit_module(mine, mine_y, per, hvd.create("dist_sync_perseus"), arg_params)
    expected = fit_module(x.reshape(-1, 5), y.reshape(-1, 3), per * size, None, arg_params)
    for name in expected:
        assert_close(got[name], expected[name], "Module.fit %s" % name, rtol=1e-4, atol=1e-5)


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_basics(hvd.create("dist_sync_perseus"), rank, size)
    log("basics passed")
    check_optimizer(rank, size, os.environ["PTEST_TMPDIR"])
    log("optimizer passed")
    check_gluon(rank, size, None)
    check_gluon(rank, size, False)
    log("gluon passed")
    check_module(rank, size)
    log("Module.fit passed")
    hvd.shutdown()


main(body)
