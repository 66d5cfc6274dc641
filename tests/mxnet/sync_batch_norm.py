"""PerseusSyncBatchNorm equals gluon BatchNorm over the group's concatenated batch:
outputs, input gradients, gamma/beta gradients (summed over the group), running
statistics, inference. Uneven per-rank batches. comm_scope=1 spans all ranks;
comm_scope=0 the node, here simulated with PERSEUS_RANKS_PER_NODE=2 (set by the
test driver), so at np 4 the groups are ranks {0, 1} and {2, 3}."""
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from common import assert_close, hvd, log, main, make_array

C = 3


def batch(rank, step):
    x = make_array("sbn-x%d" % step, rank, (rank + 2, C, 4), np.float32) / 7.0
    w = make_array("sbn-w%d" % step, rank, (rank + 2, C, 4), np.float32) / 5.0
    return x + 0.3 * np.arange(C).reshape(1, C, 1), w


def run(block, xs, ws):
    """Two training steps and one inference pass; returns what is compared."""
    results = []
    for step, (x, w) in enumerate(zip(xs, ws)):
        x = mx.nd.array(x)
        x.attach_grad()
        with autograd.record():
            y = block(x)
            loss = (y * mx.nd.array(w)).sum()
        loss.backward()
        results.append((y.asnumpy(), x.grad.asnumpy(), block.gamma.grad().asnumpy(),
                        block.beta.grad().asnumpy()))
    stats = (block.running_mean.data().asnumpy(), block.running_var.data().asnumpy())
    inference = block(mx.nd.array(xs[0])).asnumpy()
    return results, stats, inference


