"""TensorFlow adapter: Horovod's collective API over the Perseus op library.

Every collective is one custom TensorFlow op (op_library.py) that calls the
core's C ABI asynchronously, so the same code runs eagerly and inside
tf.function without Python on the hot path. This file picks names and
attributes, and registers gradients.

Names, process sets, roots, splits and compression follow perseus.common.builder's
rules. Unnamed calls are numbered eagerly at each call (anonymous: never cached by
the core); an op built into a graph (tf.function, TF1) is named after its place in
the graph, so the name is baked into the graph, the same on every run (cached, one
bit per negotiation round) and on every rank, however often each rank traced.
Horovod's ignore_name_scope is accepted, in Horovod's argument order, and changes
nothing: a name only has to be the same on every rank, which it is either way.
"""

import re

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
from perseus.common.exceptions import CollectiveTypeError


_OPS = op_library.load()
_set_id = _builder.set_id
_compressed = _builder.compressed


def _names(op_type, name, count, set_id, grouped=False):
    """(wire names, anonymous flag) for `count` tensors."""
    if name is not None or tf.executing_eagerly():
        return _builder.names_now(op_type, name, count, set_id, grouped)
    return _builder.names_now(op_type, None, count, set_id, grouped,
                              graph_name=_graph_name(op_type))


# TensorFlow suffixes function graphs' names with a process-wide counter
# ("__backward_f_13"), which differs between ranks that traced different amounts.
_GRAPH_UID = re.compile(r"_\d+$")


def _graph_name(op_type):
    """The op's place in the graph being built, as Horovod names graph ops: the
    function's name without TensorFlow's counter, then the name scope and a name
    unique in the graph ("f/gradients/allreduce_1"). Two functions in flight at
    once (nested tf.functions) get different names."""
    graph = tf.compat.v1.get_default_graph()
    scoped = graph.unique_name(_ops.OP_TYPE_NAMES[op_type])
    function = getattr(graph, "name", None)  # FuncGraph; a TF1 Graph has none
    return "%s/%s" % (_GRAPH_UID.sub("", function), scoped) if function else scoped


# How long a graph op's thread (one of TensorFlow's inter-op threads) may run the
# engine itself. Handing the request to the engine thread instead puts two thread
# wake-ups on the latency path, and its done() then runs TensorFlow's executor on the
# engine thread, each a wait for a core when the cores are busy
# (docs/investigations/tensorflow-traced-allreduce.md). The bound keeps an inter-op
# thread from being held while peers are late: after it, the engine thread takes over.
# Only one thread drives at a time; other ops just enqueue.
GRAPH_DRIVE_S = 0.01


def _drive_s():
    """How long the op's thread runs the engine itself (perseus_enqueue_and_drive)
    before it leaves the rest to the engine thread: eagerly the caller waits for the
    result anyway (as in the PyTorch front end); graph ops for GRAPH_DRIVE_S."""
    return _requests.DRIVE_S if tf.executing_eagerly() else GRAPH_DRIVE_S


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
              process_set=global_process_set, ignore_name_scope=False):
    """Reduces `tensor` over the process set (default: Average); returns a new tensor.
    tf.IndexedSlices are allgathered instead (_sparse_allreduce)."""
    op = _resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce([tensor], name, op, prescale_factor, postscale_factor,
                                 process_set, False)[0]
    return _compressed(compression, [tf.convert_to_tensor(tensor)], lambda wires: _allreduce(
        wires, name, op, prescale_factor, postscale_factor, process_set, False))[0]


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, ignore_name_scope=False, name=None):
    """Reduces a list of tensors as one unit (one negotiation); returns a list.
    tf.IndexedSlices among them are allgathered as one group (_sparse_allreduce),
    the dense ones reduced as another."""
    op = _resolve_op(op, average)
    if not tensors:
        return []  # as Horovod
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    results = [None] * len(tensors)
    if sparse:
        reduced = _sparse_allreduce([tensors[i] for i in sparse], name, op, prescale_factor,
                                    postscale_factor, process_set, True)
        for i, r in zip(sparse, reduced):
            results[i] = r
    if dense:
        reduced = _compressed(compression, [tf.convert_to_tensor(tensors[i]) for i in dense],
                              lambda wires: _allreduce(wires, name, op, prescale_factor,
                                                       postscale_factor, process_set, True))
        for i, r in zip(dense, reduced):
            results[i] = r
    return results


