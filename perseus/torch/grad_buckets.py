"""Gradients as views into bucket buffers: DistributedOptimizer without packing.

The parameters that DistributedOptimizer reduces one by one (not in `groups`, dense,
with Compression.none) are laid out in buckets: flat tensors of one dtype and
device, in reverse order of the parameters (roughly the order backward produces
their gradients), the first of each kind about 1 MiB and the others about 25 MiB,
as torch's DDP lays out its own (buckets.assign_buckets). Each
parameter's .grad is made a view of its slice of the bucket, and a bucket whose
gradients are all in is reduced in place with ONE request, so nothing is copied into
a fusion buffer or back: a bucket of 4 MiB or more runs alone and in place in the
core (engine/fusion.h). This is PyTorch DDP's gradient_as_bucket_view.

When a gradient is not the view (the first backward; after zero_grad(set_to_none=
True), torch's default, or after a script assigned .grad) it is copied into the
view once, and .grad is bound to the view again; with zero_grad(set_to_none=False)
gradients stay views and nothing is copied at all. Autograd accumulates into an
existing .grad in place, so backward_passes_per_step > 1 accumulates in the bucket.
Results are those of reducing each gradient alone: the same elements, the same
operation and scale factors, element by element.

A parameter whose gradient turns out to be sparse leaves the buckets for good
(they are laid out again, the same way on every rank, after the step). The layout
is made at the first gradient and again when a parameter's dtype, device or shape
changes; PERSEUS_GRADIENT_AS_BUCKET_VIEW=0 (or DistributedOptimizer(...,
gradient_as_bucket_view=False)) turns the whole mode off.
"""

import torch

from perseus.torch import ops as _tops
from perseus.torch.buckets import FIRST_BUCKET_BYTES, assign_buckets, flat_with_views

BUCKET_BYTES = 25 << 20


class _Bucket:
    __slots__ = ("index", "name", "params", "ids", "flat", "views", "ready", "submitted")

    def __init__(self, index, name, params):
        self.index = index
        self.name = name
        self.params = params
        self.ids = frozenset(id(p) for p in params)
        self.flat, self.views = flat_with_views(params)
        self.ready = set()       # ids of the members whose slot is final this step
        self.submitted = False   # this step's reduction started