def scope_group(rank, size, comm_scope):
    """The ranks whose batches this rank's layer normalizes over."""
    if comm_scope == 1:
        return list(range(size))
    k = int(os.environ["PERSEUS_RANKS_PER_NODE"])
    return list(range(rank // k * k, min(rank // k * k + k, size)))


def compare(mine, whole, rank, group, data, process_set, what, stat_names):
    """This rank's (results, stats, inference) against the reference run on the
    group's concatenated batch: its own rows, and gamma/beta gradients summed."""
    start = sum(data[r][0][0].shape[0] for r in group if r < rank)
    rows = slice(start, start + data[rank][0][0].shape[0])
    for step, ((y, dx, dg, db), (ry, rdx, rdg, rdb)) in enumerate(zip(mine[0], whole[0])):
        assert_close(y, ry[rows], "%s step %d output" % (what, step), rtol=1e-4, atol=1e-5)
        assert_close(dx, rdx[rows], "%s step %d input grad" % (what, step), rtol=1e-4,
                     atol=1e-5)
        for mine_g, ref_g, name in ((dg, rdg, "gamma"), (db, rdb, "beta")):
            summed = hvd.allreduce(mx.nd.array(mine_g), op=hvd.Sum, process_set=process_set)
            assert_close(summed.asnumpy(), ref_g, "%s step %d %s grad" % (what, step, name),
                         rtol=1e-4, atol=1e-5)
    for got, ref, name in zip(mine[1], whole[1], stat_names):
        assert_close(got, ref, "%s %s" % (what, name), rtol=1e-5, atol=1e-6)
    assert_close(mine[2], whole[2][rows], "%s inference" % what, rtol=1e-4, atol=1e-5)


def check(rank, size, comm_scope):
    group = scope_group(rank, size, comm_scope)
    data = {r: [batch(r, s) for s in range(2)] for r in group}
    block = hvd.PerseusSyncBatchNorm(comm_scope=comm_scope, momentum=0.8)
    block.initialize()
    mine = run(block, [data[rank][s][0] for s in range(2)], [data[rank][s][1] for s in range(2)])
    reference = gluon.nn.BatchNorm(momentum=0.8, in_channels=C)
    reference.initialize()
    whole = run(reference, [np.concatenate([data[r][s][0] for r in group]) for s in range(2)],
                [np.concatenate([data[r][s][1] for r in group]) for s in range(2)])
    process_set = block.process_set()
    assert process_set.size() == len(group), (process_set, group)
    compare(mine, whole, rank, group, data, process_set, "comm_scope=%d" % comm_scope,
            ("running_mean", "running_var"))

def run_symbol(symbol, xs, ws, prefix):
    """Two training steps through an executor (what Module runs); then inference."""
    exe = symbol.simple_bind(mx.cpu(), data=xs[0].shape, grad_req="write")
    exe.arg_dict[prefix + "_gamma"][:] = mx.nd.array([1.0, 0.5, 2.0])
    exe.arg_dict[prefix + "_beta"][:] = mx.nd.array([0.0, 0.1, -0.2])
    exe.aux_dict[prefix + "_moving_mean"][:] = 0
    exe.aux_dict[prefix + "_moving_var"][:] = 1
    results = []
    for x, w in zip(xs, ws):
        y = exe.forward(is_train=True, data=mx.nd.array(x))[0].asnumpy()
        exe.backward(out_grads=mx.nd.array(w))
        results.append((y, exe.grad_dict["data"].asnumpy(),
                        exe.grad_dict[prefix + "_gamma"].asnumpy(),
                        exe.grad_dict[prefix + "_beta"].asnumpy()))
    stats = (exe.aux_dict[prefix + "_moving_mean"].asnumpy(),
             exe.aux_dict[prefix + "_moving_var"].asnumpy())
    inference = exe.forward(is_train=False, data=mx.nd.array(xs[0]))[0].asnumpy()
    return results, stats, inference


def check_symbol(rank, size, comm_scope):
    """The symbolic form (mx.sym.contrib.PerseusSyncBatchNorm) against the BatchNorm
    symbol on the group's concatenated batch."""
    group = scope_group(rank, size, comm_scope)
    data = {r: [batch(r, s) for s in range(2)] for r in group}
    symbol = mx.sym.contrib.PerseusSyncBatchNorm(mx.sym.Variable("data"), name="psbn%d" % comm_scope,
                                                 comm_scope=comm_scope, momentum=0.8)
    mine = run_symbol(symbol, [data[rank][s][0] for s in range(2)],
                      [data[rank][s][1] for s in range(2)], "psbn%d" % comm_scope)
    reference = mx.sym.BatchNorm(mx.sym.Variable("data"), name="bn", fix_gamma=False,
                                 momentum=0.8, eps=1e-5)
    whole = run_symbol(reference, [np.concatenate([data[r][s][0] for r in group])
                                   for s in range(2)],
                       [np.concatenate([data[r][s][1] for r in group]) for s in range(2)], "bn")
    compare(mine, whole, rank, group, data, hvd.sync_batch_norm.scope_process_set(comm_scope),
            "symbol comm_scope=%d" % comm_scope, ("moving_mean", "moving_var"))

def check_module_fit(rank, size):
    """Module.fit with the symbolic layer (comm_scope=1) and the Perseus KVStore: the
    initializers know its variables, and every rank ends with the same parameters
    and running statistics."""
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    hidden = hvd.sync_batch_norm_symbol(hidden, name="msbn", comm_scope=1)
    out = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(hidden, num_hidden=1, name="fc2"),
                                        name="lro")
    x = np.random.default_rng(rank).normal(size=(32, 4)).astype(np.float32)
    it = mx.io.NDArrayIter(x, x.sum(1, keepdims=True), batch_size=8, label_name="lro_label")
    module = mx.mod.Module(out, label_names=["lro_label"])
    module.fit(it, num_epoch=2, kvstore=hvd.create("dist_sync_perseus"), optimizer="sgd",
               optimizer_params={"learning_rate": 0.05}, initializer=mx.init.Xavier())
    args, aux = module.get_params()
    mine = {k: v.asnumpy() for k, v in list(args.items()) + list(aux.items())}
    assert set(mine) >= {"msbn_gamma", "msbn_beta", "msbn_moving_mean", "msbn_moving_var"}
    assert not np.allclose(mine["msbn_moving_var"], 1.0), "running statistics not updated"
    for other in hvd.allgather_object(mine):
        for k in mine:
            assert np.allclose(other[k], mine[k], rtol=1e-6, atol=1e-7), k


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert mx.gluon.contrib.nn.PerseusSyncBatchNorm is hvd.PerseusSyncBatchNorm
    check(rank, size, 1)
    log("comm_scope=1 passed")
    check(rank, size, 0)
    log("comm_scope=0 passed")
    check_symbol(rank, size, 1)
    check_symbol(rank, size, 0)
    log("symbolic form passed")
    check_module_fit(rank, size)
    log("Module.fit passed")
    try:
        hvd.PerseusSyncBatchNorm(comm_scope=2)
    except ValueError:
        pass
    else:
        raise AssertionError("comm_scope=2 accepted")
    hvd.shutdown()


main(body)
