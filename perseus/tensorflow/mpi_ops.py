"""TensorFlow adapter: Horovod's collective API over the Perseus op library.

Every collective is one custom TensorFlow op (op_library.py) that calls the
core's C ABI asynchronously, so the same code runs eagerly and inside
tf.function without Python on the hot path. This file picks names and
attributes, and registers gradients.

Names. A named call sends "<op>.<name>" (grouped: "<name>.<i>"), as Horovod.
Unnamed calls are numbered: eagerly, by perseus.common's per-(op, process set)
counters at each call, marked anonymous (never cached by the core); inside
tf.function, by a separate counter at trace time, so the name is baked into the
graph and the same on every run (cached, one bit per negotiation round). This
assumes, as Horovod's graph names do, that every rank traces its functions in
the same order.
"""

import itertools

import tensorflow as tf

from perseus.common import ops as _ops
from perseus.common.ops import Adasum, Average, Max, Min, Product, Sum  # Horovod's reduce-op names
from perseus.common import requests as _requests
from perseus.common.process_sets import global_process_set
from perseus.tensorflow import op_library
from perseus.tensorflow.compression import Compression
from perseus.common.ops import resolve_op as _resolve_op


_OPS = op_library.load()
_traced_counters = {}  # (op_type, set id) -> counter, for names made while tracing


def _set_id(process_set):
    set_id = process_set.process_set_id
    if set_id is None:
        raise ValueError("%r is not registered: call hvd.add_process_set() on every rank first"
                         % (process_set,))
    return set_id


def _names(op_type, name, count, set_id, grouped=False):
    """(wire names as a string tensor, anonymous flag) for `count` tensors."""
    if name is not None:
        if grouped:
            wires = [_requests.wire_name(op_type, "%s.%d" % (name, i)) for i in range(count)]
        else:
            wires = [_requests.wire_name(op_type, name)]
        return wires, False
    if tf.executing_eagerly():
        return [_requests._unnamed(op_type, set_id) for _ in range(count)], True
    counter = _traced_counters.setdefault((op_type, set_id), itertools.count())
    prefix = _ops.OP_TYPE_NAMES[op_type] + (".set%d" % set_id if set_id else "")
    return [("%s.traced.%d" % (prefix, next(counter))).encode() for _ in range(count)], False


def _drive_s():
    """Eagerly the caller waits for the result anyway, so the op's thread runs the
    engine itself for up to this long (perseus_enqueue_and_drive), as the PyTorch
    front end does; graph ops leave the wait to a waiter thread, so as not to hold
    TensorFlow's inter-op threads."""
    return _requests._DRIVE_S if tf.executing_eagerly() else 0.0


def _check_reducible(tensors, what):
    for t in tensors:
        if t.dtype == tf.bool:
            raise ValueError("%s does not support bool tensors" % what)


def _set_root(process_set, root_rank):
    """The core wants the root's rank within the set; callers give a global rank."""
    if _set_id(process_set) == _ops.GLOBAL_PROCESS_SET:
        return int(root_rank)
    try:
        return process_set.ranks.index(int(root_rank))
    except ValueError:
        raise ValueError("broadcast root_rank %s is not a member of %r"
                         % (root_rank, process_set)) from None


def _nonempty(tensors, what):
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("%s needs at least one tensor" % what)
    return tensors


# ---- allreduce ------------------------------------------------------------------

def _allreduce(tensors, name, op, prescale, postscale, process_set, grouped):
    set_id = _set_id(process_set)
    _check_reducible(tensors, "allreduce")
    if op == Adasum:
        for t in tensors:
            _ops.check_adasum(_ops.ALLREDUCE, t.dtype.name)
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
    tensor = tf.convert_to_tensor(tensor)
    if compression is not None and compression is not Compression.none:
        wire, ctx = compression.compress(tensor)
        reduced = _allreduce([wire], name, op, prescale_factor, postscale_factor, process_set,
                             False)[0]
        return compression.decompress(reduced, ctx)
    return _allreduce([tensor], name, op, prescale_factor, postscale_factor, process_set,
                      False)[0]


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, name=None):
    """Reduces a list of tensors as one unit (one negotiation); returns a list."""
    op = _resolve_op(op, average)
    tensors = _nonempty(tensors, "grouped_allreduce")
    if compression is not None and compression is not Compression.none:
        wires = [compression.compress(t) for t in tensors]
        reduced = _allreduce([w for w, _ in wires], name, op, prescale_factor,
                             postscale_factor, process_set, True)
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, wires)]
    return list(_allreduce(tensors, name, op, prescale_factor, postscale_factor, process_set,
                           True))


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
    set_rank = _set_rank(set_id)
    result = []
    for total, counts in zip(summed, all_rows):
        offset = tf.reduce_sum(counts[:set_rank])
        result.append(total[offset:offset + counts[set_rank]])
    return result + [None]


