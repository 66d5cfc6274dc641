"""Differentiable synchronous collectives: autograd Functions over the torch operations
layer (perseus/torch/ops/).

The functions at the bottom take autograd's path only when an input requires grad
(autograd adds microseconds we do not spend on plain tensors); mpi_ops' Horovod
API calls them, and so do the backward passes here (so double backward works).
Gradients follow Horovod's conventions so ported training code computes the same
numbers:
  allreduce     -> allreduce of the gradient with the same op and scale factors
  allgather     -> Average-allreduce of the gradient, then this rank's rows
  broadcast     -> Average-allreduce of the gradient on the root, zeros elsewhere
  alltoall      -> alltoall of the gradient with the received splits
  reducescatter -> allgather of the gradient, times prescale*postscale, and times
                   the set size for op=Sum (Horovod's convention: like allgather's
                   gradient, it is size times the exact derivative, which data-
                   parallel training's averaging then cancels)
Backward collectives are unnamed, so every rank must run backward in the same
order, as with Horovod.
"""

import torch

from perseus.common import builder as _builder
from perseus.common import ops as _ops
from perseus.common.ops import Average
from perseus.torch import ops as _tops

_synchronize = _tops.synchronize
_grad_enabled = torch.is_grad_enabled


class Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return _synchronize(_tops.allreduce((tensor,), process_set, op, name, prescale, postscale))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        if op == _ops.Adasum:
            raise NotImplementedError(_ops.ADASUM_HAS_NO_GRADIENT)
        return (allreduce(grad, None, op, prescale, postscale, process_set),
                None, None, None, None, None)


class GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(_synchronize(_tops.allreduce(tensors, process_set, op, name, prescale,
                                                  postscale, grouped=True)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        if op == _ops.Adasum:
            raise NotImplementedError(_ops.ADASUM_HAS_NO_GRADIENT)
        reduced = grouped_allreduce(list(grads), None, op, prescale, postscale, process_set)
        return (None,) * 5 + tuple(reduced)


def _row_offsets(rows, process_set):
    """Where this rank's rows start in the gathered tensors: one per input."""
    all_rows = allgather(torch.tensor([rows], dtype=torch.int64), None, process_set)
    return all_rows[:process_set.rank()].sum(0).tolist()


class Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        output = _synchronize(_tops.allgather((tensor,), process_set, name))
        ctx.rows = tensor.shape[0]
        ctx.process_set = process_set
        return output

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, None, Average, 1.0, 1.0, ctx.process_set)
        offset, = _row_offsets([ctx.rows], ctx.process_set)
        return reduced.narrow(0, offset, ctx.rows), None, None


class GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        outputs = _synchronize(_tops.allgather(tensors, process_set, name, grouped=True))
        ctx.rows = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce(list(grads), None, Average, 1.0, 1.0, ctx.process_set)
        offsets = _row_offsets(ctx.rows, ctx.process_set)
        return (None, None) + tuple(g.narrow(0, offset, rows)
                                    for g, offset, rows in zip(reduced, offsets, ctx.rows))


class Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.set_root = _builder.root_in_set(process_set, root_rank)
        ctx.process_set = process_set
        return _synchronize(_tops.broadcast((tensor,), root_rank, process_set, name))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, None, Average, 1.0, 1.0, ctx.process_set)
        if ctx.process_set.rank() != ctx.set_root:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


class Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _synchronize(_tops.alltoall(tensor, process_set, splits, name))
        ctx.mark_non_differentiable(received)
        ctx.received = received
        ctx.process_set = process_set
        return output, received

    @staticmethod
    def backward(ctx, grad, _):
        grad_input, _ = alltoall(grad, ctx.received, None, ctx.process_set)
        return grad_input, None, None, None


def _scatter_grad_scale(op, prescale, postscale, process_set):
    scale = prescale * postscale
    if op == _ops.Sum:
        scale *= process_set.size()
    return scale


class Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.scale = _scatter_grad_scale(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return _synchronize(_tops.reducescatter((tensor,), process_set, op, name, prescale,
                                                postscale))

    @staticmethod
    def backward(ctx, grad):
        gathered = allgather(grad, None, ctx.process_set)
        if ctx.scale != 1.0:
            gathered = gathered * ctx.scale
        return gathered, None, None, None, None, None


class GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):
        ctx.scale = _scatter_grad_scale(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return tuple(_synchronize(_tops.reducescatter(tensors, process_set, op, name, prescale,
                                                      postscale, grouped=True)))

    @staticmethod
    def backward(ctx, *grads):
        gathered = grouped_allgather(list(grads), None, ctx.process_set)
        if ctx.scale != 1.0:
            gathered = [g * ctx.scale for g in gathered]
        return (None,) * 5 + tuple(gathered)


# ---- the synchronous collectives, through autograd when an input requires grad ----
# They read requires_grad unchecked (the hot path): an AttributeError there means
# that something other than a tensor was passed, and _refuse() says so.

def _refuse(op_type, tensors, grouped=False):
    _tops.refuse_non_tensors(_ops.OP_TYPE_NAMES[op_type], tensors, grouped)


def _tracked(op_type, tensor):
    """Whether autograd records this collective of one tensor (it requires grad, in grad mode)."""
    try:
        return tensor.requires_grad and _grad_enabled()
    except AttributeError:
        _refuse(op_type, (tensor,))
        raise


def _requires_grad(op_type, tensors):
    if not _grad_enabled():
        return False
    try:
        for tensor in tensors:
            if tensor.requires_grad:
                return True
    except AttributeError:
        _refuse(op_type, tensors, True)
        raise
    return False


def allreduce(tensor, name, op, prescale, postscale, process_set):
    if _tracked(_ops.ALLREDUCE, tensor):
        return Allreduce.apply(tensor, name, op, prescale, postscale, process_set)
    return _synchronize(_tops.allreduce((tensor,), process_set, op, name, prescale, postscale,
                                         drive=True))


def grouped_allreduce(tensors, name, op, prescale, postscale, process_set):
    if _requires_grad(_ops.ALLREDUCE, tensors):
        return list(GroupedAllreduce.apply(name, op, prescale, postscale, process_set, *tensors))
    return _synchronize(_tops.allreduce(tensors, process_set, op, name, prescale, postscale,
                                         grouped=True, drive=True))


def allgather(tensor, name, process_set):
    if _tracked(_ops.ALLGATHER, tensor):
        return Allgather.apply(tensor, name, process_set)
    return _synchronize(_tops.allgather((tensor,), process_set, name, drive=True))


def grouped_allgather(tensors, name, process_set):
    if _requires_grad(_ops.ALLGATHER, tensors):
        return list(GroupedAllgather.apply(name, process_set, *tensors))
    return _synchronize(_tops.allgather(tensors, process_set, name, grouped=True, drive=True))


def broadcast(tensor, root_rank, name, process_set):
    if _tracked(_ops.BROADCAST, tensor):
        return Broadcast.apply(tensor, root_rank, name, process_set)
    return _synchronize(_tops.broadcast((tensor,), root_rank, process_set, name, drive=True))


def alltoall(tensor, splits, name, process_set):
    if _tracked(_ops.ALLTOALL, tensor):
        return Alltoall.apply(tensor, splits, name, process_set)
    return _synchronize(_tops.alltoall(tensor, process_set, splits, name, drive=True))


def reducescatter(tensor, name, op, prescale, postscale, process_set):
    if _tracked(_ops.REDUCESCATTER, tensor):
        return Reducescatter.apply(tensor, name, op, process_set, prescale, postscale)
    return _synchronize(_tops.reducescatter((tensor,), process_set, op, name, prescale, postscale,
                                             drive=True))


def grouped_reducescatter(tensors, name, op, prescale, postscale, process_set):
    if _requires_grad(_ops.REDUCESCATTER, tensors):
        return list(GroupedReducescatter.apply(name, op, process_set, prescale, postscale,
                                               *tensors))
    return _synchronize(_tops.reducescatter(tensors, process_set, op, name, prescale, postscale,
                                             grouped=True, drive=True))
