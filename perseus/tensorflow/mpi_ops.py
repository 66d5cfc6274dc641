"""TensorFlow adapter: Horovod's collective API over the Perseus op library.

Every collective is one custom TensorFlow op (op_library.py) that calls the
core's C ABI asynchronously, so the same code runs eagerly and inside
tf.function without Python on the hot path. This file picks names and
attributes, and registers gradients.

Names, process sets, roots, splits and compression follow perseus.common.builder's
rules. Unnamed calls are numbered eagerly at each call (anonymous: never cached by
the core), and inside tf.function at trace time, so the name is baked into the
graph and the same on every run (cached, one bit per negotiation round).
"""

import tensorflow as tf

from perseus.common import builder as _builder
from perseus.common import ops as _ops
from perseus.common import process_sets as _process_sets
from perseus.common import requests as _requests
from perseus.common.ops import Adasum, Average, Max, Min, Product, Sum  # Horovod's reduce-op names
from perseus.common.process_sets import global_process_set
from perseus.tensorflow import op_library
from perseus.tensorflow.compression import Compression
from perseus.common.ops import resolve_op as _resolve_op
from perseus.common.exceptions import CollectiveArgumentError


_OPS = op_library.load()
_set_id = _builder.set_id
_compressed = _builder.compressed


def _names(op_type, name, count, set_id, grouped=False):
    """(wire names, anonymous flag) for `count` tensors."""
    return _builder.names_now(op_type, name, count, set_id, grouped,
                              traced=not tf.executing_eagerly())


def _drive_s():
    """Eagerly the caller waits for the result anyway, so the op's thread runs the
    engine itself for up to this long (perseus_enqueue_and_drive), as the PyTorch
    front end does; graph ops leave the wait to a waiter thread, so as not to hold
    TensorFlow's inter-op threads."""
    return _requests.DRIVE_S if tf.executing_eagerly() else 0.0


def _check_dtypes(op_type, reduce_op, tensors):
    for t in tensors:
        _builder.check_dtype(op_type, reduce_op, t.dtype.name)


def _cpu_only(tensors):
    """GPU tensors are not served by the TensorFlow ops yet (their kernels are CPU
    kernels: TensorFlow would copy through the host in silence). Eager tensors and
    graph tensors with a device set say where they live."""
    for t in tensors:
        device = getattr(t, "device", "") or ""
        if "GPU" in device.upper():
            raise NotImplementedError(
                "Perseus's TensorFlow ops take CPU tensors only for now; got a tensor on %s "
                "(CUDA tensors are served by the PyTorch front end)" % device)


def _nonempty(tensors, what):
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("%s needs at least one tensor" % what)
    return tensors


# ---- allreduce ------------------------------------------------------------------

def _allreduce(tensors, name, op, prescale, postscale, process_set, grouped):
    _cpu_only(tensors)
    set_id = _set_id(process_set)
    _check_dtypes(_ops.ALLREDUCE, op, tensors)
    names, anonymous = _names(_ops.ALLREDUCE, name, len(tensors), set_id, grouped)
    return _OPS.perseus_allreduce(tensors, names, reduce_op=op, prescale=prescale,
                                  postscale=postscale, process_set=set_id, anonymous=anonymous, drive_s=_drive_s())


def allreduce(tensor, average=None, device_dense='', device_sparse='', compression=Compression.none,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=global_process_set):
    """Reduces `tensor` over the process set (default: Average); returns a new tensor.

    tf.IndexedSlices (sparse gradients) are allgathered instead (values and
    indices), as Horovod does, and averaged by dividing the values.
    """
    op = _resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Average, Sum):
            raise NotImplementedError("only Average and Sum reduce tf.IndexedSlices")
        values = allgather(tensor.values, process_set=process_set,
                           name=None if name is None else name + ".values")
        indices = allgather(tensor.indices, process_set=process_set,
                            name=None if name is None else name + ".indices")
        scale = prescale_factor * postscale_factor
        if op == Average:
            scale /= process_set.size()
        if scale != 1.0:
            values = values * tf.cast(scale, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    return _compressed(compression, [tf.convert_to_tensor(tensor)], lambda wires: _allreduce(
        wires, name, op, prescale_factor, postscale_factor, process_set, False))[0]


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, name=None):
    """Reduces a list of tensors as one unit (one negotiation); returns a list."""
    op = _resolve_op(op, average)
    return list(_compressed(compression, _nonempty(tensors, "grouped_allreduce"), lambda wires:
                            _allreduce(wires, name, op, prescale_factor, postscale_factor,
                                       process_set, True)))


