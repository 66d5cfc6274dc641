"""The 'dist_sync_perseus' KVStore: swap it in where a script creates its KVStore.

    kv = perseus.mxnet.create('dist_sync_perseus')   # was mx.kvstore.create(args.kv_store)

It behaves like MXNet's dist_sync store with one process per device, launched by
mpirun: push() sums the values over every rank (allreduce in MXNet's engine) and
pull() returns the result; with an optimizer set (gluon.Trainer and Module do this
when they update on the KVStore), the summed gradient updates the stored weight,
on every rank the same way, so no server is needed. As in dist_sync, a batch size
given to the optimizer is the global one: Module multiplies its batch size by
num_workers itself; a gluon.Trainer step() takes the global batch size.

Other names go to mx.kvstore.create. Creating the store initializes Perseus when
the script has not done so.
"""

import mxnet as mx

from perseus.common import basics as _basics
from perseus.common.ops import Sum
from perseus.common.process_sets import global_process_set
from perseus.mxnet.compression import Compression
from perseus.mxnet.mpi_ops import allreduce, broadcast_

TYPE = "dist_sync_perseus"


def _pairs(key, value):
    """[(key, value)] from MXNet's forms: one key, or a list of keys with one value
    (an NDArray or a list of NDArrays, one per device) each."""
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ValueError("a list of %d keys needs a list of as many values" % len(key))
        return list(zip(key, value))
    return [(key, value)]


def _arrays(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


class KVStore(mx.kvstore.KVStoreBase):
    """MXNet's KVStore interface over Perseus collectives (see the module doc)."""

    def __init__(self, name=TYPE, process_set=global_process_set):
        if not _basics.is_initialized():
            _basics.init()
        self._type = name
        self._process_set = process_set
        self._store = {}          # key -> this rank's copy of the stored value
        self._updater = None
        self._compression = Compression.none

    # ---- what the store is --------------------------------------------------------
    @property
    def type(self):
        return self._type

    @property
    def rank(self):
        return self._process_set.rank()

    @property
    def num_workers(self):
        return self._process_set.size()

    @property
    def local_rank(self):
        return _basics.local_rank()

    @staticmethod
    def is_capable(capability):
        if capability.lower() == mx.kvstore.KVStoreBase.OPTIMIZER:
            return True
        raise ValueError("Unknown capability: %s" % capability)

    # ---- data -------------------------------------------------------------------
    def _name(self, what, key):
        return "kvstore.%s.%s" % (what, key)

    def init(self, key, value):
        """Stores rank 0's value for each key (as MXNet's dist stores, where worker
        0 initializes)."""
        for k, v in _pairs(key, value):
            arrays = _arrays(v)
            stored = arrays[0].copy()
            broadcast_(stored, 0, name=self._name("init", k), process_set=self._process_set)
            self._store[k] = stored

    def _stored(self, key):
        try:
            return self._store[key]
        except KeyError:
            raise KeyError("KVStore key %r was not initialized: call init() first" % (key,)) \
                from None

    def push(self, key, value, priority=0):
        """Sums each key's values (every device's, every rank's); the sum replaces the
        stored value, or with an optimizer set, updates it."""
        for k, v in _pairs(key, value):
            stored = self._stored(k)
            arrays = _arrays(v)
            local = arrays[0] if len(arrays) == 1 else mx.nd.add_n(*arrays)
            if local.shape != stored.shape:
                raise ValueError("KVStore key %r holds shape %s; pushed %s"
                                 % (k, stored.shape, local.shape))
            wire, ctx = self._compression.compress(local)
            total = allreduce(wire, op=Sum, name=self._name("push", k), priority=priority,
                              process_set=self._process_set)
            if ctx is not None:
                total = self._compression.decompress(total, ctx)
            if total.context != stored.context or total.dtype != stored.dtype:
                total = total.as_in_context(stored.context).astype(stored.dtype, copy=False)
            if self._updater is not None:
                self._updater(k, total, stored)
            else:
                self._store[k] = total

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copies each key's stored value into `out` (an NDArray or a list, one per
        device)."""
        if out is None:
            raise ValueError("pull needs `out`")
        for k, o in _pairs(key, out):
            stored = self._stored(k)
            for array in _arrays(o):
                stored.copyto(array)

    def pushpull(self, key, value, out=None, priority=0):
        """push, then pull into `out` (or into `value` when out is None)."""
        self.push(key, value, priority)
        self.pull(key, value if out is None else out, priority)

    def broadcast(self, key, value, out, priority=0):
        """init with rank 0's `value`, then pull into `out`."""
        self.init(key, value)
        self.pull(key, out, priority)

    # ---- optimizer --------------------------------------------------------------
    def set_optimizer(self, optimizer):
        """push() then updates stored values with `optimizer` (on every rank alike)."""
        self._updater = mx.optimizer.get_updater(optimizer)

    def _need_updater(self):
        if self._updater is None:
            raise RuntimeError("no optimizer is set on this KVStore: call set_optimizer() first")
        return self._updater

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Writes the optimizer states (this rank's; every rank holds the same)."""
        states = self._need_updater().get_states(dump_optimizer)
        with open(fname, "wb") as f:
            f.write(states)

    def load_optimizer_states(self, fname):
        with open(fname, "rb") as f:
            self._need_updater().set_states(f.read())

    def set_gradient_compression(self, compression_params):
        """{'type': 'fp16'} sends floating-point values as float16; {'type': 'none'}
        turns that off. MXNet's 1bit/2bit quantization is not implemented."""
        kind = dict(compression_params or {}).get("type", "none")
        if kind == "none":
            self._compression = Compression.none
        elif kind == "fp16":
            self._compression = Compression.fp16
        else:
            raise NotImplementedError(
                "gradient compression %r is not implemented by the %s KVStore; use "
                "{'type': 'fp16'} or none" % (kind, self._type))


# mx.kvstore.create('dist_sync_perseus') works too once perseus.mxnet is imported.
mx.kvstore.KVStoreBase.register(type(TYPE, (KVStore,), {"__doc__": KVStore.__doc__}))


def create(name="local"):
    """The Perseus KVStore for 'dist_sync_perseus', else mx.kvstore.create(name)."""
    if not isinstance(name, str):
        raise TypeError("name must be a string")
    if name.lower() == TYPE:
        return KVStore(TYPE)
    return mx.kvstore.create(name)
