"""torch.distributed's collectives, with torch's signatures and in-place semantics,
over the torch operations layer (perseus/torch/ops/torch_api.py, which the c10d backend
shares).

Each call is one Perseus request (validated by the adapter and the core; mismatches
across ranks raise on every rank). Results land in the caller's tensors, as in
torch: in place for all_reduce, broadcast and reduce's root, into the given output
tensor or list otherwise. Complex tensors travel as their real views, as torch sends
them (ops.as_sent). async_op=True returns a Work (wait(), is_completed(),
get_future()); async_op=False returns None. `src` and `dst` ranks are global ranks, as
in torch, or group_src and group_dst ranks within the group. A process outside `group`
skips the call with a warning, as torch does. Point-to-point calls are in
point_to_point.py.

A Perseus addition: `name` (keyword only) names the request, as Horovod's name does,
so the core agrees on a repeated call by its cached bit instead of its metadata
(the c10d backend passes names; see perseus/torch/c10d/backend.py).
"""

import torch

from perseus.common import basics as _basics
from perseus.common import objects as _objects
from perseus.torch import ops as _ops
from perseus.torch.distributed.arguments import DESTINATION, member_set, root
from perseus.torch.distributed.process_group import bound_of, process_set_of
from perseus.torch.ops import state as _state
from perseus.torch.ops import timeouts as _timeouts
from perseus.torch.ops import torch_api as _torch_api
from perseus.torch.ops.reduce_ops import ReduceOp, core_op


def _done(work, async_op, group):
    """The Work, under the group's timeout, for async_op=True; else waits for it and
    returns None, as torch."""
    _timeouts.bounded(work, bound_of(group))
    if async_op:
        return work
    work.wait()
    return None


def _deadline(group):
    """The group's timeout from now, for a call run to completion at once."""
    return _timeouts.deadline(bound_of(group))


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, *, name=None):
    """Reduces `tensor` over the group, in place (a complex one by SUM or AVG only)."""
    code = core_op(op, tensor)
    tensor = _ops.as_sent(tensor, code, "all_reduce")
    process_set = member_set(group, "all_reduce")
    if process_set is None:
        return None
    if getattr(tensor, "layout", None) is torch.sparse_coo:  # summed as gloo sums it
        return _done(_torch_api.all_reduce_sparse(tensor, code, process_set, name,
                                                  not async_op), async_op, group)
    if not async_op:
        _ops.allreduce_now_(tensor, process_set, code, name, bound=_deadline(group))
        return None
    return _timeouts.bounded(_torch_api.all_reduce(tensor, code, process_set, name),
                             bound_of(group))


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, *, name=None):
    """Overwrites `tensor` with rank `src`'s (global rank; or `group_src`, the rank
    within the group)."""
    process_set = member_set(group, "broadcast")
    if process_set is None:
        return None
    src = root(process_set, src, group_src, "broadcast")
    tensor = _ops.as_sent(tensor)
    if not async_op:
        _ops.broadcast_now_(tensor, src, process_set, name, bound=_deadline(group))
        return None
    return _timeouts.bounded(_torch_api.broadcast(tensor, src, process_set, name),
                             bound_of(group))


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None, *,
           name=None):
    """Reduces `tensor` over the group into rank `dst`'s (global rank; or `group_dst`,
    the rank within the group), in place; the other ranks' tensors are left as they
    were."""
    _torch_api.tensors_only("reduce", tensor=tensor)
    code = core_op(op, tensor)
    process_set = member_set(group, "reduce")
    if process_set is None:
        return None
    dst = root(process_set, dst, group_dst, "reduce", DESTINATION)
    return _done(_torch_api.reduce(tensor, dst, code, process_set, name, not async_op,
                                   _deadline(group)), async_op, group)