@tf.RegisterGradient("PerseusAllreduce")
def _allreduce_grad(op, *grads):
    # d(sum_r x_r)/dx_r = 1: the gradient is the same reduction of the upstream
    # gradients (Average averages them, Sum sums them), with the same scaling.
    reduce_op = op.get_attr("reduce_op")
    if reduce_op == Adasum:
        raise NotImplementedError(_ops.ADASUM_HAS_NO_GRADIENT)
    if reduce_op not in (Average, Sum):
        raise NotImplementedError("allreduce with op %s has no gradient"
                                  % _ops.REDUCE_OP_NAMES[reduce_op])
    set_id = op.get_attr("process_set")
    grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
             for g, x in zip(grads, op.inputs[:-1])]
    names, anonymous = _names(_ops.ALLREDUCE, None, len(grads), set_id)
    return list(_OPS.perseus_allreduce(grads, names, reduce_op=reduce_op,
                                       prescale=op.get_attr("prescale"),
                                       postscale=op.get_attr("postscale"),
                                       process_set=set_id, anonymous=anonymous, drive_s=_drive_s())) + [None]


# ---- allgather ------------------------------------------------------------------

def _allgather(tensors, name, process_set, grouped):
    _cpu_only(tensors)
    set_id = _set_id(process_set)
    names, anonymous = _names(_ops.ALLGATHER, name, len(tensors), set_id, grouped)
    return _OPS.perseus_allgather(tensors, names, process_set=set_id, anonymous=anonymous, drive_s=_drive_s())


def allgather(tensor, name=None, process_set=global_process_set, ignore_name_scope=False):
    """Concatenates `tensor` from every rank of the set along dim 0 (ranks may differ
    in dim 0 only)."""
    return _allgather([tf.convert_to_tensor(tensor)], name, process_set, False)[0]


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one unit; returns a list."""
    return list(_allgather(_nonempty(tensors, "grouped_allgather"), name, process_set, True))


@tf.RegisterGradient("PerseusAllgather")
def _allgather_grad(op, *grads):
    # Each rank's slice of the output came from its input: sum the upstream
    # gradients over the ranks, then keep this rank's rows. Ranks may contribute
    # different row counts, so the offsets come from an allgather of dim 0.
    set_id = op.get_attr("process_set")
    inputs = op.inputs[:-1]
    grads = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g)
             for g, out in zip(grads, op.outputs)]
    rows = [tf.shape(x, out_type=tf.int64)[:1] for x in inputs]
    names, anonymous = _names(_ops.ALLGATHER, None, len(rows), set_id)
    all_rows = _OPS.perseus_allgather(rows, names, process_set=set_id, anonymous=anonymous, drive_s=_drive_s())
    names, anonymous = _names(_ops.ALLREDUCE, None, len(grads), set_id)
    summed = _OPS.perseus_allreduce(grads, names, reduce_op=Sum, process_set=set_id,
                                    anonymous=anonymous, drive_s=_drive_s())
    set_rank = _process_sets.by_id(set_id).rank()
    result = []
    for total, counts in zip(summed, all_rows):
        offset = tf.reduce_sum(counts[:set_rank])
        result.append(total[offset:offset + counts[set_rank]])
    return result + [None]


# ---- broadcast ------------------------------------------------------------------

def _broadcast(tensors, root_rank, name, process_set, grouped=False):
    _cpu_only(tensors)
    set_id = _set_id(process_set)
    names, anonymous = _names(_ops.BROADCAST, name, len(tensors), set_id, grouped)
    return _OPS.perseus_broadcast(tensors, names,
                                  root_rank=_builder.root_in_set(process_set, root_rank),
                                  process_set=set_id, anonymous=anonymous, drive_s=_drive_s())


def broadcast(tensor, root_rank, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Returns root_rank's `tensor` on every rank (root_rank: a global rank)."""
    return _broadcast([tf.convert_to_tensor(tensor)], root_rank, name, process_set)[0]


def grouped_broadcast(tensors, root_rank, name=None, process_set=global_process_set):
    """Broadcasts a list of tensors as one unit (a Perseus extension)."""
    return list(_broadcast(_nonempty(tensors, "grouped_broadcast"), root_rank, name,
                           process_set, True))


@tf.RegisterGradient("PerseusBroadcast")
def _broadcast_grad(op, *grads):
    # Every rank's output is the root's input: the root's gradient is the sum of all
    # ranks' upstream gradients (a reduce to the root); other inputs get zero.
    set_id = op.get_attr("process_set")
    grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
             for g, x in zip(grads, op.inputs[:-1])]
    names, anonymous = _names(_ops.ALLREDUCE, None, len(grads), set_id)
    _check_dtypes(_ops.ALLREDUCE, Sum, grads)
    summed = _OPS.perseus_allreduce(grads, names, reduce_op=Sum, process_set=set_id,
                                    anonymous=anonymous, drive_s=_drive_s())
    if _process_sets.by_id(set_id).rank() == op.get_attr("root_rank"):
        return list(summed) + [None]
    return [tf.zeros_like(s) for s in summed] + [None]


