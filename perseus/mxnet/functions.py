"""broadcast_parameters, broadcast_object, allgather_object for MXNet."""

import mxnet as mx

from perseus.common import objects as _objects
from perseus.common.process_sets import global_process_set
from perseus.mxnet.mpi_ops import broadcast_


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's picklable `obj` on every rank."""
    return _objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's picklable `obj`, in rank order."""
    return _objects.allgather_object(obj, name, process_set)


def _broadcast_when_initialized(param, root_rank, name, process_set):
    """A Parameter whose shape is still unknown (deferred initialization) gets its
    broadcast when MXNet initializes it, at the first forward pass; every rank runs
    that pass, so every rank reaches the broadcast."""
    initialize = param._init_impl

    def init_then_broadcast(*args, **kwargs):
        initialize(*args, **kwargs)
        param._init_impl = initialize
        _wait(_broadcast_arrays(param.list_data(), root_rank, name, process_set))

    param._init_impl = init_then_broadcast


def _broadcast_arrays(arrays, root_rank, name, process_set):
    """Root's first array into every rank's arrays (one process may hold copies on
    several contexts: they all get root's value). Returns them."""
    broadcast_(arrays[0], root_rank, name=name, process_set=process_set)
    for other in arrays[1:]:
        arrays[0].copyto(other)
    return arrays


def _wait(arrays):
    # With oneDNN, a parameter written back after its broadcast while a later oneDNN
    # operator re-lays the same weight out crashed MXNet now and then (in testing,
    # after an inference pass had put convolution weights in a blocked layout). A
    # setup-time call loses nothing by finishing its writes before returning.
    for array in arrays:
        array.wait_to_read()


def broadcast_parameters(params, root_rank=0, prefix=None, process_set=global_process_set):
    """Overwrites `params` with root_rank's values, in place.

    params: a gluon ParameterDict (block.collect_params()) or a dict of name ->
    NDArray (e.g. Module.get_params()'s). Parameters whose initialization is deferred
    are broadcast as soon as MXNet initializes them. Names (sorted) become request
    names, so every rank must pass the same names. Returns once the values are in
    place (a failure raises MXNetError here).
    """
    prefix = "" if prefix is None else str(prefix)
    if isinstance(params, mx.gluon.parameter.ParameterDict):
        items = sorted(params.items())
    elif isinstance(params, dict):
        items = sorted(params.items())
    else:
        raise ValueError("broadcast_parameters takes a gluon ParameterDict or a dict of "
                         "NDArrays, got %s" % type(params).__name__)
    written = []
    for key, value in items:
        name = "broadcast_parameters.%s%s" % (prefix, key)
        if isinstance(value, mx.gluon.Parameter):
            if value._deferred_init:
                _broadcast_when_initialized(value, root_rank, name, process_set)
            elif value._data is None:
                raise ValueError("parameter %r is not initialized: call initialize() on every "
                                 "rank before broadcast_parameters" % key)
            else:
                written += _broadcast_arrays(value.list_data(), root_rank, name, process_set)
        elif isinstance(value, mx.nd.NDArray):
            written.append(broadcast_(value, root_rank, name=name, process_set=process_set))
        else:
            raise ValueError("broadcast_parameters: value of %r is a %s, not an NDArray or "
                             "gluon Parameter" % (key, type(value).__name__))
    _wait(written)