def all_gather(tensor_list, tensor, group=None, async_op=False, *, name=None):
    """Fills tensor_list[i] with rank i's `tensor` (every rank's has the same shape)."""
    _torch_api.tensors_only("all_gather", tensor=tensor)
    process_set = member_set(group, "all_gather")
    if process_set is None:
        return None
    return _done(_torch_api.all_gather(tensor_list, tensor, process_set, name), async_op,
                 group)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           name=None):
    """Concatenates every rank's input into output_tensor, in rank order: output is
    (world * d0, ...) or (world, *input.shape)."""
    _torch_api.tensors_only("all_gather_into_tensor", output_tensor=output_tensor,
                            input_tensor=input_tensor)
    process_set = member_set(group, "all_gather_into_tensor")
    if process_set is None:
        return None
    return _done(_torch_api.all_gather_into_tensor(output_tensor, input_tensor, process_set,
                                                   name), async_op, group)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          name=None):
    """Reduces `input` (world equal chunks, in rank order) over the group; this rank's
    chunk of the result goes to `output`."""
    _torch_api.tensors_only("reduce_scatter_tensor", output=output, input=input)
    code = core_op(op, input)
    process_set = member_set(group, "reduce_scatter_tensor")
    if process_set is None:
        return None
    return _done(_torch_api.reduce_scatter_tensor(output, input, code, process_set, name),
                 async_op, group)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, *,
                   name=None):
    """Reduces input_list (one tensor per rank of the group, each of the output's
    elements) over the group; this rank's entry of the result goes to `output`."""
    _torch_api.tensors_only("reduce_scatter", output=output)
    code = core_op(op, output)
    process_set = member_set(group, "reduce_scatter")
    if process_set is None:
        return None
    return _done(_torch_api.reduce_scatter(output, input_list, code, process_set, name),
                 async_op, group)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None, *,
           name=None):
    """Fills rank dst's gather_list[i] with group rank i's `tensor`. dst is a global rank
    (or `group_dst`, the rank within the group; neither: rank 0); only dst passes
    gather_list."""
    _torch_api.tensors_only("gather", tensor=tensor)
    process_set = member_set(group, "gather")
    if process_set is None:
        return None
    dst = root(process_set, dst, group_dst, "gather", DESTINATION, default=0)
    return _done(_torch_api.gather(gather_list, tensor, dst, process_set, name), async_op,
                 group)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, *,
            name=None):
    """Fills `tensor` with rank src's scatter_list[i], i this rank's place in the group.
    src is a global rank (or `group_src`, the rank within the group; neither: rank 0);
    only src passes scatter_list."""
    _torch_api.tensors_only("scatter", tensor=tensor)
    process_set = member_set(group, "scatter")
    if process_set is None:
        return None
    src = root(process_set, src, group_src, "scatter", default=0)
    return _done(_torch_api.scatter(tensor, scatter_list, src, process_set, name), async_op,
                 group)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, *,
               name=None):
    """Sends input_tensor_list[i] to group rank i and fills output_tensor_list[i] with what
    group rank i sent here."""
    process_set = member_set(group, "all_to_all")
    if process_set is None:
        return None
    return _done(_torch_api.all_to_all(output_tensor_list, input_tensor_list, process_set,
                                       name), async_op, group)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, name=None):
    """Sends input_split_sizes[i] rows of `input` (dim 0, in order; None: equal
    parts) to rank i and writes what every rank sent here into `output`, in rank
    order (output_split_sizes[i] rows from rank i)."""
    _torch_api.tensors_only("all_to_all_single", output=output, input=input)
    process_set = member_set(group, "all_to_all_single")
    if process_set is None:
        return None
    return _done(_torch_api.all_to_all_single(output, input, output_split_sizes,
                                              input_split_sizes, process_set, name),
                 async_op, group)


