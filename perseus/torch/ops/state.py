"""Making every rank's training state root's: parameters and buffers, optimizer state.
Horovod's broadcast_parameters and broadcast_optimizer_state (perseus.torch.functions
re-exports them), which the drop-in DDP and perseus.torch.distributed use too.
"""

import torch

from perseus.common import basics as _basics
from perseus.common.builder import default_name as _default_name
from perseus.common.objects import broadcast_object
from perseus.common.process_sets import global_process_set
from perseus.torch import ops as _ops


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every rank's tensors in `params` with root_rank's, in place.

    params: a state_dict (name -> tensor), or a list or other iterable of (name, tensor)
    pairs (model.named_parameters()) or of tensors (model.parameters()); tensors are
    broadcast all at once, then awaited.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        try:
            items = [p if isinstance(p, tuple) else (None, p) for p in params]
        except TypeError:
            raise ValueError("broadcast_parameters: params must be a state_dict or a list of "
                             "(name, tensor), got %s" % type(params).__name__) from None
    handles = []
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError("broadcast_parameters: %r is a %s, not a tensor"
                             % (name, type(tensor).__name__))
        # detach(): the same memory, without autograd's in-place checks on leaves.
        handles.append(_ops.broadcast((tensor.detach(),), root_rank, process_set,
                                      None if name is None else "param." + name, inplace=True))
    for handle in handles:
        _ops.synchronize(handle)


# ---- optimizer state ------------------------------------------------------------

class _Slot:
    """Stands in for a tensor in the pickled skeleton of root's optimizer state.
    cuda: whether root's tensor is on a GPU (each rank then uses its own), so every
    rank broadcasts it from the same kind of device."""
    __slots__ = ("index", "shape", "dtype", "cuda")

    def __init__(self, index, shape, dtype, cuda=False):
        self.index, self.shape, self.dtype, self.cuda = index, shape, dtype, cuda

    def __getstate__(self):
        return (self.index, self.shape, self.dtype, self.cuda)

    def __setstate__(self, state):
        self.index, self.shape, self.dtype, self.cuda = state


def _strip_tensors(value, tensors):
    """`value` with every tensor replaced by a _Slot (appending the tensor)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1, tuple(value.shape), value.dtype, value.is_cuda)
    if isinstance(value, dict):
        return {k: _strip_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_tensors(v, tensors) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_strip_tensors(v, tensors) for v in value)
    return value


def _fill_tensors(value, tensors):
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_tensors(v, tensors) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_fill_tensors(v, tensors) for v in value)
    return value


def _slots(value, found):
    if isinstance(value, _Slot):
        found.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _slots(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _slots(v, found)
    return found


def _local_gpu(optimizer):
    """This rank's GPU for root's CUDA state: that of the optimizer's parameters,
    else torch's current device. (load_state_dict then moves each tensor to its
    parameter's device, as torch does.)"""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_cuda:
                return p.device
    return torch.device("cuda", torch.cuda.current_device())


def _initialize_state(optimizer):
    """Gives an optimizer without state its state as Horovod does, on every rank: a
    zero gradient for each parameter that requires one, then one step of the wrapped
    optimizer (never DistributedOptimizer's, whose step() would reduce). Unlike
    Horovod, the parameters are put back after that step: with weight decay it
    moves them, each rank by its own hyperparameters, after broadcast_parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]
              if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
        if isinstance(optimizer, torch.optim.SparseAdam):
            p.grad = p.grad.to_sparse()
    with torch.no_grad():
        saved = [p.clone() for p in params]
        # A DistributedOptimizer steps as its wrapped optimizer, without reducing.
        getattr(optimizer, "_step_unreduced", optimizer.step)()
        for p, value in zip(params, saved):
            p.copy_(value)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state and hyperparameters equal root_rank's.

    Covers tensor state (momentum buffers, exp_avg, ...), scalar state (`step`, as a
    tensor or a number) and every param_groups entry (lr, momentum, betas, ...). An
    optimizer without state yet is initialised first, as in Horovod (see
    _initialize_state): afterwards every parameter that requires grad has a zero
    .grad. A stateless optimizer (plain SGD) has nothing to send.

    The structure goes as one pickled object; the tensors are then broadcast in
    place, all at once. `model` is accepted for Horovod compatibility and unused.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state:
        _initialize_state(optimizer)
    is_root = _basics.rank() == root_rank
    tensors = []
    if is_root:
        skeleton = _strip_tensors(optimizer.state_dict(), tensors)
    else:
        skeleton = None
    skeleton = broadcast_object(skeleton, root_rank,
                                name=_default_name("optimizer_state", process_set),
                                process_set=process_set)
    if not is_root:
        slots = _slots(skeleton, [])
        gpu = _local_gpu(optimizer) if any(slot.cuda for slot in slots) else None
        tensors = [torch.empty(slot.shape, dtype=slot.dtype, device=gpu if slot.cuda else "cpu")
                   for slot in slots]
    handles = [_ops.broadcast((t.detach(),), root_rank, process_set, "optimizer_state.%d" % i,
                              inplace=True)
               for i, t in enumerate(tensors)]
    for handle in handles:
        _ops.synchronize(handle)
    if not is_root:
        optimizer.load_state_dict(_fill_tensors(skeleton, tensors))
