"""Built-in DDP communication hooks, torch's `default_hooks` on Perseus.

A hook is `hook(state, bucket) -> torch.futures.Future` whose value is the reduced
bucket.buffer(); `state` is a process group from perseus.torch.distributed (None:
the DDP's own group). Register one with `ddp.register_comm_hook(state, hook)`.

torch's own default_hooks.allreduce_hook / fp16_compress_hook / bf16_compress_hook
are replaced by these when registered on a Perseus DDP (torch's would call
torch.distributed, which Perseus does not initialize); see equivalent().
"""

import torch

from perseus.common import ops as _ops
from perseus.torch import ops as _tops
from perseus.torch.distributed.process_group import process_set_of
# background: the reducer submits buckets as they fill, in an order that may differ
# between ranks, so a future must not be waited for where it is made.
from perseus.torch.ops.work import Work


def _reduce(state, bucket, wire_dtype):
    process_set = bucket._process_set if state is None else process_set_of(state)
    buffer = bucket.buffer()
    real = _tops.as_sent(buffer)  # complex gradients: both parts, as torch's hooks get them
    if wire_dtype is None or buffer.dtype == wire_dtype:
        handle = _tops.allreduce((real,), process_set, _ops.Average, bucket._name + ".hook",
                                 inplace=True)
        return Work(handle, buffer, background=True).get_future()
    # Divided before the sum, as torch does, so a half-precision sum cannot overflow
    # where the average would not.
    wire = real.to(wire_dtype)
    handle = _tops.allreduce((wire,), process_set, _ops.Sum,
                             bucket._name + "." + str(wire_dtype)[6:],
                             prescale=1.0 / process_set.size(), inplace=True)

    def decompress(future):
        real.copy_(future.value())
        return buffer

    return Work(handle, wire, background=True).get_future().then(decompress)


def allreduce_hook(process_group, bucket):
    """Averages the bucket over the group (what DDP does without a hook)."""
    return _reduce(process_group, bucket, None)


def fp16_compress_hook(process_group, bucket):
    """Averages the bucket sent as float16, then restores its dtype."""
    return _reduce(process_group, bucket, torch.float16)


def bf16_compress_hook(process_group, bucket):
    """Averages the bucket sent as bfloat16, then restores its dtype."""
    return _reduce(process_group, bucket, torch.bfloat16)


def equivalent(hook, state):
    """(hook, state) to register: torch's built-in default hooks map onto these."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    except ImportError:  # a torch without distributed support
        return hook, state
    ours = {
        getattr(default_hooks, "allreduce_hook", None): allreduce_hook,
        getattr(default_hooks, "fp16_compress_hook", None): fp16_compress_hook,
        getattr(default_hooks, "bf16_compress_hook", None): bf16_compress_hook,
    }.get(hook)
    if ours is None:
        return hook, state
    if state is not None:
        process_set_of(state)  # a torch ProcessGroup here is a clear error
    return ours, state
