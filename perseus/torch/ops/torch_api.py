"""torch.distributed's collectives as Works: the semantics both the drop-in
(perseus.torch.distributed) and the c10d backend (perseus.torch.c10d) give them.

Each function checks its arguments as torch does, submits one request (a list or a
coalesced call: one grouped request) and returns a Work whose wait() puts the result
where torch puts it: in place for all_reduce and broadcast, into the given output tensor
or list otherwise. `process_set` is the group's registered set (this rank a member),
`code` a core reduce-op code (reduce_ops.core_op), `root_rank` a global rank, `name` the
request's name or None. Membership, async_op and src/group_src are the faces' business.

`now` says when the caller waits for the Work: False, maybe much later (the engine
thread runs the request meanwhile); True, at once (a synchronous call): the calling
thread drives it from its submission, and all_reduce and broadcast run it to completion
in one call into the core, within `bound` (None or (deadline, reason), see
perseus.common.requests.run), returning a completed Work; requests.SOON, before anything
else of its own needs it (torch's C++ code: DDP's reducer, its buffer broadcasts): the
wait drives it, with whatever was submitted meanwhile. Only False wakes the engine
thread, which with no idle core would take the caller's core.
"""

import torch

from perseus.common.exceptions import CollectiveArgumentError
from perseus.common.ops import Sum as _SUM
from perseus.torch import ops as _ops
from perseus.torch.ops import all_as_sent, as_sent
from perseus.torch.ops.work import Work


def _invalid(message):
    """A bad argument, refused on this rank before anything is sent: a ValueError, as
    torch's own checks raise, and a RuntimeError, as gloo's (CollectiveArgumentError)."""
    return CollectiveArgumentError(message)


def tensors_only(what, **arguments):
    """A TypeError, as torch raises, for an argument that is not a tensor (the
    collectives below use their tensors before the adapter would look)."""
    for name, value in arguments.items():
        if not isinstance(value, torch.Tensor):
            raise _ops.not_a_tensor(what, name, value)


def _same_tensor_shapes(tensors, like, what):
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: entry %d is a %s, not a tensor" % (what, i, type(t).__name__))
        if t.shape != like.shape or t.dtype != like.dtype:
            raise _invalid("%s: entry %d has shape %s and dtype %s; every entry needs the "
                           "input's shape %s and dtype %s" % (what, i, tuple(t.shape), t.dtype,
                                                              tuple(like.shape), like.dtype))


