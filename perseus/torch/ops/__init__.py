"""The torch operations layer: what every torch face stands on.

Horovod's API (mpi_ops, autograd_ops, functions, the optimizer, SyncBatchNorm,
elastic), the drop-in (perseus.torch.distributed, perseus.torch.nn) and the c10d
backend "perseus" (perseus.torch.c10d) sit side by side above this package and never
import each other (scripts/check_python_layers.py holds that). Here their arguments
are resolved already: `op` is a core reduce-op code (perseus.common.ops), `process_set`
a registered ProcessSet, `name` a user name or None, `root_rank` a global rank. Below it
is the tensor adapter (perseus/torch/adapter.py), the one way into the core.

This module: one function per collective, returning a handle for synchronize() (the
*_now_ ones wait, in place, and return the tensor). Beside it: `work` (torch's Work over
a handle), `reduce_ops` (torch's ReduceOp names as core codes), `torch_api` (the
collectives with torch.distributed's semantics, as Works), `state` (broadcasting
parameters and optimizer state) and `backend_names` (the backends torch knows).
"""

import torch

from perseus.common import ops as _ops
from perseus.common import requests as _requests
from perseus.common.exceptions import CollectiveArgumentError
from perseus.torch import adapter as _adapter
from perseus.torch.ops.reduce_ops import op_name

poll = _adapter.poll
synchronize = _adapter.synchronize
synchronize_all = _requests.synchronize_all
# The torch argument checks every face raises the same way.
not_a_tensor = _adapter.not_a_tensor
refuse_non_tensors = _adapter.refuse_non_tensors


def as_sent(tensor, code=None, what=None):
    """`tensor` as torch.distributed's collectives treat it. Detached, when it requires
    grad: the same memory and version counter, so the write in place still bumps the
    version, but, as torch's collectives, not recorded by autograd, and a leaf that
    requires grad (a parameter a script broadcasts) is written as gloo writes it. A
    complex one as its real view (torch.view_as_real: the same memory, with a last
    dimension of 2 for the real and imaginary parts), for a reduction (`code`) only
    by sum or average, which reduce the parts on their own; any other is refused, as
    torch refuses it (a ValueError) and gloo (a RuntimeError). torch's own functions
    view before they call a backend, except reduce, gather, reduce_scatter and
    point-to-point, which gloo takes complex; DDP's buckets and buffers travel so too.
    A bool one (strided), in a reduction, as its uint8 view (reduce_ops: by MAX for
    "any", MIN for "all", BXOR for parity, which core_op gives for bool tensors)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype is torch.bool and code is not None and tensor.layout is torch.strided:
        if code != _ops.Max and code != _ops.Min and code != _ops.BXOR:
            raise CollectiveArgumentError(
                "%s: bool tensors are reduced logically (any, all, parity), so they cannot "
                "share a call with tensors of other dtypes" % what)
        return tensor.view(torch.uint8)
    if not tensor.is_complex():
        return tensor
    if code is not None and code != _ops.Sum and code != _ops.Average:
        raise CollectiveArgumentError("%s does not support %s on complex tensors"
                                      % (what, op_name(code)))
    return torch.view_as_real(tensor)


def all_as_sent(tensors, code=None, what=None):
    """as_sent() of each of `tensors` (a list; None stays None)."""
    return None if tensors is None else [as_sent(t, code, what) for t in tensors]


def check_tensor(tensor):
    """Raises what a collective of `tensor` would for its device or dtype."""
    _adapter.prepare(tensor)


def allreduce(tensors, process_set, op=_ops.Sum, name=None, prescale=1.0, postscale=1.0,
              inplace=False, grouped=False, drive=False, pin=True, as_tuple=False):
    """Reduces `tensors` (a list: one call; grouped: one unit, the ranks must agree on
    its size) over the set. name: None, a str, or (not grouped) a list of one name per
    tensor. inplace: into the tensors. drive: the caller waits at once (True) or soon
    (requests.SOON). pin, as_tuple: see adapter.submit."""
    return _adapter.submit(_ops.ALLREDUCE, tensors, name, process_set, grouped, inplace=inplace,
                           op=op, prescale=prescale, postscale=postscale, drive=drive, pin=pin,
                           as_tuple=as_tuple)


def allreduce_now_(tensor, process_set, op=_ops.Sum, name=None, prescale=1.0, postscale=1.0,
                   bound=None, failed=None):
    """Reduces one tensor in place and returns it (a repeated named call: one call into
    the core). bound: None or (deadline, reason), a time limit (see
    perseus.common.requests.run); failed: None raises the collective's error, else
    failed(error) gets it and is returned."""
    return _adapter.run_inplace(_ops.ALLREDUCE, tensor, name, process_set, op=op,
                                prescale=prescale, postscale=postscale, bound=bound,
                                failed=failed)


def allgather(tensors, process_set, name=None, grouped=False, drive=False):
    """Concatenates every rank's tensors along dim 0 (ranks may differ in dim 0 only)."""
    return _adapter.submit(_ops.ALLGATHER, tensors, name, process_set, grouped, drive=drive)


def broadcast(tensors, root_rank, process_set, name=None, inplace=False, grouped=False,
              drive=False):
    """root_rank's tensors on every rank of the set (root_rank: a global rank)."""
    return _adapter.submit(_ops.BROADCAST, tensors, name, process_set, grouped, inplace=inplace,
                           root_rank=root_rank, drive=drive)


def broadcast_now_(tensor, root_rank, process_set, name=None, bound=None, failed=None):
    """Overwrites one tensor with root_rank's and returns it (bound, failed: see
    allreduce_now_)."""
    return _adapter.run_inplace(_ops.BROADCAST, tensor, name, process_set, root_rank=root_rank,
                                bound=bound, failed=failed)


def alltoall(tensor, process_set, splits=None, name=None, drive=False):
    """Sends splits[i] rows of `tensor` to rank i of the set (None: even);
    synchronize() gives (output, received splits)."""
    return _adapter.submit(_ops.ALLTOALL, (tensor,), name, process_set, splits=splits,
                           drive=drive)


def reducescatter(tensors, process_set, op=_ops.Sum, name=None, prescale=1.0, postscale=1.0,
                  grouped=False, drive=False):
    """Reduces `tensors` over the set; each rank gets its rows of dim 0."""
    return _adapter.submit(_ops.REDUCESCATTER, tensors, name, process_set, grouped, op=op,
                           prescale=prescale, postscale=postscale, drive=drive)


def barrier(process_set, name=None, drive=True):
    """A handle that completes once every rank of the set has reached the barrier."""
    return _adapter.barrier_async(process_set, name=name, drive=drive)


def point_to_point(recv, tensor, peer, tag, process_set):
    """A message to (or, recv, from) set rank `peer` (recv: -1 for any): a handle whose
    synchronize() gives the peer's set rank."""
    return _adapter.point_to_point(recv, tensor, peer, tag, process_set)


def join():
    """Joins, waits, and returns the rank that joined last (see mpi_ops.join)."""
    return _adapter.join()
