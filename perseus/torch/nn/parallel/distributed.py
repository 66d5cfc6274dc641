"""DistributedDataParallel on Perseus: torch's DDP constructor and behaviour.

    model = perseus.torch.nn.parallel.DistributedDataParallel(model)

At construction every rank checks that its module matches rank 0's (a clear error
on every rank if not) and takes rank 0's parameters and buffers. Before each
forward the buffers are broadcast from rank 0 (broadcast_buffers). Gradients are
averaged during backward by the Reducer (reducer.py): bucketed, one request per
bucket, final when backward() returns. no_sync(), find_unused_parameters,
static_graph, gradient_as_bucket_view, register_comm_hook() and join() behave as
in torch. CPU modules, and single-GPU modules (device_ids=[local_rank] or None):
buckets then live on the GPU and reduce there (perseus.torch.device).
"""

import contextlib
import itertools
import warnings

import torch
import torch.nn as nn

from perseus.common import process_sets as _process_sets
from perseus.common.objects import allgather_object as _allgather_object
from perseus.torch import ops as _tops
from perseus.torch.distributed.process_group import process_set_of
from perseus.torch.nn.parallel import comm_hooks as _comm_hooks
from perseus.torch.nn.parallel.buffers import BufferSync
from perseus.torch.nn.parallel.join import Join
from perseus.torch.nn.parallel.reducer import Reducer

# The ranks of a group build their DDP instances in the same order, so the n-th one
# on a group has the same request names on each of them. Counted per group: ranks
# outside a group do not build its instances.
_instance_ids = {}  # tuple of global ranks -> itertools.count


def _next_id(process_set):
    return next(_instance_ids.setdefault(tuple(process_set.ranks), itertools.count()))


_SPARSE_MODULES = (nn.Embedding, nn.EmbeddingBag)