def flat(tensors):
    """One contiguous 1-D tensor holding `tensors` in order (a copy)."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def _scatter_into(targets, flat):
    """Copies consecutive pieces of the 1-D `flat` into `targets`."""
    offset = 0
    for t in targets:
        t.copy_(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()


# ---- reductions ----------------------------------------------------------------------

def all_reduce(tensor, code, process_set, name=None, now=False, bound=None):
    if now is True:
        work = Work.completed([tensor])
        _ops.allreduce_now_(tensor, process_set, code, name, bound=bound, failed=work.failed)
        return work
    return Work(_ops.allreduce((tensor,), process_set, code, name, inplace=True, drive=now),
                [tensor])


def all_reduce_coalesced(tensors, code, process_set, name=None, now=False):
    """One grouped request: the core fuses what fits in a buffer."""
    tensors = list(tensors)
    return Work(_ops.allreduce(tensors, process_set, code, name, inplace=True, grouped=True,
                               drive=now), tensors)


def reduce(tensor, root_rank, code, process_set, name=None, now=False, bound=None):
    """The reduction of every rank's `tensor` into the root's, in place: an allreduce in
    which the other ranks reduce a copy, so their tensor is left as it was."""
    tensor = as_sent(tensor, code, "reduce")
    target = tensor if _is_root(process_set, root_rank) else tensor.clone()
    work = all_reduce(target, code, process_set, name, now, bound)
    work._outputs = [tensor]
    return work


def all_reduce_sparse(tensor, code, process_set, name=None, now=False):
    """The sum of every rank's sparse COO `tensor` (CPU), in its place, coalesced, as
    gloo gives it: one grouped allgather of every rank's size, indices and values (a
    rank's number of entries is its own), added up here. Sizes that differ fail on
    every rank, as each sees them all."""
    if code != _SUM:
        raise CollectiveArgumentError("all_reduce of a sparse tensor: only ReduceOp.SUM is "
                                      "supported (as with gloo)")
    if tensor.device.type != "cpu":
        raise CollectiveArgumentError("all_reduce of a sparse tensor: CPU tensors only, got "
                                      "one on %s" % tensor.device)
    shape = torch.tensor([list(tensor.shape)], dtype=torch.int64)  # one row per rank

    def finish(gathered):
        shapes, indices, values = gathered
        if not bool((shapes == shapes[0]).all()):
            raise CollectiveArgumentError("all_reduce of sparse tensors: the ranks' sizes "
                                          "differ: %s" % shapes.tolist())
        total = torch.sparse_coo_tensor(indices.t(), values, tensor.shape).coalesce()
        tensor.copy_(total)  # in place, though its number of entries changes

    # dim 0 of the indices and values runs over the entries: what allgather concatenates
    parts = (shape, tensor._indices().t().contiguous(), tensor._values().contiguous())
    return Work(_ops.allgather(parts, process_set, name, grouped=True, drive=now), [tensor],
                finish)


def reduce_scatter_tensor(output, input, code, process_set, name=None, now=False):
    """Reduces `input` (set size equal chunks, in rank order); this rank's chunk of the
    result goes to `output`."""
    what = "reduce_scatter_tensor"
    output, input = as_sent(output, code, what), as_sent(input, code, what)
    tensors_only("reduce_scatter_tensor", output=output, input=input)
    size = process_set.size()
    if input.numel() != size * output.numel() or output.dtype != input.dtype:
        raise _invalid("reduce_scatter_tensor: the input (shape %s, %s) must hold %d chunks "
                       "of the output's shape %s and dtype %s" % (tuple(input.shape),
                                                                  input.dtype, size,
                                                                  tuple(output.shape),
                                                                  output.dtype))

    def finish(mine):
        output.copy_(mine.view(output.shape))

    return Work(_ops.reducescatter((input.reshape(size, -1),), process_set, code, name,
                                   drive=now), [output], finish)


def reduce_scatter(output, chunks, code, process_set, name=None, now=False):
    """reduce_scatter_tensor of the list `chunks` (one tensor per rank of the set, each
    of the output's elements and dtype), concatenated."""
    what = "reduce_scatter"
    output, chunks = as_sent(output, code, what), all_as_sent(chunks, code, what)
    _entries_like(chunks, output, process_set.size(), "reduce_scatter input_list")
    return reduce_scatter_tensor(output, flat(chunks), code, process_set, name, now)


def reduce_scatter_coalesced(outputs, inputs, code, process_set, name=None, now=False):
    """One grouped reducescatter (FSDP's coalesced gradients)."""
    what = "reduce_scatter_tensor_coalesced"
    outputs, inputs = all_as_sent(outputs, code, what), all_as_sent(inputs, code, what)
    size = process_set.size()
    for output, input in zip(outputs, inputs):
        if input.numel() != size * output.numel() or input.dtype != output.dtype:
            raise _invalid("reduce_scatter_tensor_coalesced: an input of shape %s and %s "
                           "must hold %d chunks of its output's shape %s and dtype %s"
                           % (tuple(input.shape), input.dtype, size,
                              tuple(output.shape), output.dtype))
    outputs = list(outputs)

    def finish(mine):
        for output, piece in zip(outputs, mine):
            output.copy_(piece.view(output.shape))

    return Work(_ops.reducescatter([t.reshape(size, -1) for t in inputs], process_set, code,
                                   name, grouped=True, drive=now), outputs, finish)


# ---- gathers -------------------------------------------------------------------------

def all_gather(tensor_list, tensor, process_set, name=None, now=False):
    """Fills tensor_list[i] with rank i's `tensor` (every rank's has the same shape)."""
    tensor_list, tensor = all_as_sent(tensor_list), as_sent(tensor)
    tensors_only("all_gather", tensor=tensor)
    if len(tensor_list) != process_set.size():
        raise _invalid("all_gather: tensor_list has %d tensors; it needs one per rank of the "
                       "group (%d)" % (len(tensor_list), process_set.size()))
    _same_tensor_shapes(tensor_list, tensor, "all_gather tensor_list")
    targets = list(tensor_list)

    def finish(gathered):
        torch._foreach_copy_(targets, list(gathered.unbind(0)))

    # One row per rank: the core concatenates along dim 0.
    return Work(_ops.allgather((tensor.reshape((1,) + tuple(tensor.shape)),), process_set, name,
                               drive=now), targets, finish)


def all_gather_into_tensor(output, input, process_set, name=None, now=False):
    """Concatenates every rank's input into `output`, in rank order: output is
    (size * d0, ...) or (size, *input.shape)."""
    output, input = as_sent(output), as_sent(input)
    tensors_only("all_gather_into_tensor", output_tensor=output, input_tensor=input)
    size = process_set.size()
    if output.numel() != size * input.numel() or output.dtype != input.dtype:
        raise _invalid("all_gather_into_tensor: the output (shape %s, %s) must hold %d inputs "
                       "of shape %s and dtype %s" % (tuple(output.shape), output.dtype, size,
                                                     tuple(input.shape), input.dtype))

    def finish(gathered):
        output.copy_(gathered.view(output.shape))

    return Work(_ops.allgather((input.reshape(1, -1),), process_set, name, drive=now),
                [output], finish)


def all_gather_coalesced(outputs, inputs, process_set, name=None, now=False):
    """One grouped allgather."""
    outputs, inputs = all_as_sent(outputs), all_as_sent(inputs)
    size = process_set.size()
    for output, input in zip(outputs, inputs):
        if output.numel() != size * input.numel() or output.dtype != input.dtype:
            raise _invalid("all_gather_into_tensor_coalesced: an output of shape %s and %s "
                           "must hold %d inputs of shape %s and dtype %s"
                           % (tuple(output.shape), output.dtype, size, tuple(input.shape),
                              input.dtype))
    outputs = list(outputs)

    def finish(gathered):
        for output, rows in zip(outputs, gathered):
            output.copy_(rows.view(output.shape))

    return Work(_ops.allgather([t.reshape(1, -1) for t in inputs], process_set, name,
                               grouped=True, drive=now), outputs, finish)


def all_gather_lists(output_lists, inputs, process_set, name=None, now=False):
    """torch.distributed.all_gather_coalesced: output_lists[r][i] gets rank r's inputs[i]
    (the inputs of one rank may differ in shape; every rank passes the same shapes).
    One grouped allgather. The checks are gloo's, raised where they fail, before
    anything is sent; a CollectiveArgumentError is a RuntimeError, as gloo raises."""
    what = "all_gather_coalesced"
    size = process_set.size()
    if not inputs:
        raise CollectiveArgumentError("%s: input_tensor_list is empty" % what)
    if len(output_lists) != size:
        raise CollectiveArgumentError("%s: output_tensor_lists has %d lists; it needs one per "
                                      "rank of the group (%d)" % (what, len(output_lists), size))
    for r, outputs in enumerate(output_lists):
        if len(outputs) != len(inputs):
            raise CollectiveArgumentError("%s: output_tensor_lists[%d] has %d tensors for %d "
                                          "inputs" % (what, r, len(outputs), len(inputs)))
        for i, (output, input) in enumerate(zip(outputs, inputs)):
            if output.shape != input.shape or output.dtype != input.dtype:
                raise CollectiveArgumentError(
                    "%s: output_tensor_lists[%d][%d] has shape %s and %s; input %d has shape "
                    "%s and %s" % (what, r, i, tuple(output.shape), output.dtype, i,
                                   tuple(input.shape), input.dtype))
    targets = [list(outputs) for outputs in output_lists]

    def finish(gathered):  # gathered[i]: one row per rank
        for i, rows in enumerate(gathered):
            for outputs, row in zip(targets, rows):
                outputs[i].copy_(row.view(outputs[i].shape))

    work = Work(_ops.allgather([t.reshape(1, -1) for t in inputs], process_set, name,
                               grouped=True, drive=now),
                [t for outputs in targets for t in outputs], finish)
    work._outputs = targets  # the future's value, as gloo's: one list per rank
    return work


def gather(outputs, tensor, root_rank, process_set, name=None, now=False):
    """Fills the root's `outputs` (one tensor per rank of the set, each of `tensor`'s
    elements and dtype) with every rank's `tensor`; the other ranks pass none. An
    alltoall in which every rank sends only to the root."""
    outputs, tensor = all_as_sent(outputs), as_sent(tensor)
    tensors_only("gather", tensor=tensor)
    outputs = _root_only(outputs, root_rank, process_set, "gather", "gather_list")
    if outputs:
        _entries_like(outputs, tensor, process_set.size(), "gather gather_list")
    root = process_set.ranks.index(root_rank)
    splits = [tensor.numel() if r == root else 0 for r in range(process_set.size())]
    return _exchange("gather", tensor, splits, outputs, process_set, name, now,
                     one_per_rank=bool(outputs))


def scatter(output, chunks, root_rank, process_set, name=None, now=False):
    """Fills `output` with the root's chunks[rank] (the root passes one tensor per rank
    of the set, each of the output's elements and dtype; the other ranks pass none). An
    alltoall in which only the root sends."""
    output, chunks = as_sent(output), all_as_sent(chunks)
    tensors_only("scatter", tensor=output)
    chunks = _root_only(chunks, root_rank, process_set, "scatter", "scatter_list")
    size = process_set.size()
    if chunks:
        _entries_like(chunks, output, size, "scatter scatter_list")
        sent, splits = chunks, [output.numel()] * size
    else:
        sent, splits = output.new_empty(0), [0] * size
    return _exchange("scatter", sent, splits, [output], process_set, name, now)


def _is_root(process_set, root_rank):
    return process_set.ranks[process_set.rank()] == root_rank


def _root_only(tensors, root_rank, process_set, what, argument):
    """`tensors` as a list: required (non-empty) on the root, refused elsewhere, as torch
    does."""
    tensors = list(tensors or [])
    if _is_root(process_set, root_rank) and not tensors:
        raise _invalid("%s: %s must be given on the root (rank %d)"
                       % (what, argument, root_rank))
    if not _is_root(process_set, root_rank) and tensors:
        raise _invalid("%s: %s must not be given on rank %d, which is not the root (rank %d)"
                       % (what, argument, process_set.ranks[process_set.rank()], root_rank))
    return tensors


def _entries_like(tensors, like, size, what):
    """Checks that `tensors` is one tensor per rank (`size`), each of `like`'s number of
    elements and dtype."""
    if len(tensors) != size:
        raise _invalid("%s has %d tensors; it needs one per rank of the group (%d)"
                       % (what, len(tensors), size))
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: entry %d is a %s, not a tensor" % (what, i, type(t).__name__))
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise _invalid("%s: entry %d has %d elements of %s; every entry needs %d of %s"
                           % (what, i, t.numel(), t.dtype, like.numel(), like.dtype))


# ---- the rest ------------------------------------------------------------------------

def broadcast(tensor, root_rank, process_set, name=None, now=False, bound=None):
    if now is True:
        work = Work.completed([tensor])
        _ops.broadcast_now_(tensor, root_rank, process_set, name, bound=bound,
                            failed=work.failed)
        return work
    return Work(_ops.broadcast((tensor,), root_rank, process_set, name, inplace=True,
                               drive=now), [tensor])


def all_to_all_single(output, input, output_split_sizes, input_split_sizes, process_set,
                      name=None, now=False):
    """Sends input_split_sizes[i] rows of `input` (dim 0, in order; None: equal parts)
    to rank i and writes what every rank sent here into `output`, in rank order
    (output_split_sizes[i] rows from rank i)."""
    output, input = as_sent(output), as_sent(input)
    tensors_only("all_to_all_single", output=output, input=input)
    if output.dtype != input.dtype:
        raise _invalid("all_to_all_single: output dtype %s differs from input dtype %s"
                       % (output.dtype, input.dtype))
    size = process_set.size()
    if output_split_sizes is not None:
        output_split_sizes = [int(s) for s in output_split_sizes]
        if len(output_split_sizes) != size:
            raise _invalid("all_to_all_single: output_split_sizes has %d entries for %d ranks"
                           % (len(output_split_sizes), size))
        rows = sum(output_split_sizes)
        if output.dim() == 0 or output.shape[0] != rows:
            raise _invalid("all_to_all_single: output_split_sizes sum to %d rows but the "
                           "output has shape %s" % (rows, tuple(output.shape)))

    def finish(value):
        received, splits = value
        if output_split_sizes is not None and splits.tolist() != output_split_sizes:
            raise _invalid("all_to_all_single: received %s rows from the ranks, but "
                           "output_split_sizes is %s" % (splits.tolist(), output_split_sizes))
        if received.shape != output.shape:
            raise _invalid("all_to_all_single: received shape %s, the output has shape %s"
                           % (tuple(received.shape), tuple(output.shape)))
        output.copy_(received)

    # An even split of a first dimension the set does not divide is the core's refusal
    # (perseus_check_rows, asked by the adapter), as for every front end.
    return Work(_ops.alltoall(input, process_set, input_split_sizes, name, drive=now),
                [output], finish)


def all_to_all(outputs, inputs, process_set, name=None, now=False):
    """Sends inputs[i] to rank i and fills outputs[i] with what rank i sent here (one
    tensor per rank of the set each; all of one dtype)."""
    outputs, inputs = all_as_sent(outputs), all_as_sent(inputs)
    size = process_set.size()
    if len(outputs) != size or len(inputs) != size:
        raise _invalid("all_to_all: pass %d input and %d output tensors (one per rank), got "
                       "%d and %d" % (size, size, len(inputs), len(outputs)))
    for what, tensors in (("input", inputs), ("output", outputs)):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError("all_to_all: %s %d is a %s, not a tensor"
                                % (what, i, type(t).__name__))
            if t.dtype != inputs[0].dtype:
                raise _invalid("all_to_all: %s %d is %s, input 0 %s; every tensor needs one "
                               "dtype" % (what, i, t.dtype, inputs[0].dtype))
    return _exchange("all_to_all", list(inputs), [t.numel() for t in inputs], list(outputs),
                     process_set, name, now, one_per_rank=True)


def _exchange(what, tensors, splits, targets, process_set, name=None, now=False,
              one_per_rank=False):
    """An alltoall of `tensors` flattened in order (splits[i] elements to rank i);
    what arrives goes into `targets`, in order: gather, scatter and all_to_all of lists.
    one_per_rank: targets[i] takes exactly what rank i sent."""
    flat_input = flat(tensors) if isinstance(tensors, (list, tuple)) else tensors.reshape(-1)
    expected = [t.numel() for t in targets]

    def finish(value):
        received, sent_here = value
        if one_per_rank and sent_here.tolist() != expected:
            raise _invalid("%s: the ranks sent %s elements here, for outputs of %s"
                           % (what, sent_here.tolist(), expected))
        if received.numel() != sum(expected):
            raise _invalid("%s: received %d elements for outputs of %d"
                           % (what, received.numel(), sum(expected)))
        _scatter_into(targets, received)

    return Work(_ops.alltoall(flat_input, process_set, splits, name, drive=now), targets,
                finish)


def barrier(process_set, name=None):
    return Work(_ops.barrier(process_set, name), [])


# ---- point-to-point ------------------------------------------------------------------

def send(tensor, peer, tag, process_set):
    """To set rank `peer`; not a collective (no name): matched by source and tag (MPI for
    a CPU tensor, the pair's matching before NCCL for a CUDA one)."""
    tensor = as_sent(tensor)
    tensors_only("send", tensor=tensor)
    return Work(_ops.point_to_point(False, tensor, peer, tag, process_set), [tensor])


def recv(tensor, peer, tag, process_set):
    """Into `tensor` from set rank `peer` (-1: any, CPU tensors only); the Work's
    _source_rank() says who sent it, as torch's."""
    tensor = as_sent(tensor)
    tensors_only("recv", tensor=tensor)
    work = Work(_ops.point_to_point(True, tensor, peer, tag, process_set), [tensor])
    work._finish = lambda source: setattr(work, "source", source)
    return work
