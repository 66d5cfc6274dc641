"""torch.distributed's collectives, with torch's signatures and in-place semantics,
over perseus.torch.mpi_ops.

Each call is one Perseus request (validated by mpi_ops and the core; mismatches
across ranks raise on every rank). Results land in the caller's tensors, as in
torch: in place for all_reduce and broadcast, into the given output tensor or list
otherwise. async_op=True returns a Work (wait(), is_completed(), get_future());
async_op=False returns None. `src` and `dst` ranks are global ranks, as in torch.
A process outside `group` skips the call with a warning, as torch does.

A Perseus addition: `name` (keyword only) names the request, as Horovod's name does,
so the core agrees on a repeated call by its cached bit instead of its metadata
(the "perseus" backend passes names; see backend.py).
"""

import warnings

import torch

from perseus.common.ops import integer
from perseus.torch import adapter as _adapter
from perseus.torch import functions as _functions
from perseus.torch import mpi_ops as _mpi_ops
from perseus.torch.distributed.process_group import process_set_of
from perseus.torch.distributed.reduce_op import ReduceOp, core_op
from perseus.torch.distributed.work import Work


def _member_set(group, what):
    """The group's process set, or None (after a warning) when this rank is outside."""
    process_set = process_set_of(group)
    if process_set.rank() < 0:
        warnings.warn("%s: this rank is not a member of %r; the call does nothing"
                      % (what, group), stacklevel=3)
        return None
    return process_set


def _run(handle, outputs, finish, async_op):
    """Waits (or returns a Work) for an async mpi_ops handle; finish(value) moves the
    core's result into the caller's outputs."""
    work = Work(handle, outputs, finish)
    if async_op:
        return work
    work.wait()
    return None


def _tensors(what, **arguments):
    """A TypeError, as torch raises, for an argument that is not a tensor (the
    collectives below use their tensors before mpi_ops would look)."""
    for name, value in arguments.items():
        if not isinstance(value, torch.Tensor):
            raise _adapter.not_a_tensor(what, name, value)


def _same_tensor_shapes(tensors, like, what):
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: entry %d is a %s, not a tensor" % (what, i, type(t).__name__))
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError("%s: entry %d has shape %s and dtype %s; every entry needs the "
                             "input's shape %s and dtype %s" % (what, i, tuple(t.shape), t.dtype,
                                                                tuple(like.shape), like.dtype))


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *, name=None):
    """Reduces `tensor` over the group, in place."""
    code = core_op(op)
    process_set = _member_set(group, "all_reduce")
    if process_set is None:
        return None
    if not async_op:
        _mpi_ops.allreduce_(tensor, name=name, op=code, process_set=process_set)
        return None
    return Work(_mpi_ops.allreduce_async_(tensor, name=name, op=code, process_set=process_set),
                [tensor])


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, *, name=None):
    """Overwrites `tensor` with rank `src`'s (global rank; or `group_src`, the rank
    within the group)."""
    process_set = _member_set(group, "broadcast")
    if process_set is None:
        return None
    if (src is None) == (group_src is None):
        raise ValueError("broadcast: pass exactly one of src (global rank) and group_src")
    if group_src is not None:
        group_src = integer(group_src, "broadcast group_src")
        if not 0 <= group_src < process_set.size():
            raise ValueError("broadcast: group_src %d is outside the group's %d ranks"
                             % (group_src, process_set.size()))
        src = process_set.ranks[group_src]
    src = integer(src, "broadcast src")
    if not async_op:
        _mpi_ops.broadcast_(tensor, src, name=name, process_set=process_set)
        return None
    return Work(_mpi_ops.broadcast_async_(tensor, src, name=name, process_set=process_set),
                [tensor])