class GradBuckets:
    """The buckets of one optimizer, and their life through each step: laid out at a
    step's first gradient, each gradient bound to its view (take), a bucket reduced once
    all its gradients are in (or at submit_rest, from synchronize), the results
    delivered, and the step ended (end_step). `params`: the candidates, in the
    optimizer's order; `names`: id(param) -> name (requests are named after a bucket's
    first and last parameters, the same on every rank); `process_set` and `scales`
    (a function giving (op, prescale, postscale) for this step): the reductions'."""

    def __init__(self, params, names, process_set, scales):
        self._candidates = list(params)
        self._names = names
        self._process_set = process_set
        self._scales = scales
        self._in_step = False  # a gradient came this step: the layout stays until its end
        self.handles = []  # this step's reductions
        self._excluded = set()  # ids of parameters whose gradients were sparse
        self._stale = True
        self.buckets = []
        self._slot = {}  # id(param) -> (bucket, view)
        self._layout = None
        self.version = 0  # counts layouts, for callers that cache what is covered

    # ---- layout -----------------------------------------------------------------

    def _layout_of(self, params):
        return [(p.dtype, p.device, tuple(p.shape)) for p in params]

    def _lay_out(self):
        params = [p for p in self._candidates if id(p) not in self._excluded]
        self.buckets, self._slot = [], {}
        for k, members in enumerate(assign_buckets(params, BUCKET_BYTES, FIRST_BUCKET_BYTES)):
            chosen = [params[i] for i in members]
            name = "bucket%d[%s..%s]" % (k, self._names[id(chosen[0])], self._names[id(chosen[-1])])
            bucket = _Bucket(k, name, chosen)
            self.buckets.append(bucket)
            for p, view in zip(chosen, bucket.views):
                self._slot[id(p)] = (bucket, view)
        self._layout = self._layout_of(self._candidates)
        self._stale = False
        self.version += 1

    def _refresh(self):
        """Lays the buckets out again if they are stale or a parameter changed. Call
        only when no bucket is in flight (between steps)."""
        if self._stale or self._layout != self._layout_of(self._candidates):
            self._lay_out()

    def covers(self, p):
        return id(p) in self._slot

    def left(self, p):
        """Whether p's gradient turned out sparse (it leaves at the next layout)."""
        return id(p) in self._excluded

    def leaving(self):
        """The parameters still in a bucket whose gradients turned out sparse."""
        return [p for p in self._candidates if id(p) in self._excluded and id(p) in self._slot]

    # ---- one step ---------------------------------------------------------------

    def take(self, p, final):
        """p's gradient is in (final: its last backward pass of the step). Binds it to
        its view and, when final, starts its bucket once all its gradients are in.
        False when p is not in a bucket, or its gradient turned out sparse: the
        caller then reduces it alone (its slot reduces zeros)."""
        if not self._in_step:
            self._in_step = True
            self._refresh()  # the step's first gradient: no bucket is in flight
        if id(p) not in self._slot:
            return False
        dense = self._bind(p)
        if final:
            bucket = self._mark_ready(p)
            if bucket is not None:
                self._submit(bucket)
        return dense

    def submit_rest(self):
        """Starts the buckets not started yet (their members without a gradient this
        step reduce zeros). Returns the members whose gradients are sparse, which the
        caller reduces alone."""
        if not self._in_step:
            self._in_step = True
            self._refresh()  # no gradient came this step (size 1): lay out now
        sparse = []
        for bucket in self._unfinished():
            sparse += self._complete(bucket)
            self._submit(bucket)
        return sparse

    def end_step(self):
        """The step is over (or was abandoned): nothing is in flight any more."""
        self._reset()
        self.handles = []
        self._in_step = False

    def _bind(self, p):
        """Makes p.grad its view, copying a gradient that is not (zeros for none).
        False when the gradient is sparse: p then leaves the buckets at the next
        refresh() and its slot reduces zeros this step."""
        bucket, view = self._slot[id(p)]
        grad = p.grad
        if grad is view:
            return True
        if grad is None:
            view.zero_()
        elif grad.layout is not torch.strided:
            self._excluded.add(id(p))
            self._stale = True
            view.zero_()
            return False
        elif grad.data_ptr() != view.data_ptr() or grad.shape != view.shape:
            view.copy_(grad)
        p.grad = view
        return True

    def _mark_ready(self, p):
        """p's slot is final for this step; returns its bucket once all slots are."""
        bucket, _ = self._slot[id(p)]
        bucket.ready.add(id(p))
        return bucket if len(bucket.ready) == len(bucket.params) else None

    def _unfinished(self):
        """The buckets whose reduction has not started this step."""
        return [b for b in self.buckets if not b.submitted]

    def _complete(self, bucket):
        """Binds the members whose hooks did not run (zeros for no gradient) and marks
        every slot final. Returns the members whose gradients are sparse."""
        sparse = []
        ready = bucket.ready
        for p, view in zip(bucket.params, bucket.views):
            if p.grad is not view and id(p) not in ready and not self._bind(p):
                sparse.append(p)
        bucket.ready = set(bucket.ids)
        return sparse

    def _submit(self, bucket):
        """Starts the bucket's in-place allreduce. Kept alive, not pinned: the optimizer
        owns the bucket until synchronize()."""
        bucket.submitted = True
        op, prescale, postscale = self._scales()
        self.handles.append(_tops.allreduce((bucket.flat,), self._process_set, op, bucket.name,
                                            prescale, postscale, inplace=True, pin=False))

    def deliver(self):
        """After the reductions: a .grad the script replaced meanwhile gets the result
        (the others are the views already)."""
        for bucket in self.buckets:
            for p, view in zip(bucket.params, bucket.views):
                grad = p.grad
                if grad is not view and grad is not None and id(p) not in self._excluded:
                    grad.copy_(view)

    def _reset(self):
        """The step is over (or was abandoned): no slot is final, nothing submitted."""
        for bucket in self.buckets:
            bucket.ready = set()
            bucket.submitted = False
