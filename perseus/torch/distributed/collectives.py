"""torch.distributed's collectives, with torch's signatures and in-place semantics,
over the torch operations layer (perseus/torch/ops/torch_api.py, which the c10d backend
shares).

Each call is one Perseus request (validated by the adapter and the core; mismatches
across ranks raise on every rank). Results land in the caller's tensors, as in
torch: in place for all_reduce and broadcast, into the given output tensor or list
otherwise. async_op=True returns a Work (wait(), is_completed(), get_future());
async_op=False returns None. `src` and `dst` ranks are global ranks, as in torch.
A process outside `group` skips the call with a warning, as torch does.

A Perseus addition: `name` (keyword only) names the request, as Horovod's name does,
so the core agrees on a repeated call by its cached bit instead of its metadata
(the c10d backend passes names; see perseus/torch/c10d/backend.py).
"""

import warnings

from perseus.common.objects import allgather_object as _allgather_object
from perseus.common.objects import broadcast_object as _broadcast_object
from perseus.common.ops import integer
from perseus.torch import ops as _ops
from perseus.torch.distributed.process_group import process_set_of
from perseus.torch.ops import state as _state
from perseus.torch.ops import torch_api as _torch_api
from perseus.torch.ops.reduce_ops import ReduceOp, core_op


def _member_set(group, what):
    """The group's process set, or None (after a warning) when this rank is outside."""
    process_set = process_set_of(group)
    if process_set.rank() < 0:
        warnings.warn("%s: this rank is not a member of %r; the call does nothing"
                      % (what, group), stacklevel=3)
        return None
    return process_set


def _done(work, async_op):
    """The Work for async_op=True; else waits for it and returns None, as torch."""
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *, name=None):
    """Reduces `tensor` over the group, in place."""
    code = core_op(op)
    process_set = _member_set(group, "all_reduce")
    if process_set is None:
        return None
    if not async_op:
        _ops.allreduce_now_(tensor, process_set, code, name)
        return None
    return _torch_api.all_reduce(tensor, code, process_set, name)


def _root(process_set, src, group_src, what):
    """The global rank of a root given as `src` (global) or `group_src` (in the group)."""
    if (src is None) == (group_src is None):
        raise ValueError("%s: pass exactly one of src (global rank) and group_src" % what)
    if group_src is not None:
        group_src = integer(group_src, "%s group_src" % what)
        if not 0 <= group_src < process_set.size():
            raise ValueError("%s: group_src %d is outside the group's %d ranks"
                             % (what, group_src, process_set.size()))
        return process_set.ranks[group_src]
    return integer(src, "%s src" % what)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, *, name=None):
    """Overwrites `tensor` with rank `src`'s (global rank; or `group_src`, the rank
    within the group)."""
    process_set = _member_set(group, "broadcast")
    if process_set is None:
        return None
    src = _root(process_set, src, group_src, "broadcast")
    if not async_op:
        _ops.broadcast_now_(tensor, src, process_set, name)
        return None
    return _torch_api.broadcast(tensor, src, process_set, name)


def all_gather(tensor_list, tensor, group=None, async_op=False, *, name=None):
    """Fills tensor_list[i] with rank i's `tensor` (every rank's has the same shape)."""
    _torch_api.tensors_only("all_gather", tensor=tensor)
    process_set = _member_set(group, "all_gather")
    if process_set is None:
        return None
    return _done(_torch_api.all_gather(tensor_list, tensor, process_set, name), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           name=None):
    """Concatenates every rank's input into output_tensor, in rank order: output is
    (world * d0, ...) or (world, *input.shape)."""
    _torch_api.tensors_only("all_gather_into_tensor", output_tensor=output_tensor,
                            input_tensor=input_tensor)
    process_set = _member_set(group, "all_gather_into_tensor")
    if process_set is None:
        return None
    return _done(_torch_api.all_gather_into_tensor(output_tensor, input_tensor, process_set,
                                                   name), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          name=None):
    """Reduces `input` (world equal chunks, in rank order) over the group; this rank's
    chunk of the result goes to `output`."""
    _torch_api.tensors_only("reduce_scatter_tensor", output=output, input=input)
    code = core_op(op)
    process_set = _member_set(group, "reduce_scatter_tensor")
    if process_set is None:
        return None
    return _done(_torch_api.reduce_scatter_tensor(output, input, code, process_set, name),
                 async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, name=None):
    """Sends input_split_sizes[i] rows of `input` (dim 0, in order; None: equal
    parts) to rank i and writes what every rank sent here into `output`, in rank
    order (output_split_sizes[i] rows from rank i)."""
    _torch_api.tensors_only("all_to_all_single", output=output, input=input)
    process_set = _member_set(group, "all_to_all_single")
    if process_set is None:
        return None
    return _done(_torch_api.all_to_all_single(output, input, output_split_sizes,
                                              input_split_sizes, process_set, name), async_op)


def barrier(group=None, async_op=False, device_ids=None):
    """Blocks until every rank of the group has reached it. With async_op=True the
    barrier still completes before returning (the returned Work is done)."""
    process_set = _member_set(group, "barrier")
    if process_set is None:
        return None
    work = _torch_api.barrier(process_set)
    work.wait()
    return work if async_op else None


def all_gather_object(object_list, obj, group=None):
    """Fills object_list[i] with rank i's picklable `obj`."""
    process_set = _member_set(group, "all_gather_object")
    if process_set is None:
        return None
    if len(object_list) != process_set.size():
        raise ValueError("all_gather_object: object_list has %d entries; it needs one per rank "
                         "of the group (%d)" % (len(object_list), process_set.size()))
    object_list[:] = _allgather_object(obj, process_set=process_set)
    return None


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replaces object_list's entries with rank src's (picklable objects)."""
    process_set = _member_set(group, "broadcast_object_list")
    if process_set is None:
        return None
    src = _root(process_set, src, group_src, "broadcast_object_list")
    object_list[:] = _broadcast_object(list(object_list), src, process_set=process_set)
    return None


def broadcast_optimizer_state(optimizer, root_rank, group=None):
    """Makes every rank's optimizer state and hyperparameters equal root_rank's
    (perseus.torch.ops.state.broadcast_optimizer_state)."""
    _state.broadcast_optimizer_state(optimizer, root_rank, process_set=process_set_of(group))