def barrier(group=None, async_op=False, device_ids=None):
    """Blocks until every rank of the group has reached it. With async_op=True the
    barrier still completes before returning (the returned Work is done)."""
    process_set = member_set(group, "barrier")
    if process_set is None:
        return None
    work = _timeouts.bounded(_torch_api.barrier(process_set), bound_of(group))
    work.wait()
    return work if async_op else None


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that fails after `timeout` (a timedelta; None: torch's default of 30
    minutes) unless every rank of the group has reached it: group rank 0's error names
    the first rank that had not (every one: wait_all_ranks), as gloo's does; the other
    ranks' say that they reached it. After a failure the ranks' calls no longer line up:
    end the job, or destroy the group and make a new one."""
    process_set = member_set(group, "monitored_barrier")
    if process_set is None:
        return None
    seconds = _timeouts.monitored_seconds(timeout)
    _timeouts.answer_within(process_set, seconds)
    work = _timeouts.bounded(_torch_api.barrier(process_set),
                             _timeouts.monitored_bound(seconds))
    _timeouts.wait_monitored(work, process_set, seconds, wait_all_ranks)
    return None


def all_gather_object(object_list, obj, group=None):
    """Fills object_list[i] with rank i's picklable `obj` (entries past the group's
    size are left as they are, as torch leaves them)."""
    process_set = member_set(group, "all_gather_object")
    if process_set is None:
        return None
    if len(object_list) < process_set.size():
        raise ValueError("all_gather_object: object_list has %d entries; it needs one per rank "
                         "of the group (%d)" % (len(object_list), process_set.size()))
    object_list[:process_set.size()] = _objects.allgather_object(obj, process_set=process_set)
    return None


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Fills rank dst's object_gather_list[i] with group rank i's picklable `obj`. dst is
    a global rank (or `group_dst`; neither: rank 0); only dst passes the list."""
    process_set = member_set(group, "gather_object")
    if process_set is None:
        return None
    dst = root(process_set, dst, group_dst, "gather_object", DESTINATION, default=0)
    _only_at_root(object_gather_list, dst, process_set, "gather_object", "object_gather_list")
    gathered = _objects.gather_object(obj, dst, process_set=process_set)
    if gathered is not None:
        object_gather_list[:] = gathered
    return None


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """Puts rank src's scatter_object_input_list[i] (picklable objects, one per rank of the
    group) in scatter_object_output_list[0] on group rank i. src is a global rank (or
    `group_src`; neither: rank 0)."""
    process_set = member_set(group, "scatter_object_list")
    if process_set is None:
        return None
    src = root(process_set, src, group_src, "scatter_object_list", default=0)
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("scatter_object_list: scatter_object_output_list must be a list of at "
                         "least one entry, got %r" % (scatter_object_output_list,))
    objects = None
    if _is_rank(src):
        if scatter_object_input_list is None:
            raise ValueError("scatter_object_list: the source rank %d must pass "
                             "scatter_object_input_list" % src)
        objects = list(scatter_object_input_list)
        if len(objects) != process_set.size():
            raise ValueError("scatter_object_list: scatter_object_input_list has %d objects; it "
                             "needs one per rank of the group (%d)"
                             % (len(objects), process_set.size()))
    scatter_object_output_list[0] = _objects.scatter_object(objects, src,
                                                            process_set=process_set)
    return None


def _is_rank(global_rank):
    return _basics.rank() == global_rank


def _only_at_root(object_list, root, process_set, what, argument):
    """torch's rule for an object list that only the root passes: a list of one entry
    per rank of the group there, none elsewhere."""
    if _is_rank(root):
        if not isinstance(object_list, list) or len(object_list) != process_set.size():
            raise ValueError("%s: rank %d (the root) must pass %s, a list of one entry per rank "
                             "of the group (%d), got %r" % (what, root, argument,
                                                            process_set.size(), object_list))
    elif object_list:
        raise ValueError("%s: %s must not be given on rank %d, which is not the root (rank %d)"
                         % (what, argument, _basics.rank(), root))


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replaces object_list's entries with rank src's (picklable objects)."""
    process_set = member_set(group, "broadcast_object_list")
    if process_set is None:
        return None
    src = root(process_set, src, group_src, "broadcast_object_list")
    object_list[:] = _objects.broadcast_object(list(object_list), src, process_set=process_set)
    return None


def broadcast_optimizer_state(optimizer, root_rank, group=None):
    """Makes every rank's optimizer state and hyperparameters equal root_rank's
    (perseus.torch.ops.state.broadcast_optimizer_state)."""
    _state.broadcast_optimizer_state(optimizer, root_rank, process_set=process_set_of(group))