class DistributedDataParallel(nn.Module):
    """Data parallelism over the ranks of `process_group` (default: all ranks).

    Arguments as torch's. device_ids / output_device are for single-GPU modules
    (device_ids=[i]: forward moves the inputs to cuda:i, as torch does; outputs stay
    where the module puts them); for a CPU module they must be None, as in torch. `dim` only
    matters for multi-device modules and is kept for compatibility.
    check_reduction is deprecated in torch and ignored (with its warning). Of
    torch's newer keyword-only options, init_sync and forward_sync_buffers work,
    batched_grad_copy is accepted (reduced gradients are always copied in one
    batched call), and the others raise NotImplementedError when set.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False, *, init_sync=True,
                 forward_sync_buffers=None, batched_grad_copy=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, skip_all_reduce_unused_params=False,
                 bucket_cap_mb_list=None):
        super().__init__()
        for option, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                              ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                              ("mixed_precision", mixed_precision),
                              ("device_mesh", device_mesh),
                              ("bucket_cap_mb_list", bucket_cap_mb_list)):
            if value is not None:
                raise NotImplementedError("DistributedDataParallel(%s=...) is not supported by "
                                          "Perseus" % option)
        if skip_all_reduce_unused_params:
            raise NotImplementedError("DistributedDataParallel(skip_all_reduce_unused_params="
                                      "True) is not supported by Perseus")
        if not isinstance(module, nn.Module):
            raise TypeError("DistributedDataParallel wraps an nn.Module, got %s"
                            % type(module).__name__)
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is "
                          "deprecated. Please avoid using it.", FutureWarning, stacklevel=2)
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        if not bucket_cap_mb > 0:
            raise ValueError("bucket_cap_mb must be positive, got %r" % (bucket_cap_mb,))
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")

        self.module = module
        self.process_group = process_group
        self._process_set = process_set_of(process_group)
        if self._process_set.rank() < 0:
            raise ValueError("DistributedDataParallel: this rank is not a member of %r"
                             % (process_group,))
        self.dim = dim
        self.broadcast_buffers = (broadcast_buffers if forward_sync_buffers is None
                                  else forward_sync_buffers)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))

        named = self._module_states(buffers=False)
        self._check_parameters(named)
        self.device_ids, self.output_device = self._check_devices(named, device_ids,
                                                                  output_device)
        self._id = _next_id(self._process_set)
        if init_sync:
            self._sync_initial_state(self._module_states(buffers=self.broadcast_buffers))
        self._attach()

    def _attach(self):
        """The per-process machinery (hooks, buckets, buffer sync): built at
        construction and again when unpickled, never pickled."""
        self._named_trainable = [(n, p) for n, p in self._module_states(buffers=False)
                                 if p.requires_grad]
        self._reducer = self._build_reducer()
        self._buffer_slots = self._find_buffer_slots()
        self._buffer_sync = BufferSync("ddp%d.buffers" % self._id, self._process_set)
        self._join = None  # the active Join, if any
        self._has_comm_hook = False

    # ---- construction -----------------------------------------------------------

    def _check_parameters(self, named):
        if not any(p.requires_grad for _, p in named):
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have "
                               "any parameter that requires a gradient.")
        for name, p in named:
            if isinstance(p, nn.parameter.UninitializedParameter):
                raise RuntimeError("Modules with uninitialized parameters can't be used with "
                                   "`DistributedDataParallel` (parameter '%s'). Run a dummy "
                                   "forward pass to correctly initialize the modules" % name)
            try:
                # the adapter's device and dtype checks (of a complex one's real view)
                _tops.check_tensor(_tops.as_sent(p))
            except (NotImplementedError, ValueError) as e:
                raise type(e)("DistributedDataParallel: parameter '%s': %s" % (name, e)) from None
        for name, sub in self.module.named_modules():
            if isinstance(sub, _SPARSE_MODULES) and sub.sparse:
                raise NotImplementedError(
                    "DistributedDataParallel: '%s' produces sparse gradients (sparse=True); "
                    "Perseus reduces dense gradients only" % (name or type(sub).__name__))

    @staticmethod
    def _check_devices(named, device_ids, output_device):
        """torch's rules: device_ids names the one GPU of a single-GPU module and
        must be None for CPU (and multi-device) modules."""
        devices = {p.device for _, p in named}
        if len({d.type for d in devices}) != 1:
            raise ValueError("DistributedDataParallel's input module must be on the same type "
                             "of devices, but input module parameters locate in %s."
                             % sorted({d.type for d in devices}))
        if not device_ids or len(devices) > 1 or next(iter(devices)).type == "cpu":
            if device_ids or output_device is not None:
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work "
                    "with single-device/multiple-device GPU modules or CPU modules, but got "
                    "device_ids %s, output_device %s, and module parameters %s."
                    % (device_ids, output_device, devices))
            return None, None
        ids = [_device_index(d) for d in device_ids]
        if output_device is None:
            output_device = ids[0]
        return ids, _device_index(output_device)

    def _find_buffer_slots(self):
        """(submodule, name) of every buffer DDP syncs. Looked up by slot before each
        forward, which sees reassigned buffers without walking the module tree."""
        slots = []
        for module_name, sub in self.module.named_modules():
            for name, b in sub.named_buffers(recurse=False):
                full = "%s.%s" % (module_name, name) if module_name else name
                if full not in self.parameters_to_ignore:
                    slots.append((sub, name))
        return slots

    def _module_buffers(self):
        return [(n, b) for n, b in self.module.named_buffers()
                if n not in self.parameters_to_ignore]

    def _module_states(self, buffers=True):
        """(name, tensor) of every parameter and (with buffers) buffer DDP keeps in sync."""
        params = [(n, p) for n, p in self.module.named_parameters()
                  if n not in self.parameters_to_ignore]
        return params + (self._module_buffers() if buffers else [])

    def _sync_initial_state(self, states):
        """Every rank must hold the same module: compare with rank 0's (every rank
        raises on a difference), then take rank 0's values."""
        mine = [(n, tuple(t.shape), str(t.dtype)) for n, t in states]
        everyone = _allgather_object(mine, name="ddp%d.verify" % self._id,
                                     process_set=self._process_set)
        for r, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                raise RuntimeError("DistributedDataParallel: the module differs across ranks: %s"
                                   % _first_difference(everyone[0], theirs,
                                                       self._process_set.ranks[r],
                                                       self._process_set.ranks[0]))
        if states:
            _tops.synchronize(_tops.broadcast([_tops.as_sent(t) for _, t in states],
                                              self._process_set.ranks[0], self._process_set,
                                              "ddp%d.init" % self._id, inplace=True,
                                              grouped=True, drive=True))

    def _build_reducer(self):
        return Reducer(self._named_trainable, self._process_set, "ddp%d" % self._id,
                       self.bucket_bytes_cap, self.find_unused_parameters,
                       self.gradient_as_bucket_view, self.static_graph)

    # ---- forward ----------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        if self._join is not None:
            self._join.on_forward()
        if self.require_forward_param_sync and self.broadcast_buffers:
            self._sync_buffers()
        if self.device_ids:
            device = torch.device("cuda", self.device_ids[0])
            inputs, kwargs = _to_device(inputs, device), _to_device(kwargs, device)
        output = self.module(*inputs, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            self._reducer.prepare_for_backward(output)
        else:
            self.require_forward_param_sync = False
            self._reducer.disarm()
        return output

    def _sync_buffers(self):
        buffers = [b for b in (sub._buffers.get(name) for sub, name in self._buffer_slots)
                   if b is not None]
        if not buffers:
            return
        if self._join is not None:
            self._buffer_sync.sum_from(buffers, self._join.authoritative)
        else:
            self._buffer_sync.broadcast(buffers, 0)

    # ---- torch's DDP API --------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the first one outside
        reduces the accumulated gradients."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state, hook):
        """Reduces each bucket with hook(state, bucket) -> Future of the reduced
        bucket.buffer() (torch's contract). Once, before the first backward."""
        if not callable(hook):
            raise TypeError("register_comm_hook: hook must be callable, got %r" % (hook,))
        if self._has_comm_hook:
            raise RuntimeError("register_comm_hook can only be called once.")
        if self._reducer.token:
            raise RuntimeError("register_comm_hook must be called before the first forward "
                               "pass.")
        hook, state = _comm_hooks.equivalent(hook, state)
        self._reducer.comm_hook, self._reducer.comm_hook_state = hook, state
        self._has_comm_hook = True

    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """Context manager for ranks with different numbers of batches: a rank that
        runs out leaves the block and waits in its exit, standing in for the others'
        gradient reductions with zeros, until every rank is done; then every rank
        takes the parameters and buffers of the rank that finished last."""
        return Join(self, divide_by_initial_world_size, enable, throw_on_early_termination)

    def _set_static_graph(self):
        """torch's private switch to static_graph after construction."""
        if self._reducer.token:
            raise RuntimeError("_set_static_graph must be called before the first forward")
        self.static_graph = True
        old = self._reducer
        old.remove_hooks()
        self._reducer = self._build_reducer()
        self._reducer.comm_hook, self._reducer.comm_hook_state = old.comm_hook, old.comm_hook_state

    # ---- pickling -----------------------------------------------------------------

    def __getstate__(self):
        if self._process_set is not _process_sets.global_process_set:
            raise RuntimeError("DDP Pickling/Unpickling are only supported when using DDP with "
                               "the default process group.")
        state = self.__dict__.copy()
        for transient in ("_named_trainable", "_reducer", "_process_set", "_join",
                          "_buffer_slots", "_buffer_sync", "_has_comm_hook"):
            state.pop(transient, None)
        state["process_group"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._process_set = _process_sets.global_process_set
        self._id = _next_id(self._process_set)  # its own request names, beside the original's
        self._attach()  # comm hooks are not pickled, as in torch


def _device_index(d):
    """torch's _get_device_index for device_ids / output_device: an int, 'cuda:i' or
    a torch.device with an index."""
    if isinstance(d, int):
        return d
    index = torch.device(d).index
    if index is None:
        raise ValueError("DistributedDataParallel: device %r has no index" % (d,))
    return index


def _to_device(value, device):
    """Tensors in nested tuples, lists and dicts moved to `device` (torch's DDP moves a
    single-GPU module's inputs there before forward); anything else unchanged."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        moved = [_to_device(v, device) for v in value]
        return type(value)(*moved) if hasattr(value, "_fields") else tuple(moved)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _first_difference(reference, other, rank, reference_rank):
    if len(reference) != len(other):
        return ("rank %d has %d parameters and buffers, rank %d has %d"
                % (reference_rank, len(reference), rank, len(other)))
    for (n0, s0, d0), (n1, s1, d1) in zip(reference, other):
        if (s0, d0) != (s1, d1):
            return ("'%s' has shape %s and dtype %s on rank %d, but '%s' has shape %s and dtype "
                    "%s on rank %d" % (n0, s0, d0, reference_rank, n1, s1, d1, rank))
    names = [(a[0], b[0]) for a, b in zip(reference, other) if a[0] != b[0]]
    return "names differ, e.g. '%s' on rank %d vs '%s' on rank %d" % (
        names[0][0], reference_rank, names[0][1], rank)