# ---- reducescatter --------------------------------------------------------------

def _reducescatter(tensors, name, op, prescale, postscale, process_set, grouped):
    _builder.check_op(_ops.REDUCESCATTER, op)
    _cpu_only(tensors)
    set_id = _set_id(process_set)
    _check_dtypes(_ops.REDUCESCATTER, op, tensors)
    names, anonymous = _names(_ops.REDUCESCATTER, name, len(tensors), set_id, grouped)
    return _OPS.perseus_reducescatter(tensors, names, reduce_op=op, prescale=prescale,
                                      postscale=postscale, process_set=set_id,
                                      anonymous=anonymous, drive_s=_drive_s())


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set; returns this rank's slice of dim 0 (the first
    dim0 % size ranks get one extra row)."""
    op = _resolve_op(op, None)
    return _compressed(compression, [tf.convert_to_tensor(tensor)], lambda wires: _reducescatter(
        wires, name, op, prescale_factor, postscale_factor, process_set, False))[0]


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average, name=None,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one unit; returns a list."""
    op = _resolve_op(op, None)
    return list(_compressed(compression, _nonempty(tensors, "grouped_reducescatter"),
                            lambda wires: _reducescatter(wires, name, op, prescale_factor,
                                                         postscale_factor, process_set, True)))


@tf.RegisterGradient("PerseusReducescatter")
def _reducescatter_grad(op, *grads):
    # Output slice s of rank r is the reduction of every rank's rows s: each input
    # row gets the upstream gradient of the rank that owns it (allgather), scaled
    # as the forward was (1/size for Average).
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Average, Sum):
        raise NotImplementedError("reducescatter with op %s has no gradient"
                                  % _ops.REDUCE_OP_NAMES[reduce_op])
    set_id = op.get_attr("process_set")
    grads = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g)
             for g, out in zip(grads, op.outputs)]
    names, anonymous = _names(_ops.ALLGATHER, None, len(grads), set_id)
    gathered = _OPS.perseus_allgather(grads, names, process_set=set_id, anonymous=anonymous, drive_s=_drive_s())
    scale = op.get_attr("prescale") * op.get_attr("postscale")
    if reduce_op == Average:
        scale /= _process_sets.by_id(set_id).size()
    return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gathered] + [None]


# ---- alltoall -------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, process_set=global_process_set,
             ignore_name_scope=False):
    """Sends splits[i] rows of `tensor` to rank i of the set (None: even split) and
    concatenates what every rank sent here. Returns (output, received_splits)."""
    set_id = _set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    _cpu_only([tensor])
    if splits is None:
        splits = tf.zeros([0], dtype=tf.int32)
    else:
        splits = tf.convert_to_tensor(splits)
        if not splits.dtype.is_integer:  # refused, not truncated, as Horovod
            raise CollectiveArgumentError("alltoall splits must be integers, got dtype %s"
                                          % splits.dtype.name)
        splits = tf.cast(splits, tf.int32)
        if tf.executing_eagerly():  # in a graph, the core checks them when the op runs
            _builder.alltoall_splits(splits.numpy(), process_set,
                                     tensor.shape[0] if tensor.shape.rank else None)
    names, anonymous = _names(_ops.ALLTOALL, name, 1, set_id)
    output, received = _OPS.perseus_alltoall(tensor, splits, names[0], process_set=set_id,
                                             anonymous=anonymous, drive_s=_drive_s())
    return output, received


@tf.RegisterGradient("PerseusAlltoall")
def _alltoall_grad(op, grad, grad_splits):
    # The transpose of an alltoall is the alltoall back, with the received splits.
    set_id = op.get_attr("process_set")
    grad = tf.zeros_like(op.outputs[0]) if grad is None else tf.convert_to_tensor(grad)
    names, anonymous = _names(_ops.ALLTOALL, None, 1, set_id)
    back, _ = _OPS.perseus_alltoall(grad, op.outputs[1], names[0], process_set=set_id,
                                    anonymous=anonymous, drive_s=_drive_s())
    return [back, None, None]


# ---- join and barrier -----------------------------------------------------------

def join():
    """Marks this rank as done until every rank has joined; returns the last rank
    to join (an int32 tensor)."""
    names, _ = _names(_ops.JOIN, None, 1, 0)
    return _OPS.perseus_join(names[0], anonymous=True, drive_s=_drive_s())


def barrier(process_set=global_process_set):
    """Blocks until every rank of the set has reached the barrier."""
    set_id = _set_id(process_set)
    names, _ = _names(_ops.BARRIER, None, 1, set_id)
    return _OPS.perseus_barrier(names[0], process_set=set_id, anonymous=True, drive_s=_drive_s())