def all_gather(tensor_list, tensor, group=None, async_op=False, *, name=None):
    """Fills tensor_list[i] with rank i's `tensor` (every rank's has the same shape)."""
    _tensors("all_gather", tensor=tensor)
    process_set = _member_set(group, "all_gather")
    if process_set is None:
        return None
    if len(tensor_list) != process_set.size():
        raise ValueError("all_gather: tensor_list has %d tensors; it needs one per rank of the "
                         "group (%d)" % (len(tensor_list), process_set.size()))
    _same_tensor_shapes(tensor_list, tensor, "all_gather tensor_list")
    # One row per rank: the core concatenates along dim 0.
    handle = _mpi_ops.allgather_async(tensor.reshape((1,) + tuple(tensor.shape)),
                                      name=name, process_set=process_set)

    def finish(gathered):
        torch._foreach_copy_(list(tensor_list), list(gathered.unbind(0)))

    return _run(handle, list(tensor_list), finish, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           name=None):
    """Concatenates every rank's input into output_tensor, in rank order: output is
    (world * d0, ...) or (world, *input.shape)."""
    _tensors("all_gather_into_tensor", output_tensor=output_tensor, input_tensor=input_tensor)
    process_set = _member_set(group, "all_gather_into_tensor")
    if process_set is None:
        return None
    size = process_set.size()
    if output_tensor.numel() != size * input_tensor.numel() or \
            output_tensor.dtype != input_tensor.dtype:
        raise ValueError("all_gather_into_tensor: the output (shape %s, %s) must hold %d inputs "
                         "of shape %s and dtype %s" % (tuple(output_tensor.shape),
                                                       output_tensor.dtype, size,
                                                       tuple(input_tensor.shape),
                                                       input_tensor.dtype))
    handle = _mpi_ops.allgather_async(input_tensor.reshape(1, -1), name=name,
                                      process_set=process_set)

    def finish(gathered):
        output_tensor.copy_(gathered.view(output_tensor.shape))

    return _run(handle, [output_tensor], finish, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          name=None):
    """Reduces `input` (world equal chunks, in rank order) over the group; this rank's
    chunk of the result goes to `output`."""
    _tensors("reduce_scatter_tensor", output=output, input=input)
    code = core_op(op)
    process_set = _member_set(group, "reduce_scatter_tensor")
    if process_set is None:
        return None
    size = process_set.size()
    if input.numel() != size * output.numel() or output.dtype != input.dtype:
        raise ValueError("reduce_scatter_tensor: the input (shape %s, %s) must hold %d chunks "
                         "of the output's shape %s and dtype %s" % (tuple(input.shape),
                                                                    input.dtype, size,
                                                                    tuple(output.shape),
                                                                    output.dtype))
    handle = _mpi_ops.reducescatter_async(input.reshape(size, -1), name=name, op=code,
                                          process_set=process_set)

    def finish(mine):
        output.copy_(mine.view(output.shape))

    return _run(handle, [output], finish, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, name=None):
    """Sends input_split_sizes[i] rows of `input` (dim 0, in order; None: equal
    parts) to rank i and writes what every rank sent here into `output`, in rank
    order (output_split_sizes[i] rows from rank i)."""
    _tensors("all_to_all_single", output=output, input=input)
    process_set = _member_set(group, "all_to_all_single")
    if process_set is None:
        return None
    if output.dtype != input.dtype:
        raise ValueError("all_to_all_single: output dtype %s differs from input dtype %s"
                         % (output.dtype, input.dtype))
    size = process_set.size()
    if input_split_sizes is None and input.dim() > 0 and input.shape[0] % size:
        raise ValueError("all_to_all_single: input's first dimension %d does not split evenly "
                         "over %d ranks; pass input_split_sizes" % (input.shape[0], size))
    expected_rows = None
    if output_split_sizes is not None:
        output_split_sizes = [int(s) for s in output_split_sizes]
        if len(output_split_sizes) != size:
            raise ValueError("all_to_all_single: output_split_sizes has %d entries for %d ranks"
                             % (len(output_split_sizes), size))
        expected_rows = sum(output_split_sizes)
        if output.dim() == 0 or output.shape[0] != expected_rows:
            raise ValueError("all_to_all_single: output_split_sizes sum to %d rows but the "
                             "output has shape %s" % (expected_rows, tuple(output.shape)))
    handle = _mpi_ops.alltoall_async(input, splits=input_split_sizes, name=name,
                                     process_set=process_set)

    def finish(value):
        received, splits = value
        if output_split_sizes is not None and splits.tolist() != output_split_sizes:
            raise ValueError("all_to_all_single: received %s rows from the ranks, but "
                             "output_split_sizes is %s" % (splits.tolist(), output_split_sizes))
        if received.shape != output.shape:
            raise ValueError("all_to_all_single: received shape %s, the output has shape %s"
                             % (tuple(received.shape), tuple(output.shape)))
        output.copy_(received)

    return _run(handle, [output], finish, async_op)


def barrier(group=None, async_op=False, device_ids=None):
    """Blocks until every rank of the group has reached it. With async_op=True the
    barrier still completes before returning (the returned Work is done)."""
    process_set = _member_set(group, "barrier")
    if process_set is None:
        return None
    _mpi_ops.barrier(process_set=process_set)
    return Work.completed([]) if async_op else None


def all_gather_object(object_list, obj, group=None):
    """Fills object_list[i] with rank i's picklable `obj`."""
    process_set = _member_set(group, "all_gather_object")
    if process_set is None:
        return None
    if len(object_list) != process_set.size():
        raise ValueError("all_gather_object: object_list has %d entries; it needs one per rank "
                         "of the group (%d)" % (len(object_list), process_set.size()))
    object_list[:] = _functions.allgather_object(obj, process_set=process_set)
    return None


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replaces object_list's entries with rank src's (picklable objects)."""
    process_set = _member_set(group, "broadcast_object_list")
    if process_set is None:
        return None
    if (src is None) == (group_src is None):
        raise ValueError("broadcast_object_list: pass exactly one of src and group_src")
    if group_src is not None:
        src = process_set.ranks[integer(group_src, "broadcast_object_list group_src")]
    object_list[:] = _functions.broadcast_object(list(object_list), src, process_set=process_set)
    return None


def broadcast_optimizer_state(optimizer, root_rank, group=None):
    """Makes every rank's optimizer state and hyperparameters equal root_rank's
    (perseus.torch.functions.broadcast_optimizer_state)."""
    _functions.broadcast_optimizer_state(optimizer, root_rank, process_set=process_set_of(group))
