"""PerseusSyncBatchNorm: gluon batch normalization with batch statistics over the
ranks of this node (comm_scope=0) or over all ranks (comm_scope=1).

Training forward: each rank sums x and x*x per channel over its own batch (any
size), one allreduce adds those sums and the counts over the group, and the
normalization uses the group's mean and (biased) variance, as BatchNorm over the
group's concatenated batch would; running statistics follow MXNet's BatchNorm
(momentum, biased variance) and so are the same on every rank of the group.
Backward: one allreduce of the per-channel sums of dy and dy*x_hat gives the exact
input gradient of the group's BatchNorm; gamma's and beta's gradients are this
rank's share (a distributed trainer sums or averages them like any gradient).
Inference (or use_global_stats): the running statistics, as BatchNorm.

An imperative Block (autograd.Function inside), so hybridize() does not apply.
Simulated nodes for comm_scope=0: PERSEUS_RANKS_PER_NODE (perseus.common.nodes).
"""

import mxnet as mx
from mxnet import autograd, gluon

from perseus.common import nodes as _nodes
from perseus.common.ops import Sum
from perseus.common.process_sets import global_process_set
from perseus.mxnet.mpi_ops import allreduce


def _channel_sum(x):
    """Per-channel sum over every axis but 1."""
    return x.sum(axis=tuple(a for a in range(x.ndim) if a != 1))


def _per_channel(v, ndim):
    """A (C,) vector shaped to broadcast against an (N, C, ...) array."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def sync_forward(x, gamma, beta, epsilon, process_set, name=None):
    """Training-mode batch norm of x (N, C, ...) with the group's statistics.

    Returns (y, mean, var, saved): var is the biased variance (as BatchNorm's
    running statistics use it); `saved` is what sync_backward needs. `name`: a
    request name, for callers whose call order may differ across ranks."""
    channels = x.shape[1]
    count = mx.nd.full((1,), x.size // channels, ctx=x.context, dtype=x.dtype)
    stats = mx.nd.concat(_channel_sum(x), _channel_sum(x * x), count, dim=0)
    stats = allreduce(stats, op=Sum, process_set=process_set,
                      name=None if name is None else name + ".stats")
    total = stats[2 * channels]
    mean = stats[:channels] / total
    var = stats[channels:2 * channels] / total - mean * mean
    invstd = 1.0 / mx.nd.sqrt(var + epsilon)
    xhat = (x - _per_channel(mean, x.ndim)) * _per_channel(invstd, x.ndim)
    y = xhat * _per_channel(gamma, x.ndim) + _per_channel(beta, x.ndim)
    return y, mean, var, (xhat, invstd, gamma, total)


def sync_backward(dy, saved, process_set, name=None):
    """(dx, dgamma, dbeta) for sync_forward: dx of the group's batch norm; dgamma and
    dbeta this rank's share (the group's are their sum)."""
    xhat, invstd, gamma, total = saved
    channels = dy.shape[1]
    sum_dy = _channel_sum(dy)
    sum_dy_xhat = _channel_sum(dy * xhat)
    group = allreduce(mx.nd.concat(sum_dy, sum_dy_xhat, dim=0), op=Sum, process_set=process_set,
                      name=None if name is None else name + ".grads")
    mean_dy = group[:channels] / total
    mean_dy_xhat = group[channels:] / total
    n = dy.ndim
    dx = (dy - _per_channel(mean_dy, n) - xhat * _per_channel(mean_dy_xhat, n)) * \
        _per_channel(gamma * invstd, n)
    return dx, sum_dy_xhat, sum_dy


def update_running(running_mean, running_var, mean, var, momentum):
    """BatchNorm's running statistics: running = running * momentum + batch * (1 - momentum)."""
    for running, batch in ((running_mean, mean), (running_var, var)):
        running[:] = running * momentum + batch.astype(running.dtype) * (1 - momentum)


def check_comm_scope(comm_scope):
    if comm_scope not in (0, 1):
        raise ValueError("comm_scope must be 0 (ranks of this node) or 1 (all ranks), "
                         "got %r" % (comm_scope,))


