"""PerseusSyncBatchNorm for symbolic graphs (Module, executors), as an MXNet custom
operator: no MXNet rebuild. Same math as the gluon block (sync_batch_norm.py).

    out = perseus.mxnet.sync_batch_norm_symbol(data, name="bn1", comm_scope=0)
    # also mx.sym.contrib.PerseusSyncBatchNorm once perseus.mxnet is imported

Arguments data, <name>_gamma, <name>_beta; auxiliary states <name>_moving_mean and
<name>_moving_var (MXNet's initializers treat these names as BatchNorm's). The
layer's name names its requests, so every rank must give its layers the same
names (as symbols built by the same code do); MXNet may run the layers of a graph
in any order.
"""

import mxnet as mx

from perseus.mxnet import sync_batch_norm as _sbn

OP_TYPE = "perseus_sync_batch_norm"


def _flag(text):
    return str(text).lower() in ("1", "true")


class _SyncBatchNormOp(mx.operator.CustomOp):

    def __init__(self, key, comm_scope, eps, momentum, fix_gamma):
        super().__init__()
        self._key = key
        self._scope = comm_scope
        self._eps = eps
        self._momentum = momentum
        self._fix_gamma = fix_gamma
        self._saved = None

    def forward(self, is_train, req, in_data, out_data, aux):
        x, gamma, beta = in_data
        if self._fix_gamma:
            gamma = mx.nd.ones_like(gamma)
        if is_train:
            y, mean, var, self._saved = _sbn.sync_forward(
                x, gamma, beta, self._eps, _sbn.scope_process_set(self._scope), self._key)
            _sbn.update_running(aux[0], aux[1], mean, var, self._momentum)
        else:
            y = mx.nd.BatchNorm(x, gamma, beta, aux[0], aux[1], eps=self._eps,
                                momentum=self._momentum, fix_gamma=False,
                                use_global_stats=True)
        self.assign(out_data[0], req[0], y)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        if self._saved is None:
            raise RuntimeError("%s: backward without a training forward pass" % self._key)
        dx, dgamma, dbeta = _sbn.sync_backward(out_grad[0], self._saved,
                                               _sbn.scope_process_set(self._scope), self._key)
        if self._fix_gamma:
            dgamma = mx.nd.zeros_like(dgamma)
        for i, grad in enumerate((dx, dgamma, dbeta)):
            self.assign(in_grad[i], req[i], grad)


@mx.operator.register(OP_TYPE)
class _SyncBatchNormProp(mx.operator.CustomOpProp):

    def __init__(self, key="", comm_scope="0", eps="1e-5", momentum="0.9", fix_gamma="False"):
        super().__init__(need_top_grad=True)
        self._key = key
        self._scope = int(comm_scope)
        _sbn.check_comm_scope(self._scope)
        self._eps = float(eps)
        self._momentum = float(momentum)
        self._fix_gamma = _flag(fix_gamma)

    def list_arguments(self):
        return ["data", "gamma", "beta"]

    def list_outputs(self):
        return ["output"]

    def list_auxiliary_states(self):
        return ["moving_mean", "moving_var"]

    def infer_shape(self, in_shape):
        data = in_shape[0]
        channels = (data[1],)
        return [data, channels, channels], [data], [channels, channels]

    def infer_type(self, in_type):
        t = in_type[0]
        return [t, t, t], [t], [t, t]

    def create_operator(self, ctx, shapes, dtypes):
        if ctx.device_type != "cpu":
            raise NotImplementedError("PerseusSyncBatchNorm supports CPU arrays only")
        return _SyncBatchNormOp(self._key, self._scope, self._eps, self._momentum,
                                self._fix_gamma)


def sync_batch_norm_symbol(data, name, comm_scope=0, eps=1e-5, momentum=0.9, fix_gamma=False,
                           **kwargs):
    """A symbolic PerseusSyncBatchNorm (channel axis 1): statistics over the ranks of
    this node (comm_scope=0) or all ranks (1). `name` is required: it names the
    layer's parameters and its requests."""
    if not name:
        raise ValueError("sync_batch_norm_symbol needs a name (the same on every rank)")
    _sbn.check_comm_scope(comm_scope)
    # Variables with their initializers attached, as BatchNorm's get them (MXNet's
    # initializers know no default for a custom op's auxiliary states).
    inputs = [mx.sym.Variable(name + suffix, init=init) for suffix, init in
              (("_gamma", mx.init.One()), ("_beta", mx.init.Zero()),
               ("_moving_mean", mx.init.Zero()), ("_moving_var", mx.init.One()))]
    return mx.sym.Custom(data, *inputs, op_type=OP_TYPE, name=name,
                         key="perseus_sync_bn.%s" % name,
                         comm_scope=comm_scope, eps=eps, momentum=momentum, fix_gamma=fix_gamma,
                         **kwargs)


mx.sym.contrib.PerseusSyncBatchNorm = sync_batch_norm_symbol
