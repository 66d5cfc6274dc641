"""Horovod's PyTorch collective API over the torch operations layer (perseus/torch/ops/).

Semantics follow Horovod: non-underscore ops return a new tensor and leave the
input alone (and are differentiable: autograd_ops.py); underscore ops work in
place and return the same tensor; *_async ops return an int handle for
poll()/synchronize(); grouped ops enqueue all their tensors as one unit and
synchronize() to a list. This file resolves arguments (op, compression, lists)
and picks the path; the operations layer and the adapter below it convert tensors,
perseus.common builds requests.
"""

import operator

import torch

from perseus.common import builder as _builder
from perseus.common import ops as _ops
# Horovod's reduce-op names
from perseus.common.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from perseus.common.ops import resolve_op as _resolve_op
from perseus.common.process_sets import global_process_set
from perseus.torch import autograd_ops as _autograd
from perseus.torch import ops as _tops
from perseus.torch.compression import Compression

_compressed = _builder.compressed

poll = _tops.poll
synchronize = _tops.synchronize


def _nonempty(tensors, what):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("%s needs at least one tensor" % what)
    return tensors


# ---- allreduce ------------------------------------------------------------------

def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over the process set into a new tensor; returns a
    handle for poll()/synchronize(). The input is not modified."""
    op = _resolve_op(op, average)
    return _tops.allreduce((tensor,), process_set, op, name, prescale_factor, postscale_factor)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` in place; returns a handle."""
    op = _resolve_op(op, average)
    return _tops.allreduce((tensor,), process_set, op, name, prescale_factor, postscale_factor,
                           inplace=True)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over the process set (default op: Average) and returns the
    result as a new tensor; the input is not modified. Differentiable."""
    op = _resolve_op(op, average)
    return _compressed(compression, (tensor,), lambda wires: (
        _autograd.allreduce(wires[0], name, op, prescale_factor, postscale_factor,
                            process_set),))[0]


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` in place and returns it."""
    op = _resolve_op(op, average)
    return _tops.allreduce_now_(tensor, process_set, op, name, prescale_factor, postscale_factor)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one unit; synchronize() returns a tuple
    of new tensors (as Horovod's)."""
    op = _resolve_op(op, average)
    return _tops.allreduce(_nonempty(tensors, "grouped_allreduce"), process_set, op, name,
                           prescale_factor, postscale_factor, grouped=True, as_tuple=True)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors in place as one unit; returns a handle, whose
    synchronize() returns the tensors as a tuple (as Horovod's)."""
    op = _resolve_op(op, average)
    return _tops.allreduce(_nonempty(tensors, "grouped_allreduce_"), process_set, op, name,
                           prescale_factor, postscale_factor, inplace=True, grouped=True,
                           as_tuple=True)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one unit; returns a list of new tensors.
    Differentiable."""
    op = _resolve_op(op, average)
    return _compressed(compression, _nonempty(tensors, "grouped_allreduce"), lambda wires:
                       _autograd.grouped_allreduce(wires, name, op, prescale_factor,
                                                   postscale_factor, process_set))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors in place as one unit; returns them as a tuple (as
    Horovod's)."""
    op = _resolve_op(op, average)
    return synchronize(_tops.allreduce(_nonempty(tensors, "grouped_allreduce_"), process_set,
                                       op, name, prescale_factor, postscale_factor, inplace=True,
                                       grouped=True, drive=True, as_tuple=True))


# ---- allgather ------------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating `tensor` from every rank along dim 0 (ranks may differ
    in dim 0 only); returns a handle."""
    return _tops.allgather((tensor,), process_set, name)


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates `tensor` from every rank of the set along dim 0. Differentiable."""
    return _autograd.allgather(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathering a list of tensors as one unit; returns a handle."""
    return _tops.allgather(_nonempty(tensors, "grouped_allgather"), process_set, name,
                           grouped=True)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one unit; returns a list. Differentiable."""
    return _autograd.grouped_allgather(_nonempty(tensors, "grouped_allgather"), name,
                                       process_set)


# ---- broadcast ------------------------------------------------------------------

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` into a new tensor; returns a handle.
    root_rank is a global rank (as in Horovod), a member of the process set."""
    return _tops.broadcast((tensor,), root_rank, process_set, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` in place; returns a handle."""
    return _tops.broadcast((tensor,), root_rank, process_set, name, inplace=True)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` as a new tensor on every rank. Differentiable."""
    return _autograd.broadcast(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's value; returns it."""
    return _tops.broadcast_now_(tensor, root_rank, process_set, name)


def grouped_broadcast_async_(tensors, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting a list of tensors in place as one unit (one request batch,
    fused by the core); returns a handle. A Perseus extension (Horovod has none): DDP
    syncs a module's buffers with it before every forward."""
    return _tops.broadcast(_nonempty(tensors, "grouped_broadcast_"), root_rank, process_set,
                           name, inplace=True, grouped=True)


def grouped_broadcast_(tensors, root_rank, name=None, process_set=global_process_set):
    """Overwrites every tensor of the list with root_rank's, as one unit; returns the list."""
    return synchronize(_tops.broadcast(_nonempty(tensors, "grouped_broadcast_"), root_rank,
                                       process_set, name, inplace=True, grouped=True,
                                       drive=True))


# ---- alltoall -------------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize() returns (output, received_splits) whether or
    not splits were given (as Horovod's does)."""
    return _tops.alltoall(tensor, process_set, splits, name)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[i] rows of `tensor` (dim 0, in order) to rank i of the set and
    concatenates what every rank sent here. splits=None splits dim 0 evenly.

    Returns the output alone when splits is None, else (output, received_splits),
    received_splits an int32 tensor of the rows received from each rank (Horovod's
    two forms). Differentiable.
    """
    output, received = _autograd.alltoall(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ---- sparse ---------------------------------------------------------------------

def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts reducing a sparse COO tensor as Horovod does: allgathers its indices
    and values (so duplicates add up when the result is used), values divided by the
    set size for op=Average. Returns, as Horovod's does, a function rather than an
    int handle: calling it waits and returns the reduced sparse tensor."""
    _tops.refuse_non_tensors("sparse_allreduce_async", (tensor,))
    op = _resolve_op(op, None)
    if op not in (Average, Sum):
        # Gathering adds duplicates up: only sums (and averages) come out of it.
        raise ValueError("sparse_allreduce_async supports op=Average or op=Sum, got %s"
                         % _ops.REDUCE_OP_NAMES[op])
    # Allgather joins along dim 0, so indices (ndim x nnz) travel as nnz x ndim.
    indices_name = None if name is None else "%s.indices" % name
    values_name = None if name is None else "%s.values" % name
    indices_handle = _tops.allgather((tensor._indices().t().contiguous(),), process_set,
                                     indices_name)
    values_handle = _tops.allgather((tensor._values(),), process_set, values_name)
    shape, size = tensor.shape, process_set.size()

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / size
        return torch.sparse_coo_tensor(indices.t(), values, shape, check_invariants=False)

    return handle


# ---- reducescatter --------------------------------------------------------------

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; returns a handle."""
    op = _resolve_op(op, None)
    return _tops.reducescatter((tensor,), process_set, op, name, prescale_factor,
                               postscale_factor)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and returns this rank's slice of dim 0 (the
    first dim0 % size ranks get one extra row). Differentiable."""
    op = _resolve_op(op, None)
    return _compressed(compression, (tensor,), lambda wires: (
        _autograd.reducescatter(wires[0], name, op, prescale_factor, postscale_factor,
                                process_set),))[0]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescattering a list of tensors as one unit; returns a handle."""
    op = _resolve_op(op, None)
    return _tops.reducescatter(_nonempty(tensors, "grouped_reducescatter"), process_set, op,
                               name, prescale_factor, postscale_factor, grouped=True)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one unit; returns a list. Differentiable."""
    op = _resolve_op(op, None)
    return _compressed(compression, _nonempty(tensors, "grouped_reducescatter"), lambda wires:
                       _autograd.grouped_reducescatter(wires, name, op, prescale_factor,
                                                       postscale_factor, process_set))


# ---- join and barrier -----------------------------------------------------------

def join(device=_ops.CPU_DEVICE):
    """Marks this rank as done: until every rank has joined, it takes part in other
    ranks' collectives with neutral data. Returns the rank that joined last.

    device: as in Horovod (-1 for the CPU, or the GPU ordinal, as in
    join(hvd.local_rank())), checked and otherwise unused: the core makes a joined
    rank's neutral data on the device of each collective it takes part in."""
    if isinstance(device, (torch.device, str)):
        device = torch.device(device)
        device = _ops.CPU_DEVICE if device.type == "cpu" else (device.index or 0)
    try:
        ok = not isinstance(device, bool) and operator.index(device) >= _ops.CPU_DEVICE
    except TypeError:
        ok = False
    if not ok:
        raise ValueError("join: device must be -1 (CPU) or a GPU ordinal, got %r" % (device,))
    return _tops.join()


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has reached the barrier."""
    synchronize(_tops.barrier(process_set))