def scope_process_set(comm_scope):
    return _nodes.node_process_set() if comm_scope == 0 else global_process_set


class _SyncBatchNormFunction(autograd.Function):

    def __init__(self, block, process_set):
        super().__init__()
        self._block = block
        self._set = process_set

    def forward(self, x, gamma, beta):
        block = self._block
        if not block._scale:
            gamma = mx.nd.ones_like(gamma)
        y, mean, var, saved = sync_forward(x, gamma, beta, block._epsilon, self._set)
        update_running(block.running_mean.data(x.context), block.running_var.data(x.context),
                       mean, var, block._momentum)
        self.save_for_backward(*saved)
        return y

    def backward(self, dy):
        block = self._block
        dx, dgamma, dbeta = sync_backward(dy, self.saved_tensors, self._set)
        if not block._scale:
            dgamma = mx.nd.zeros_like(dgamma)
        if not block._center:
            dbeta = mx.nd.zeros_like(dbeta)
        return dx, dgamma, dbeta


class PerseusSyncBatchNorm(gluon.Block):
    """BatchNorm (channel axis 1) whose training statistics span the ranks of this
    node (comm_scope=0, default) or all ranks (comm_scope=1). Other arguments as
    gluon.nn.BatchNorm."""

    def __init__(self, in_channels=0, comm_scope=0, momentum=0.9, epsilon=1e-5, center=True,
                 scale=True, use_global_stats=False, beta_initializer="zeros",
                 gamma_initializer="ones", running_mean_initializer="zeros",
                 running_variance_initializer="ones", **kwargs):
        super().__init__(**kwargs)
        check_comm_scope(comm_scope)
        self._comm_scope = comm_scope
        self._momentum = float(momentum)
        self._epsilon = float(epsilon)
        self._center = center
        self._scale = scale
        self._use_global_stats = use_global_stats
        with self.name_scope():
            self.gamma = self.params.get("gamma", grad_req="write" if scale else "null",
                                         shape=(in_channels,), init=gamma_initializer,
                                         allow_deferred_init=True, differentiable=scale)
            self.beta = self.params.get("beta", grad_req="write" if center else "null",
                                        shape=(in_channels,), init=beta_initializer,
                                        allow_deferred_init=True, differentiable=center)
            self.running_mean = self.params.get("running_mean", grad_req="null",
                                                shape=(in_channels,),
                                                init=running_mean_initializer,
                                                allow_deferred_init=True, differentiable=False)
            self.running_var = self.params.get("running_var", grad_req="null",
                                               shape=(in_channels,),
                                               init=running_variance_initializer,
                                               allow_deferred_init=True, differentiable=False)

    def process_set(self):
        return scope_process_set(self._comm_scope)

    def forward(self, x):
        channels = x.shape[1]
        for param in (self.gamma, self.beta, self.running_mean, self.running_var):
            if param._deferred_init:
                param.shape = (channels,)
                param._finish_deferred_init()
        ctx = x.context
        gamma, beta = self.gamma.data(ctx), self.beta.data(ctx)
        if not autograd.is_training() or self._use_global_stats:
            return mx.nd.BatchNorm(x, gamma, beta, self.running_mean.data(ctx),
                                   self.running_var.data(ctx), eps=self._epsilon,
                                   momentum=self._momentum, fix_gamma=not self._scale,
                                   use_global_stats=True)
        return _SyncBatchNormFunction(self, self.process_set())(x, gamma, beta)

    def __repr__(self):
        return "%s(comm_scope=%d, momentum=%s, eps=%s, in_channels=%s)" % (
            type(self).__name__, self._comm_scope, self._momentum, self._epsilon,
            self.gamma.shape[0] if self.gamma.shape else None)


# Reachable where MXNet keeps its own SyncBatchNorm once perseus.mxnet is imported.
mx.gluon.contrib.nn.PerseusSyncBatchNorm = PerseusSyncBatchNorm
