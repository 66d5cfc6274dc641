"""DistributedOptimizer(op=Adasum): Horovod's delta-based Adasum optimizer.

Adasum combines the *updates* the ranks' optimizers would make, not their gradients
(so momentum, Adam's scaling etc. act before the combination). For each parameter p,
once its gradient is complete (the hook, after backward_passes_per_step passes):

    start = p;  the wrapped optimizer steps p alone;  delta = p - start
    delta is Adasum-reduced over the process set (asynchronously)

and synchronize() (called by step()) sets p = start + reduced delta on every rank.
Optimizer state stays per rank, as in Horovod. Parameters are stepped one by one
(the others hidden from param_groups meanwhile) so each one's reduction starts as
soon as its gradient exists; groups / num_groups reduce their deltas together.
"""

import torch

from perseus.torch.mpi_ops import Adasum
from perseus.torch.optimizer_mixin import _DistributedMixin


class _AdasumMixin(_DistributedMixin):
    """Replaces what _DistributedMixin reduces (gradient -> parameter delta) and how
    the result is applied (p.grad -> p itself); the hooks, delays, groups and the
    waiting in synchronize() are _DistributedMixin's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._starts = {}  # id(p) -> p's value before this step's local update
        self._deltas = {}  # id(p) -> buffer reduced in place

    def _make_buckets(self, wanted):
        return None  # deltas, not gradients, are reduced: there is no .grad to view

    def _scales(self):
        return Adasum, 1.0, 1.0

    def _local_step(self, p):
        """The wrapped optimizer's step() on p alone."""
        saved = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [q for q in group["params"] if q is p]
            super(_DistributedMixin, self).step()  # the wrapped class's step
        finally:
            for group, params in zip(self.param_groups, saved):
                group["params"] = params

    def _to_reduce(self, p, grouped=False):
        key = id(p)
        if key not in self._starts:
            self._starts[key] = torch.empty_like(p, memory_format=torch.contiguous_format)
            self._deltas[key] = torch.empty_like(p, memory_format=torch.contiguous_format)
        start, delta = self._starts[key], self._deltas[key]
        with torch.no_grad():
            start.copy_(p)
            self._local_step(p)
            torch.sub(p, start, out=delta)
        return delta

    def _apply(self, p, wire, ctx):
        delta = self._compression.decompress(wire, ctx)
        with torch.no_grad():
            p.copy_(self._starts[id(p)].add_(delta))

    def step(self, closure=None):
        """Applies the reduced updates (each parameter was stepped locally when its
        gradient was ready). The closure, if any, runs first, as it would compute the
        gradients."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # After an explicit synchronize() the update is already applied: doing it
        # again would step the parameters twice.
        if self._should_synchronize and (self._handles or not self._synchronized):
            self.synchronize()
        self._synchronized = False
        return loss
