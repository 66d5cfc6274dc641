"""Keeping a module's buffers (BatchNorm statistics, ...) equal across ranks.

DDP syncs buffers before every forward, so this is on the step's critical path.
The buffers are copied into one flat tensor per dtype (and device) and the flat tensors go to
the core as one grouped request: a few copies instead of one request per buffer
(ResNet-50 has 160 buffers, most of them tiny). The flat layout is rebuilt when
the buffers' dtypes, devices or shapes change.
"""

import torch

from perseus.common import ops as _ops
from perseus.torch import ops as _tops


class _Flat:
    """One dtype's buffers: their positions in the module's list, a flat copy and what
    goes to the core (the flat copy; a complex one's real view)."""
    __slots__ = ("indices", "flat", "views", "wire")

    def __init__(self, indices, buffers):
        self.indices = indices
        shapes = [buffers[i].shape for i in indices]
        first = buffers[indices[0]]
        self.flat = torch.empty(sum(s.numel() for s in shapes), dtype=first.dtype,
                                device=first.device)
        self.views, offset = [], 0
        for shape in shapes:
            self.views.append(self.flat[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()
        self.wire = _tops.as_sent(self.flat)


class BufferSync:
    """Flat per-dtype copies of a module's buffers, and the two ways to sync them."""

    def __init__(self, name, process_set):
        self._name = name
        self._process_set = process_set
        self._layout = None
        self._flats = []

    def _layout_for(self, buffers):
        layout = tuple((b.dtype, b.device, b.shape) for b in buffers)
        if layout != self._layout:
            by_dtype = {}
            for i, b in enumerate(buffers):
                by_dtype.setdefault((b.dtype, b.device), []).append(i)
            self._flats = [_Flat(indices, buffers) for indices in by_dtype.values()]
            self._layout = layout
        return self._flats

    @staticmethod
    def _pack(flats, buffers):
        with torch.no_grad():
            for f in flats:
                torch._foreach_copy_(f.views, [buffers[i] for i in f.indices])

    @staticmethod
    def _unpack(flats, buffers):
        with torch.no_grad():
            for f in flats:
                torch._foreach_copy_([buffers[i] for i in f.indices], f.views)

    def broadcast(self, buffers, root_set_rank):
        """Every rank's buffers become those of the set's rank `root_set_rank`."""
        flats = self._layout_for(buffers)
        mine = self._process_set.rank() == root_set_rank
        if mine:
            self._pack(flats, buffers)
        _tops.synchronize(_tops.broadcast([f.wire for f in flats],
                                          self._process_set.ranks[root_set_rank],
                                          self._process_set, self._name, inplace=True,
                                          grouped=True, drive=True))
        if not mine:
            self._unpack(flats, buffers)

    def sum_from(self, buffers, root_set_rank):
        """The same result by an allreduce, which also runs while ranks have joined
        (they count as zeros): the root adds its buffers' bytes, everyone else zero
        bytes, and a sum of bytes with zeros is the root's bytes, whatever the dtype."""
        flats = self._layout_for(buffers)
        mine = self._process_set.rank() == root_set_rank
        if mine:
            self._pack(flats, buffers)
        else:
            for f in flats:
                f.flat.zero_()
        _tops.synchronize(_tops.allreduce([f.wire.view(torch.uint8) for f in flats],
                                          self._process_set, _ops.Sum, self._name + ".bytes",
                                          inplace=True, grouped=True, drive=True))
        if not mine:
            self._unpack(flats, buffers)
