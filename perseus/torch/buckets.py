"""Laying gradients out in buckets: which parameters share a flat buffer, and the
buffer with one view per parameter. Used by DDP's reducer (nn/parallel/reducer.py)
and DistributedOptimizer's gradient views (grad_buckets.py); torch only."""

import torch

FIRST_BUCKET_BYTES = 1 << 20  # small first bucket: the last layers' gradients go out early


def flat_with_views(params):
    """A zeroed flat tensor for `params` (one dtype and device) and one view of it per
    parameter, shaped like it, in order."""
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                       device=params[0].device)
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()].view(p.shape))
        offset += p.numel()
    return flat, views


def assign_buckets(params, cap_bytes, first_cap_bytes=FIRST_BUCKET_BYTES):
    """Lists of parameter indices, one per bucket, in the order they should fill:
    reverse registration order, split by dtype and device, the first bucket of each
    kind capped at min(first_cap_bytes, cap_bytes), the others at cap_bytes."""
    open_buckets = {}  # (dtype, device) -> (indices, bytes, closed so far)
    buckets = []
    for i in reversed(range(len(params))):
        p = params[i]
        kind = (p.dtype, p.device)
        members, size, closed = open_buckets.get(kind, ([], 0, 0))
        members.append(i)
        size += p.numel() * p.element_size()
        limit = min(first_cap_bytes, cap_bytes) if closed == 0 else cap_bytes
        if size >= limit:
            buckets.append(members)
            open_buckets[kind] = ([], 0, closed + 1)
        else:
            open_buckets[kind] = (members, size, closed)
    buckets += [members for members, _, _ in open_buckets.values() if members]
    return buckets