def _sparse_allreduce(slices, name, op, prescale, postscale, process_set, grouped):
    """tf.IndexedSlices reduced as Horovod does: their values and indices are
    allgathered (duplicate indices stand for a sum), and Average divides the values
    by the set's size (a true division: integer values come back as floats, as in
    Horovod). Other ops and scale factors are refused, on every rank alike."""
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not support tf.IndexedSlices; "
                                  "pass sparse_as_dense=True to DistributedOptimizer")
    if op not in (Average, Sum):
        raise NotImplementedError("only Sum and Average reduce tf.IndexedSlices")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("prescale_factor and postscale_factor are not supported "
                                  "with tf.IndexedSlices")

    def gathered(part):
        tensors = [getattr(s, part) for s in slices]
        if name is None:
            return _allgather(tensors, None, process_set, grouped)
        return _allgather(tensors, "%s.%s" % (name, part), process_set, grouped)
    values, indices = gathered("values"), gathered("indices")
    if op == Average:
        values = [v / tf.cast(process_set.size(), v.dtype) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape)
            for v, i, s in zip(values, indices, slices)]


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


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates `tensor` from every rank of the set along dim 0 (ranks may differ
    in dim 0 only)."""
    return _allgather([tf.convert_to_tensor(tensor)], name, process_set, False)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Allgathers a list of tensors as one unit; returns a list."""
    return list(_allgather(_nonempty(tensors, "grouped_allgather"), name, process_set, True))


@tf.RegisterGradient("PerseusAllgather")
def _allgather_grad(op, *grads):
    # Horovod's convention: the upstream gradients are averaged over the set (each
    # rank's loss sees every rank's rows), then each rank keeps its own rows. Ranks
    # may contribute different row counts, so the offsets come from an allgather
    # of dim 0.
    set_id = op.get_attr("process_set")
    inputs = op.inputs[:-1]
    grads = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g)
             for g, out in zip(grads, op.outputs)]
    rows = [tf.shape(x, out_type=tf.int64)[:1] for x in inputs]
    names, anonymous = _names(_ops.ALLGATHER, None, len(rows), set_id)
    all_rows = _OPS.perseus_allgather(rows, names, process_set=set_id, anonymous=anonymous, drive_s=_drive_s())
    names, anonymous = _names(_ops.ALLREDUCE, None, len(grads), set_id)
    averaged = _OPS.perseus_allreduce(grads, names, reduce_op=Average, process_set=set_id,
                                      anonymous=anonymous, drive_s=_drive_s())
    set_rank = _process_sets.by_id(set_id).rank()
    result = []
    for total, counts in zip(averaged, all_rows):
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


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank (root_rank: a global rank)."""
    return _broadcast([tf.convert_to_tensor(tensor)], root_rank, name, process_set)[0]


def grouped_broadcast(tensors, root_rank, name=None, process_set=global_process_set):
    """Broadcasts a list of tensors as one unit (a Perseus extension)."""
    return list(_broadcast(_nonempty(tensors, "grouped_broadcast"), root_rank, name,
                           process_set, True))


@tf.RegisterGradient("PerseusBroadcast")
def _broadcast_grad(op, *grads):
    # Horovod's convention: the root's gradient is the average of every rank's
    # upstream gradient; the other ranks' inputs get zeros. Every rank runs the
    # allreduce: the zeros depend on it, or a TF1 graph would prune it on non-roots.
    set_id = op.get_attr("process_set")
    grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
             for g, x in zip(grads, op.inputs[:-1])]
    names, anonymous = _names(_ops.ALLREDUCE, None, len(grads), set_id)
    _check_dtypes(_ops.ALLREDUCE, Average, grads)
    averaged = _OPS.perseus_allreduce(grads, names, reduce_op=Average, process_set=set_id,
                                      anonymous=anonymous, drive_s=_drive_s())
    if _process_sets.by_id(set_id).rank() == op.get_attr("root_rank"):
        return list(averaged) + [None]
    with tf.control_dependencies(averaged):
        return [tf.zeros_like(g) for g in grads] + [None]


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
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces `tensor` over the set; returns this rank's slice of dim 0 (the first
    dim0 % size ranks get one extra row)."""
    op = _resolve_op(op, None)
    return _compressed(compression, [tf.convert_to_tensor(tensor)], lambda wires: _reducescatter(
        wires, name, op, prescale_factor, postscale_factor, process_set, False))[0]


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    """Reducescatters a list of tensors as one unit; returns a list. (Horovod's has no
    `name`: here it comes last.)"""
    op = _resolve_op(op, None)
    return list(_compressed(compression, _nonempty(tensors, "grouped_reducescatter"),
                            lambda wires: _reducescatter(wires, name, op, prescale_factor,
                                                         postscale_factor, process_set, True)))


