"""Averaging a list of gradients over the ranks: the one routine behind
DistributedGradientTape, the Keras DistributedOptimizer and the TF1 optimizer.

Dense gradients go out as grouped allreduces (one negotiation per group, fused by
the core); by default all of them form one group, which matters eagerly, where
each op runs to completion before the next starts. tf.IndexedSlices go through
allgather unless sparse_as_dense. None gradients stay None.
"""

import numbers
import warnings

import tensorflow as tf

from perseus.common.ops import check_predivide
from perseus.tensorflow import mpi_ops
from perseus.tensorflow.compression import Compression


def scale_factors(op, gradient_predivide_factor):
    """(op, prescale, postscale): gradient_predivide_factor f splits Average's
    division into 1/f before the sum and f/size after it (the core applies /size)."""
    check_predivide(op, gradient_predivide_factor)
    if gradient_predivide_factor != 1.0:
        return op, 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return op, 1.0, 1.0


def resolve_groups(num_groups, groups, stacklevel=3):
    """`groups` by Horovod's rules, checked where the tape or optimizer is made:
    num_groups is its deprecated spelling (with Horovod's warning), which `groups`
    overrides; `groups` is a positive int (that many groups of the gradients) or lists
    of variables (each one group, the rest one group each). stacklevel: the warning's,
    the frame of the user's call."""
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning, stacklevel=stacklevel)
        if groups is None:
            groups = num_groups
    if groups is None or isinstance(groups, (list, tuple)):
        return groups
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups <= 0:
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")  # Horovod's text (0 is refused too)
    return int(groups)


def _groups_of(indices, variables, groups):
    """Lists of gradient positions, each reduced as one grouped op (groups: as
    resolve_groups gives it)."""
    if isinstance(groups, (list, tuple)):
        position = {id(v): i for i, v in enumerate(variables)}
        chosen, result = set(), []
        for group in groups:
            members = [position[id(v)] for v in group if id(v) in position]
            members = [i for i in members if i in indices]
            chosen.update(members)
            if members:
                result.append(members)
        rest = [i for i in indices if i not in chosen]
        return result + [[i] for i in rest]
    if groups:
        size = -(-len(indices) // groups)
        return [indices[k:k + size] for k in range(0, len(indices), size)]
    return [indices] if indices else []


def _divided(grad, size):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / size, grad.indices, grad.dense_shape)
    return grad / size


def reduce_gradients(grads, variables=None, compression=Compression.none, op=mpi_ops.Average,
                     gradient_predivide_factor=1.0, sparse_as_dense=False, groups=None,
                     process_set=mpi_ops.global_process_set, skip=(),
                     scale_local_gradients=True):
    """Returns `grads` reduced over the process set (a new list, same order).

    skip: positions not reduced (local variables, e.g. PartialDistributedGradientTape's
    local layers); with scale_local_gradients they are divided by the set's size, as
    Horovod does, so that they match the averaged loss the others are gradients of.
    """
    op, prescale, postscale = scale_factors(mpi_ops._resolve_op(op, None),
                                            gradient_predivide_factor)
    grads = list(grads)
    if process_set.size() == 1 and prescale == postscale == 1.0:
        return grads
    if scale_local_gradients:
        for i in skip:
            if grads[i] is not None:
                grads[i] = _divided(grads[i], process_set.size())
    dense = []
    for i, g in enumerate(grads):
        if g is None or i in skip:
            continue
        if isinstance(g, tf.IndexedSlices):
            if sparse_as_dense:
                grads[i] = tf.convert_to_tensor(g)
            else:
                grads[i] = mpi_ops.allreduce(g, op=op, prescale_factor=prescale,
                                             postscale_factor=postscale,
                                             process_set=process_set)
                continue
        dense.append(i)
    for group in _groups_of(dense, variables or [], groups):
        reduced = mpi_ops.grouped_allreduce([grads[i] for i in group], compression=compression,
                                            op=op, prescale_factor=prescale,
                                            postscale_factor=postscale, process_set=process_set)
        for i, r in zip(group, reduced):
            grads[i] = r
    return grads
