"""TF1 DistributedOptimizer(op=Adasum) is the delta optimizer (float64):
each rank's MomentumOptimizer updates the variables locally from its own data, the
per-variable changes are combined by Adasum (tests/support/adasum_reference.py) and every
rank ends with the same variables, while the momentum slots stay per rank.
Checked in a graph with MonitoredTrainingSession (ranks start from different
weights; BroadcastGlobalVariablesHook), eagerly, with backward_passes_per_step=2,
and with groups + a process set; the result must differ from Adasum of gradients
(momentum makes the update differ from -lr * gradient). Errors for unsupported
arguments."""
import os
import sys

import numpy as np
import tensorflow as tf

from common import hvd, log, main
from tiny_model import forward, init_weights, mse_gradient

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.adasum_reference import adasum  # noqa: E402

LR = 0.125  # exact in float32 (the TF1 optimizer keeps it as a float32 tensor)
MU = 0.875
STEPS = 4
ROWS = 3


def batches(rank, count):
    """This rank's `count` batches (each rank sees different data)."""
    rng = np.random.default_rng(1000 + rank)
    return [(rng.normal(size=(ROWS, 5)), rng.normal(size=(ROWS, 2))) for _ in range(count)]


def reference(ranks, steps, passes=1, deltas=True):
    """Weights (shared) and each rank's momentum slots after `steps` runs.

    MomentumOptimizer: acc = mu * acc + g; w -= lr * acc. deltas=True: every rank
    updates w locally and the per-variable deltas are Adasum-combined; False: the
    gradients are Adasum-combined and one momentum step follows (what a gradient-
    reducing optimizer would do). passes: gradients summed over that many runs."""
    data = {r: batches(r, steps) for r in ranks}
    ws = init_weights(0)
    accs = {r: [np.zeros_like(w) for w in ws] for r in ranks}
    sums = {r: [np.zeros_like(w) for w in ws] for r in ranks}
    for step in range(steps):
        for r in ranks:
            sums[r] = [s + g for s, g in zip(sums[r], mse_gradient(ws, *data[r][step]))]
        if (step + 1) % passes:
            continue
        if deltas:
            local = {}
            for r in ranks:
                accs[r] = [MU * a + g for a, g in zip(accs[r], sums[r])]
                local[r] = [-LR * a for a in accs[r]]
            ws = [w + adasum([local[r][i] for r in ranks]) for i, w in enumerate(ws)]
        else:
            combined = [adasum([sums[r][i] for r in ranks]) for i in range(len(ws))]
            for r in ranks:
                accs[r] = [MU * a + g for a, g in zip(accs[r], combined)]
            ws = [w - LR * a for w, a in zip(ws, accs[ranks[0]])]
        sums = {r: [np.zeros_like(w) for w in ws] for r in ranks}
    return ws, accs


