"""State broadcast for TensorFlow: variables, global variables, Python objects."""

import tensorflow as tf

from perseus.common import objects as _objects
from perseus.common.process_sets import global_process_set
from perseus.tensorflow import mpi_ops


# Horovod's TensorFlow signatures take a TF1 `session` to run their graph ops in; the
# objects here go through the core, not a TensorFlow graph, so none is needed and any
# (or none) is fine.

def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's `obj` (pickled) on every rank of the set; the root gets its own back."""
    return _objects.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function obj -> root_rank's obj, as Horovod's TF1 helper returns."""
    return lambda obj: _objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's `obj` (pickled), in the set's rank order."""
    return _objects.allgather_object(obj, name, process_set)


def variable_key(variable):
    """One key for a variable however a caller names it: a tf.Variable, its .ref(), a
    Keras 3 variable (which has no .ref()) or the .ref() of the tf.Variable inside one.
    Wherever a set of variables is taken (local variables, local sources), both forms
    match."""
    if hasattr(variable, "deref"):
        variable = variable.deref()
    inner = getattr(variable, "value", None)  # Keras 3: the backend tf.Variable
    return id(inner) if isinstance(inner, tf.Variable) else id(variable)


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns root_rank's values to `variables` on every rank, as one grouped
    broadcast. Returns the assignment op (graph mode) or None (eager)."""
    variables = list(variables)
    if not variables:
        return tf.no_op() if not tf.executing_eagerly() else None
    values = mpi_ops.grouped_broadcast([tf.convert_to_tensor(v) for v in variables], root_rank,
                                       process_set=process_set)
    assigns = [v.assign(value) for v, value in zip(variables, values)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: assigns root_rank's values to `variables` (one
    grouped broadcast) and returns their new values, read after the assignment."""
    variables = list(variables)
    if not variables:
        return []
    values = mpi_ops.grouped_broadcast([v.read_value() for v in variables], root_rank,
                                       name=name, process_set=process_set)
    with tf.control_dependencies([v.assign(value) for v, value in zip(variables, values)]):
        return [v.read_value() for v in variables]


def broadcast_global_variables(root_rank):
    """TF1 graphs: the op assigning root_rank's global variables on every rank."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution; "
                           "use hvd.broadcast_variables(model.variables, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)