@tf.RegisterGradient("PerseusReducescatter")
def _reducescatter_grad(op, *grads):
    # Horovod's convention: each input row gets the upstream gradient of the rank
    # that owns its output row (an allgather), times the set's size for op=Sum and
    # as is for Average; the scale factors are not applied.
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Average, Sum):
        raise NotImplementedError("reducescatter with op %s has no gradient"
                                  % _ops.REDUCE_OP_NAMES[reduce_op])
    set_id = op.get_attr("process_set")
    grads = [tf.zeros_like(out) if g is None else tf.convert_to_tensor(g)
             for g, out in zip(grads, op.outputs)]
    if reduce_op == Sum:
        size = _process_sets.by_id(set_id).size()
        grads = [g * tf.cast(size, g.dtype) for g in grads]
    names, anonymous = _names(_ops.ALLGATHER, None, len(grads), set_id)
    return list(_OPS.perseus_allgather(grads, names, process_set=set_id, anonymous=anonymous,
                                       drive_s=_drive_s())) + [None]


# ---- alltoall -------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends splits[i] rows of `tensor` to rank i of the set (None: even split) and
    concatenates what every rank sent here. Returns the output, or, as Horovod,
    (output, received_splits) when `splits` is given."""
    set_id = _set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    _cpu_only([tensor])
    even = splits is None
    if even:
        splits = tf.zeros([0], dtype=tf.int32)
    else:
        splits = tf.convert_to_tensor(splits)
        if not splits.dtype.is_integer:  # refused, not truncated, as Horovod
            raise CollectiveTypeError("alltoall splits must be integers, got dtype %s"
                                      % splits.dtype.name)
        splits = tf.cast(splits, tf.int32)
        if tf.executing_eagerly():  # in a graph, the core checks them when the op runs
            _builder.alltoall_splits(splits.numpy(), process_set,
                                     None if tensor.shape.rank is None else tuple(tensor.shape))
    names, anonymous = _names(_ops.ALLTOALL, name, 1, set_id)
    output, received = _OPS.perseus_alltoall(tensor, splits, names[0], process_set=set_id,
                                             anonymous=anonymous, drive_s=_drive_s())
    return output if even else (output, received)


@tf.RegisterGradient("PerseusAlltoall")
def _alltoall_grad(op, grad, grad_splits):
    # The transpose of an alltoall is the alltoall back, with the received splits.
    set_id = op.get_attr("process_set")
    grad = tf.zeros_like(op.outputs[0]) if grad is None else tf.convert_to_tensor(grad)
    names, anonymous = _names(_ops.ALLTOALL, None, 1, set_id)
    back, _ = _OPS.perseus_alltoall(grad, op.outputs[1], names[0], process_set=set_id,
                                    anonymous=anonymous, drive_s=_drive_s())
    return [back, None, None]


# ---- topology as ops -------------------------------------------------------------
# Horovod's *_op functions: int32 scalars read when the graph runs, so a graph may be
# built before init() or saved and run elsewhere.

def rank_op(name=None):
    """This process's rank, as an op."""
    return _OPS.perseus_rank(name=name)


def local_rank_op(name=None):
    """This process's rank on its node, as an op."""
    return _OPS.perseus_local_rank(name=name)


def size_op(process_set_id=0, name=None):
    """The number of processes (in the process set of that id), as an op."""
    return _OPS.perseus_size(process_set=process_set_id, name=name)


def local_size_op(name=None):
    """The number of processes on this node, as an op."""
    return _OPS.perseus_local_size(name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this process belongs to the process set of that id, else 0; -1 before
    init(), -3 for an unknown set (Horovod's codes), as an op."""
    return _OPS.perseus_process_set_included(process_set=process_set_id, name=name)


for _op in ("PerseusRank", "PerseusLocalRank", "PerseusSize", "PerseusLocalSize",
            "PerseusProcessSetIncluded"):
    tf.no_gradient(_op)


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
