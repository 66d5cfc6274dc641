"""Registers the torch.distributed backend "perseus" (done by `import perseus.torch`,
and by `import perseus` once torch is imported: perseus/torch_registration.py).

torch.distributed.init_process_group("perseus") under mpirun then runs torch's own
collectives, DDP, FSDP2 and ZeroRedundancyOptimizer on Perseus (the backend is
perseus/torch/c10d/backend.py, imported at the first perseus group, so this module
loads neither the core nor MPI).

Four of torch's functions are wrapped; beyond refusing a backend name torch does not
know, they change only what they do for perseus:
  * init_process_group: ranks come from MPI, not from init_method (torch's env://
    or tcp:// rendezvous would wait for variables and peers mpirun does not give);
    a name torch does not know, for any backend, is a ValueError (backend_names.py);
  * _new_process_group_helper, through which every group is made: a Perseus
    process set is registered collectively on every rank, while torch asks only the
    group's members for their group;
  * _new_group_with_tag, behind new_group: use_local_synchronization=True (only the
    members call) is a ValueError at once, as torch's for MPI, where the members
    waited for the others' registration until the stall check time;
  * monitored_barrier, which torch refuses for any backend but gloo: on a perseus
    group it is the group's (backend.py), with gloo's semantics.
"""

import functools
import inspect

import torch.distributed as _torch_dist
import torch.distributed.distributed_c10d as _c10d

from perseus.torch.ops import backend_names

NAME = "perseus"


def _backend_module():
    from perseus.torch.c10d import backend
    return backend


def _names_perseus(backend):
    """Whether a backend argument ("perseus", "cpu:perseus,cuda:nccl", a Backend) uses
    perseus for some device."""
    if backend is None:
        return False
    return any(part.rpartition(":")[2].strip().lower() == NAME
               for part in str(backend).split(","))


def _create(options, backend_options=None):
    return _backend_module().create(options, backend_options)


def _wrap_init(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        backend = bound.arguments.get("backend")
        # A misspelt name would otherwise fail in torch's rendezvous, far from the typo.
        backend_names.check(backend, "init_process_group")
        if not _names_perseus(backend):
            return original(*args, **kwargs)
        return _backend_module().init_process_group(original, dict(bound.arguments))

    init_process_group._perseus_original = original
    return init_process_group


def _wrap_group_helper(original):
    @functools.wraps(original)
    def helper(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs):
        if global_ranks_in_group and _names_perseus(backend):
            _backend_module().register_set(global_ranks_in_group)
        return original(group_size, group_rank, global_ranks_in_group, backend, *args, **kwargs)

    helper._perseus_original = original
    return helper


def _wrap_new_group(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def new_group_with_tag(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        if arguments.get("use_local_synchronization"):
            backend = arguments.get("backend") or (
                _c10d.get_backend() if _c10d.is_initialized() else None)
            if _names_perseus(backend):
                raise ValueError("the 'perseus' backend doesn't support "
                                 "use_local_synchronization=True: a group is a process set "
                                 "that every rank registers, so every rank must call "
                                 "new_group() without it")
        return original(*args, **kwargs)

    new_group_with_tag._perseus_original = original
    return new_group_with_tag


def _wrap_monitored_barrier(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def monitored_barrier(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        group = arguments.get("group")
        # A rank outside the group, or a group of another backend: torch's function.
        if _c10d._rank_not_in_group(group) or not _names_perseus(_c10d.get_backend(group)):
            return original(*args, **kwargs)
        return _backend_module().monitored_barrier(group, arguments.get("timeout"),
                                                   arguments.get("wait_all_ranks", False))

    monitored_barrier._perseus_original = original
    return monitored_barrier


def register():
    """Registers "perseus" for CPU and CUDA tensors and wraps torch's four functions;
    once per process."""
    if hasattr(_c10d.init_process_group, "_perseus_original"):
        return
    _torch_dist.Backend.register_backend(NAME, _create, extended_api=True,
                                         devices=["cpu", "cuda"])
    wrapped = _wrap_init(_c10d.init_process_group)
    _c10d.init_process_group = wrapped
    _torch_dist.init_process_group = wrapped
    _c10d._new_process_group_helper = _wrap_group_helper(_c10d._new_process_group_helper)
    _c10d._new_group_with_tag = _wrap_new_group(_c10d._new_group_with_tag)
    wrapped = _wrap_monitored_barrier(_c10d.monitored_barrier)
    _c10d.monitored_barrier = wrapped
    _torch_dist.monitored_barrier = wrapped