def check(got, slots, rank, ranks, steps, what, passes=1, pset=None, rtol=1e-9, atol=1e-12):
    expected, accs = reference(ranks, steps, passes)
    for i, (w, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(w, e, rtol=rtol, atol=atol,
                                   err_msg="%s w%d" % (what, i))
    for i, (s, a) in enumerate(zip(slots, accs[rank])):
        np.testing.assert_allclose(s, a, rtol=rtol, atol=atol,
                                   err_msg="%s momentum slot %d (per rank)" % (what, i))
    # The test can fail: reducing gradients instead gives other weights.
    grad_adasum, _ = reference(ranks, steps, passes, deltas=False)
    gap = max(float(np.abs(w - g).max()) for w, g in zip(got, grad_adasum))
    assert gap > 1e-3, "%s: equals gradient Adasum (gap %g)" % (what, gap)
    everyone = hvd.allgather_object([w.tobytes() for w in got],
                                    process_set=pset or hvd.global_process_set)
    assert all(e == everyone[0] for e in everyone), "%s: ranks differ" % what


def train_graph(rank, steps, passes=1, groups=False, process_set=None):
    v1 = tf.compat.v1
    data = batches(rank, steps)
    graph = tf.Graph()
    with graph.as_default():
        ws = [v1.get_variable("w%d" % i, initializer=w, dtype=tf.float64)
              for i, w in enumerate(init_weights(seed=rank))]
        xs = v1.placeholder(tf.float64, (ROWS, 5))
        ys = v1.placeholder(tf.float64, (ROWS, 2))
        loss = tf.reduce_mean((forward(ws, xs) - ys) ** 2)
        global_step = v1.train.get_or_create_global_step()
        kwargs = dict(op=hvd.Adasum, backward_passes_per_step=passes)
        if groups:
            kwargs["groups"] = [[ws[0], ws[2]]]
        if process_set is not None:
            kwargs["process_set"] = process_set
        opt = hvd.DistributedOptimizer(v1.train.MomentumOptimizer(LR, MU), **kwargs)
        train_op = opt.minimize(loss, global_step=global_step)
        slots = [opt.get_slot(w, "momentum") for w in ws]
        if process_set is None:
            init = hvd.broadcast_global_variables(0)
        else:  # the set's first rank's weights, by hand: the hook is global
            init = [w.assign(init_weights(0)[i]) for i, w in enumerate(ws)]
        with v1.train.MonitoredTrainingSession(checkpoint_dir=None) as sess:
            sess.run(init)
            for x, y in data:
                sess.run(train_op, feed_dict={xs: x, ys: y})
            return sess.run([ws, slots, global_step])


def check_graph(rank, size):
    ranks = list(range(size))
    got, slots, step = train_graph(rank, STEPS)
    check(got, slots, rank, ranks, STEPS, "graph")
    assert step == STEPS, step
    got, slots, step = train_graph(rank, STEPS, passes=2)
    check(got, slots, rank, ranks, STEPS, "backward_passes_per_step=2", passes=2)
    assert step == STEPS, step
    log("graph ok")


def check_groups_process_set(rank, size):
    # A set needs two members for Adasum to combine anything: np 2 passes the global
    # set explicitly; np 4 uses ranks 1-3 (a non-power-of-two set).
    members = list(range(1, size)) if size > 2 else list(range(size))
    pset = hvd.add_process_set(members) if size > 2 else hvd.global_process_set
    if rank in members:
        got, slots, _ = train_graph(rank, STEPS, groups=True, process_set=pset)
        check(got, slots, rank, members, STEPS, "groups on a process set", pset=pset)
    hvd.barrier()
    if size > 2:
        hvd.remove_process_set(pset)
    log("groups + process set ok")


def check_eager(rank, size):
    # fp16 compression rounds each delta and each Adasum level to float16.
    for compression, rtol, atol in [(hvd.Compression.none, 1e-9, 1e-12),
                                     (hvd.Compression.fp16, 1e-2, 1e-3)]:
        what = "eager %s" % compression.__name__
        ws = [tf.Variable(w) for w in init_weights(0)]
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(LR, MU),
                                       op=hvd.Adasum, compression=compression)
        for x, y in batches(rank, STEPS):
            opt.minimize(lambda: tf.reduce_mean((forward(ws, tf.constant(x))
                                                 - tf.constant(y)) ** 2), var_list=ws)
        check([w.numpy() for w in ws], [opt.get_slot(w, "momentum").numpy() for w in ws], rank,
              list(range(size)), STEPS, what, rtol=rtol, atol=atol)
    log("eager ok")


def check_errors():
    try:
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), op=hvd.Adasum,
                                 gradient_predivide_factor=2.0)
    except ValueError as e:
        assert "gradient_predivide_factor" in str(e), e
    else:
        raise AssertionError("Adasum with gradient_predivide_factor did not raise")


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_errors()
    check_graph(rank, size)
    check_eager(rank, size)
    check_groups_process_set(rank, size)
    hvd.shutdown()


main(body)
