"""DistributedOptimizer and DistributedTrainer: MXNet training with gradients
averaged over the ranks by allreduce in MXNet's engine (Horovod's MXNet API).

Both also take op=Adasum (a Perseus extension: Horovod's MXNet classes have no op):
the gradients are then combined by Adasum, which is not divided by the size."""

import warnings

import mxnet as mx

from perseus.common.ops import Adasum, Average, Sum, check_predivide
from perseus.common.process_sets import global_process_set
from perseus.mxnet.compression import Compression
from perseus.mxnet.mpi_ops import allreduce_, grouped_allreduce_


def _groups(items, num_groups):
    """`items` split into num_groups consecutive groups of near-equal length."""
    size, extra = divmod(len(items), num_groups)
    groups, start = [], 0
    for g in range(num_groups):
        end = start + size + (g < extra)
        if end > start:
            groups.append(items[start:end])
        start = end
    return groups


def _check_op(op, gradient_predivide_factor):
    if op not in (Average, Adasum):
        raise ValueError("the MXNet DistributedOptimizer and DistributedTrainer reduce "
                         "gradients with op=Average or op=Adasum, got %r" % (op,))
    check_predivide(op, gradient_predivide_factor)


def _rescale(op, gradient_predivide_factor, process_set):
    """The factor the caller's rescale_grad takes: Average sums on the wire and
    divides here; Adasum is not divided."""
    return 1.0 if op == Adasum else gradient_predivide_factor / process_set.size()


def _allreduce_grads(grads, names, predivide, num_groups, process_set, compression, op=Average):
    """Sums `grads` over the set in place (prescaled by 1/predivide), in MXNet's
    engine; the caller's rescale_grad finishes the average. With op=Adasum they are
    combined by Adasum instead. Earlier gradients get higher priority, as in Horovod.
    A rank outside `process_set` keeps its own gradients, as Horovod's. Compressed
    gradients travel compressed, also in groups, and are written back, as Horovod's."""
    if process_set.size() == 1 or not grads or not process_set.included():
        return
    prescale = 1.0 / predivide
    wire_op = Adasum if op == Adasum else Sum
    wires, ctxs = zip(*[compression.compress(grad) for grad in grads])
    if num_groups > 0:
        for g, (group, group_names) in enumerate(zip(_groups(list(wires), num_groups),
                                                    _groups(names, num_groups))):
            grouped_allreduce_(group, name="%s.group%d" % (group_names[0], g), priority=-g,
                               op=wire_op, prescale_factor=prescale, process_set=process_set)
    else:
        for i, (wire, name) in enumerate(zip(wires, names)):
            allreduce_(wire, name=name, priority=-i, op=wire_op, prescale_factor=prescale,
                       process_set=process_set)
    if compression is not Compression.none:  # whatever ctx a compressor gives, as Horovod
        for grad, wire, ctx in zip(grads, wires, ctxs):
            restored = compression.decompress(wire, ctx)
            if restored is not grad:
                grad[:] = restored


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an MXNet optimizer: update() first sums the gradients over the process
    set (allreduce, names from the parameter indices), and the wrapped optimizer's
    rescale_grad is multiplied by gradient_predivide_factor / size so the update sees
    the average. Every other attribute is the wrapped optimizer's (read and written),
    but for rescale_grad written to the wrapper (what gluon.Trainer.step writes): as
    in Horovod it stays the wrapper's, so the wrapped optimizer keeps scaling by its
    own rescale_grad (Horovod's examples set 1 / batch size there), with one warning.

    num_groups > 0: the gradients of one update call are reduced in that many grouped
    allreduces instead of one per gradient. op=Adasum: combined by Adasum, and
    rescale_grad is left as it is.
    """

    _OWN = ("_optimizer", "_predivide", "_num_groups", "_process_set", "_op", "_warned")

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=global_process_set, op=Average):
        _check_op(op, gradient_predivide_factor)
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_predivide", float(gradient_predivide_factor))
        object.__setattr__(self, "_num_groups", int(num_groups))
        object.__setattr__(self, "_process_set", process_set)
        object.__setattr__(self, "_op", op)
        object.__setattr__(self, "_warned", False)
        optimizer.rescale_grad *= _rescale(op, gradient_predivide_factor, process_set)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def __setattr__(self, item, value):
        if item == "rescale_grad":
            self._keep_rescale_grad(value)
        elif item in self._OWN:
            object.__setattr__(self, item, value)
        else:
            setattr(self._optimizer, item, value)

    def _keep_rescale_grad(self, value):
        object.__setattr__(self, "rescale_grad", value)
        if value != self._optimizer.rescale_grad and not self._warned:
            object.__setattr__(self, "_warned", True)
            warnings.warn(
                "DistributedOptimizer: rescale_grad=%g written to it (gluon.Trainer.step "
                "writes 1 / batch_size) does not reach the wrapped optimizer, as in Horovod: "
                "the gradients are scaled by the wrapped optimizer's own rescale_grad (%g, "
                "with gradient_predivide_factor / size). Set rescale_grad on the optimizer "
                "you wrap, or use hvd.DistributedTrainer" % (value, self._optimizer.rescale_grad))

    def _do_allreduce(self, index, grad):
        indices = list(index) if isinstance(index, (list, tuple)) else [index]
        grads = list(grad) if isinstance(grad, (list, tuple)) else [grad]
        _allreduce_grads(grads, ["DistributedOptimizer.%s" % i for i in indices],
                         self._predivide, self._num_groups, self._process_set, Compression.none,
                         self._op)

    def update(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)

    def _set_current_context(self, device_id):
        self._optimizer._set_current_context(device_id)

    @property
    def learning_rate(self):
        return self._optimizer.learning_rate


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon.Trainer whose step() averages gradients over the process set with
    allreduce (in MXNet's engine) instead of a KVStore; one process per device.

    compression: hvd.Compression.none or .fp16, or a Compressor of one's own.
    prefix: prepended to the request names, for several trainers.
    op=Adasum: gradients combined by Adasum (not divided by the size).
    """

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0,
                 process_set=global_process_set, op=Average):
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer as its "
                          "optimizer; the wrapped optimizer is used")
        _check_op(op, gradient_predivide_factor)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        if len(self._contexts) > 1:
            raise ValueError("DistributedTrainer drives one device per process; the "
                             "parameters live on %s" % (self._contexts,))
        # Gradients are summed; rescale_grad = _scale / batch_size makes it an average.
        self._scale *= _rescale(op, gradient_predivide_factor, process_set)
        self._op = op
        self._compression = compression
        self._predivide = float(gradient_predivide_factor)
        self._prefix = "" if prefix is None else str(prefix)
        self._num_groups = int(num_groups)
        self._process_set = process_set

    def _allreduce_grads(self):
        grads, names = [], []
        for i, param in enumerate(self._params):
            if param.grad_req != "null":
                grads.append(param.list_grad()[0])
                names.append("DistributedTrainer.%s%d" % (self._prefix, i))
        _allreduce_grads(grads, names, self._predivide, self._num_groups, self._process_set,
                         self._compression, self._op)