def _set_rank(set_id):
    from perseus.common import process_sets
    if set_id == _ops.GLOBAL_PROCESS_SET:
        return process_sets.global_process_set.rank()
    return process_sets._registered[set_id].rank()


# ---- broadcast ------------------------------------------------------------------

def _broadcast(tensors, root_rank, name, process_set, grouped=False):
    set_id = _set_id(process_set)
    names, anonymous = _names(_ops.BROADCAST, name, len(tensors), set_id, grouped)
    return _OPS.perseus_broadcast(tensors, names, root_rank=_set_root(process_set, root_rank),
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
    _check_reducible(grads, "the gradient of broadcast")
    summed = _OPS.perseus_allreduce(grads, names, reduce_op=Sum, process_set=set_id,
                                    anonymous=anonymous, drive_s=_drive_s())
    if _set_rank(set_id) == op.get_attr("root_rank"):
        return list(summed) + [None]
    return [tf.zeros_like(s) for s in summed] + [None]


# ---- reducescatter --------------------------------------------------------------

def _reducescatter(tensors, name, op, prescale, postscale, process_set, grouped):
    if op == Adasum:
        _ops.check_adasum(_ops.REDUCESCATTER)
    set_id = _set_id(process_set)
    _check_reducible(tensors, "reducescatter")
    names, anonymous = _names(_ops.REDUCESCATTER, name, len(tensors), set_id, grouped)
    return _OPS.perseus_reducescatter(tensors, names, reduce_op=op, prescale=prescale,
                                      postscale=postscale, process_set=set_id,
                                      anonymous=anonymous, drive_s=_drive_s())


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set; returns this rank's slice of dim 0 (the first
    dim0 % size ranks get one extra row)."""
    op = _resolve_op(op, None)
    tensor = tf.convert_to_tensor(tensor)
    if compression is not None and compression is not Compression.none:
        wire, ctx = compression.compress(tensor)
        out = _reducescatter([wire], name, op, prescale_factor, postscale_factor, process_set,
                             False)[0]
        return compression.decompress(out, ctx)
    return _reducescatter([tensor], name, op, prescale_factor, postscale_factor, process_set,
                          False)[0]


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average, name=None,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one unit; returns a list."""
    op = _resolve_op(op, None)
    tensors = _nonempty(tensors, "grouped_reducescatter")
    if compression is not None and compression is not Compression.none:
        wires = [compression.compress(t) for t in tensors]
        outs = _reducescatter([w for w, _ in wires], name, op, prescale_factor,
                              postscale_factor, process_set, True)
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, wires)]
    return list(_reducescatter(tensors, name, op, prescale_factor, postscale_factor,
                               process_set, True))


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
        from perseus.common import process_sets
        size = (process_sets.global_process_set if set_id == 0
                else process_sets._registered[set_id]).size()
        scale /= size
    return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gathered] + [None]


# ---- alltoall -------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, process_set=global_process_set,
             ignore_name_scope=False):
    """Sends splits[i] rows of `tensor` to rank i of the set (None: even split) and
    concatenates what every rank sent here. Returns (output, received_splits)."""
    set_id = _set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if splits is None:
        splits = tf.zeros([0], dtype=tf.int32)
    else:
        splits = tf.cast(tf.convert_to_tensor(splits), tf.int32)
        if tf.executing_eagerly():
            values = splits.numpy().tolist()
            if len(values) != process_set.size():
                raise ValueError("alltoall splits has %d entries; it needs one per rank of the "
                                 "process set (%d)" % (len(values), process_set.size()))
            if tensor.shape.rank and sum(values) != tensor.shape[0]:
                raise ValueError("alltoall splits sum to %d but the tensor's first dimension is "
                                 "%d" % (sum(values), tensor.shape[0]))
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
