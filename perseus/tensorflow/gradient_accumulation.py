"""backward_passes_per_step for the optimizers (Keras and TF1): gradients are summed
locally over k calls, and only every k-th call reduces the sums over the ranks
(divided by k when average_aggregated_gradients) and updates the variables.

The sums and the call counter are tf.Variables and the choice is a tf.cond, so it
holds inside tf.function (model.fit) and TF1 graphs as well as eagerly. Every rank
counts the same calls, so every rank takes the reducing branch on the same call.
"""

import tensorflow as tf


def check_passes(backward_passes_per_step):
    passes = backward_passes_per_step
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1, got %r" % (passes,))
    return passes


def _local_variable(shape, dtype, name):
    """A zero-initialized non-trainable variable, created outside any tf.function or
    control flow; in TF1 graphs a local variable (initialized by the session's
    local_init_op, not checkpointed)."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return tf.Variable(tf.zeros(shape, dtype), trainable=False, name=name)
        return tf.compat.v1.Variable(tf.zeros(shape, dtype), trainable=False, name=name,
                                     use_resource=True,
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


def _dense(grad):
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


class GradientAccumulator:
    """Sums of the gradients of one optimizer's variables over the current k calls.

    reduce(grads, variables) -> grads reduces a list over the ranks (None stays None).
    IndexedSlices gradients are summed densely.
    """

    def __init__(self, passes, average, reduce):
        self.passes = check_passes(passes)
        self.average = average
        self._reduce = reduce
        self._sums = None     # one per gradient; None where the gradient is None
        self.counter = None   # calls since the last reduction

    def _build(self, grads, variables):
        if self._sums is None:
            self._sums = [None if g is None else
                          _local_variable(v.shape, g.dtype, "perseus_grad_sum_%d" % i)
                          for i, (g, v) in enumerate(zip(grads, variables))]
            self.counter = _local_variable((), tf.int64, "perseus_passes")
        present = [g is not None for g in grads]
        if present != [s is not None for s in self._sums]:
            raise ValueError("backward_passes_per_step: the variables with gradients changed "
                             "between calls (%d gradients before, %d now)"
                             % (sum(s is not None for s in self._sums), sum(present)))

    def add(self, grads, variables):
        """Adds `grads` to the sums and counts the call. Returns a boolean tensor,
        True when this is the k-th call (computed after the sums are updated)."""
        grads = list(grads)
        self._build(grads, list(variables))
        updates = [s.assign_add(_dense(g), read_value=False)
                   for s, g in zip(self._sums, grads) if s is not None]
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1, read_value=False)
        with tf.control_dependencies([count]):
            return tf.equal(self.counter.read_value(), self.passes)

    def take(self, variables):
        """The sums reduced over the ranks (divided by k if average); the sums and
        the counter are reset once read. Call it in the branch where add() said True."""
        sums = [None if s is None else s.read_value() for s in self._sums]
        reduced = self._reduce(sums, list(variables))
        if self.average:
            reduced = [None if r is None else r / self.passes for r in reduced]
        done = [_dense(r) for r in reduced if r is not None]
        with tf.control_dependencies(done):
            resets = [s.assign(tf.zeros_like(s), read_value=False)
                      for s in self._sums if s is not None]
            resets.append(self.counter.assign(0, read_value=False))
        with tf.control_dependencies(resets):
            return [None if r is None else tf.identity(_dense(r)) for r in reduced]

    def was_reset(self, deps):
        """True when the last take() has just reset the counter (read after `deps`)."""
        with tf.control_dependencies(deps):
            return tf.equal(self.counter.read_value(), 0)


def _as_op(result):
    """The graph op behind a branch's result (an Operation, a Tensor, an unread
    variable from assign_add), or None where there is none (eagerly, None)."""
    if isinstance(result, tf.Operation):
        return result
    try:
        op = result.op
    except (AttributeError, ValueError):  # eager values, Keras variables
        return None
    return op if isinstance(op, tf.Operation) else None


def run_every_k(due, update, skip):
    """tf.cond(due, update, skip) for branches that only have side effects."""
    def branch(fn):
        def run():
            results = fn()
            results = results if isinstance(results, (list, tuple)) else [results]
            with tf.control_dependencies([op for op in map(_as_op, results) if op is not None]):
                return tf.constant(True)
        return run
    return tf.cond(due, branch(update), branch(skip))
