"""What DistributedOptimizer (optimizer.py) adds to the wrapped optimizer.

_DistributedMixin is placed before the wrapped optimizer's class; it
- registers a post-accumulate-grad hook on every parameter it updates; the hook
  starts the gradient's in-place allreduce (named after the parameter) as soon as
  autograd has accumulated it, so communication overlaps the rest of backward();
  gradients are gathered first and enqueued together for as long as the core
  would hold them anyway (_gather);
- with backward_passes_per_step=k, lets k backward passes accumulate locally and
  starts the reduction on the k-th;
- with groups / num_groups, submits a group's gradients together (one grouped
  allreduce) once every gradient of the group is ready;
- with gradient_as_bucket_view (PERSEUS_GRADIENT_AS_BUCKET_VIEW, on by default),
  makes the other gradients views into bucket buffers and reduces each bucket in
  place with one request, so nothing is packed or unpacked (grad_buckets.py);
- reduces a sparse gradient (nn.Embedding(sparse=True)) as Horovod does, by
  allgathering its indices and values (mpi_ops.sparse_allreduce_async), unless
  sparse_as_dense converts it to a dense one first;
- waits for all reductions in step() (or in an explicit synchronize(), after which
  step() runs inside skip_synchronize());
- refuses zero_grad() while reductions are pending.

adasum_optimizer.py's mixin derives from it to reduce parameter deltas instead.
"""

import contextlib
import time
import warnings

import torch

from perseus.common import basics as _basics
from perseus.common import requests as _requests
from perseus.torch import ops as _tops
from perseus.torch.compression import Compression
from perseus.torch.grad_buckets import GradBuckets
from perseus.torch.mpi_ops import Sum, sparse_allreduce_async


# Marks a group member whose reduction the group's first member's handle covers.
_IN_GROUP = object()
# Marks a parameter whose gradient is a bucket view (grad_buckets.py): its bucket's
# reduction covers it.
_IN_BUCKET = object()


def _core_holds(hold, pending_bytes, now):
    """Whether the core holds `pending_bytes` of requests at `now` (perf_counter seconds),
    hold = (since, limit, ms): pending since `since`, under its hold (limit, ms) =
    ProcessSet.hold(). The rule of csrc/src/engine/schedule.h (SchedulePolicy::HoldUntil),
    repeated here because asking the core would cost the enqueue that gathering saves;
    tests/unit/test_schedule.py checks that the two agree."""
    since, limit, ms = hold
    return limit > 0 and pending_bytes < limit and now < since + ms / 1e3


def _duplicates(names):
    seen, dups = set(), []
    for name in names:
        if name in seen and name not in dups:
            dups.append(name)
        seen.add(name)
    return dups


def _split_evenly(items, parts):
    """`items` in `parts` contiguous chunks whose sizes differ by at most one."""
    parts = min(parts, len(items))
    base, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


class _DistributedMixin:
    """Placed before the wrapped optimizer's class in the MRO of the class made by
    DistributedOptimizer(); overrides step/zero_grad and adds synchronize."""

    def __init__(self, param_groups, named_parameters, compression, backward_passes_per_step,
                 op, gradient_predivide_factor, groups, sparse_as_dense, process_set,
                 gradient_as_bucket_view=None):
        super().__init__(param_groups)

        self._compression = compression if compression is not None else Compression.none
        self._sparse_as_dense = sparse_as_dense
        # id(p) -> (p, sparse dims): sparse gradients reduced dense (sparse_as_dense),
        # made sparse again for the optimizer, as Horovod (SparseAdam takes no other).
        self._made_dense = {}
        self._process_set = process_set
        # As Horovod: a rank outside the optimizer's process set trains on its own
        # gradients, with no communication for them (the members average among them).
        self._trains_locally = process_set.included() is False
        self._op = op
        self._predivide = float(gradient_predivide_factor)

        all_params = [p for group in self.param_groups for p in group["params"]]
        self._parameter_names = self._name_parameters(named_parameters, all_params)

        self._requires_update = []
        seen = set()
        for p in all_params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._requires_update.append(p)

        # Groups: id(param) -> group index; parameters outside every group are reduced alone.
        self._groups = self._make_groups(groups, all_params)
        self._group_of = {}
        for index, members in enumerate(self._groups):
            for p in members:
                self._group_of[id(p)] = index
        self._group_ready = [set() for _ in self._groups]

        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {id(p): backward_passes_per_step for p in self._requires_update}
        # id(param) -> (param, handle or None, ctx); an entry exists from the param's
        # first backward pass after a step until synchronize() has finished it.
        self._handles = {}
        # Ungrouped gradients ready but not enqueued yet (_gather): their
        # parameters, bytes, and (since, limit, ms): when the first came, and the hold.
        self._gathered = []
        self._gathered_bytes = 0
        self._gather_hold = (0.0, 0, 0.0)
        self._grad_bytes = {id(p): p.numel() * p.element_size() for p in self._requires_update}
        self._hook_handles = []
        self._synchronized = False
        self._should_synchronize = True
        self._buckets = self._make_buckets(gradient_as_bucket_view)
        self._outside = (None, self._requires_update)  # (layout version, parameters not in buckets)
        if process_set.size() > 1 and not self._trains_locally:
            self._register_hooks()

    # ---- setup ----------------------------------------------------------------

    @staticmethod
    def _name_parameters(named_parameters, all_params):
        """id(param) -> name; checks that names are unique and cover every parameter."""
        if named_parameters is None:
            return {id(p): "noname.%d" % i for i, p in enumerate(all_params)}
        named_parameters = list(named_parameters)
        for item in named_parameters:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError("named_parameters should be a sequence of tuples (name, "
                                 "parameter), usually produced by model.named_parameters(); "
                                 "got an item %r" % (item,))
        dups = _duplicates([name for name, _ in named_parameters])
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             "duplicates: %s" % ", ".join(dups))
        names = {id(p): name for name, p in named_parameters}
        missing = ["#%d (shape %s)" % (i, tuple(p.shape)) for i, p in enumerate(all_params)
                   if id(p) not in names]
        if missing:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named: %d of the optimizer's parameters: %s (numbered "
                             "in param_groups order)" % (len(missing), ", ".join(missing)))
        return names

    def _make_groups(self, groups, all_params):
        if groups is None:
            return []
        if isinstance(groups, int):
            if groups < 0:
                raise ValueError("groups should be a non-negative integer or a list of list "
                                 "of torch.Tensor; got num_groups=%d" % groups)
            if groups == 0:
                return []
            return [g for g in _split_evenly(self._requires_update, groups) if g]
        if not isinstance(groups, (list, tuple)):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor; got a %s" % type(groups).__name__)
        known = {id(p) for p in all_params}
        placed = set()
        result = []
        for group in groups:
            members = []
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor; got a %s"
                                     % type(p).__name__)
                if id(p) not in known:
                    raise ValueError("groups holds a parameter of shape %s that the optimizer "
                                     "does not update" % (tuple(p.shape),))
                if id(p) in placed:
                    raise ValueError("A parameter can only appear once in groups (%s)"
                                     % self._parameter_names[id(p)])
                placed.add(id(p))
                if p.requires_grad:
                    members.append(p)
            if members:
                result.append(members)
        return result

    def _make_buckets(self, wanted):
        """GradBuckets for the parameters reduced one by one, or None: with another
        compression (the wire tensor is a converted copy, so there is no copy to
        save), or when switched off (wanted False; None: the configuration)."""
        if wanted is None:
            wanted = _basics.config().get("PERSEUS_GRADIENT_AS_BUCKET_VIEW", "1") == "1"
        if not wanted or self._compression is not Compression.none or self._trains_locally:
            return None
        alone = [p for p in self._requires_update if id(p) not in self._group_of]
        return (GradBuckets(alone, self._parameter_names, self._process_set, self._scales)
                if alone else None)

    def _register_hooks(self):
        for p in self._requires_update:
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _make_hook(self, p):
        key = id(p)

        def hook(param):
            entry = self._handles.get(key)
            if entry is not None and self._allreduce_delay[key] <= 0:
                self._settle_submitted()
                # Horovod's wording first: scripts match it.
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally. (parameter %s, backward_passes_per_step=%d)"
                    % (self._parameter_names[key], self.backward_passes_per_step))
            self._allreduce_delay[key] -= 1
            final = self._allreduce_delay[key] == 0
            # In a bucket (bound at every pass: later passes accumulate into the view),
            # the bucket's reduction covers it; else (a sparse one too, as Horovod does)
            # it is reduced alone or in its group.
            in_bucket = self._buckets is not None and self._buckets.take(p, final)
            if entry is None or not in_bucket:
                self._handles[key] = (p, _IN_BUCKET if in_bucket else None, None)
            if final and not in_bucket:
                self._submit_ready(p)

        return hook

    def _settle_submitted(self):
        """Before an error leaves the step unfinished: waits for the reductions it
        submitted, as Horovod's background thread completes them without a waiter, so
        that their names are free on every rank when the error reaches the script (a
        new optimizer over the same parameters reuses them). One that a peer has not
        submitted by the stall check time is withdrawn, and step() raises its error."""
        handles = [h for _, h, _ in self._handles.values() if isinstance(h, int)]
        if self._buckets is not None:
            handles += self._buckets.handles
        deadline = time.monotonic() + _basics.meeting_seconds()
        for handle in handles:
            _requests.settle_by(handle, deadline, "the step ended with the AssertionError "
                                "about backward_passes_per_step")

    # ---- reductions -----------------------------------------------------------

    def _scales(self):
        if self._predivide != 1.0:
            # Sum of grads / f, then * f / size: the average, with less overflow risk.
            return Sum, 1.0 / self._predivide, self._predivide / self._process_set.size()
        return self._op, 1.0, 1.0

    def _dense_grad(self, p, sparse_ok=False):
        """p.grad ready to reduce: zeros for a parameter that got no gradient (other ranks
        may have one; as in Horovod, a dense zero, so a parameter whose gradient is
        sparse elsewhere must get one on every rank), sparse converted to dense with
        sparse_as_dense, else left sparse where the caller can reduce it so."""
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif p.grad.layout is not torch.strided:
            if self._sparse_as_dense:
                self._made_dense[id(p)] = (p, p.grad.sparse_dim())
                p.grad = p.grad.to_dense()
            elif not sparse_ok:
                raise NotImplementedError(
                    "the gradient of %s is sparse (%s) and its parameter is in a group: "
                    "grouped reductions are dense; pass sparse_as_dense=True or leave it "
                    "out of groups" % (self._parameter_names[id(p)], p.grad.layout))
        return p.grad

    def _submit_ready(self, p):
        index = self._group_of.get(id(p))
        if index is None:
            self._gather(p)
            return
        ready = self._group_ready[index]
        ready.add(id(p))
        if len(ready) == len(self._groups[index]):
            self._submit_group(index)

    def _to_reduce(self, p, grouped=False):
        """The tensor reduced for p (its gradient, sparse only when reduced alone; the
        Adasum optimizer's delta)."""
        return self._dense_grad(p, sparse_ok=not grouped)

    def _apply(self, p, wire, ctx):
        """Puts p's reduced tensor in place once its reduction is done."""
        grad = self._compression.decompress(wire, ctx)
        if grad is not p.grad:
            p.grad.copy_(grad)

    def _gather(self, p):
        """Starts p's reduction, or gathers it to start with the next ones in one
        enqueue: inside backward(), caches are cold and one enqueue from Python
        costs several times a gather (benchmarks/README.md; a GPU one also records an
        event per enqueue), and the core would hold the requests until then anyway
        (PERSEUS_HOLD_BYTES and PERSEUS_HOLD_TIME as they stand now, autotuned or
        not; for GPU requests 1 MiB by default). synchronize() starts what is still
        gathered."""
        now = time.perf_counter()
        if not self._gathered:
            self._gather_hold = (now,) + self._process_set.hold(gpu=not p.is_cpu)
        self._gathered.append(p)
        self._gathered_bytes += self._grad_bytes[id(p)]
        if not _core_holds(self._gather_hold, self._gathered_bytes, now):
            self._submit_gathered()

    def _submit_gathered(self):
        gathered = self._gathered
        self._gathered, self._gathered_bytes = [], 0
        self._submit_all(gathered)

    def _submit_all(self, params, drive=False):
        """Starts the reductions of ungrouped parameters: a sparse gradient alone, as
        Horovod; the dense ones in one enqueue, each under its parameter's name, with
        one handle (the first parameter's; the others are marked as covered).
        drive=True from synchronize(), which waits at once: its thread runs the round
        rather than waking the engine's thread to run it while it sleeps."""
        wires, names, covered = [], [], []
        for p in params:
            tensor = self._to_reduce(p)
            if tensor.layout is torch.sparse_coo:
                # As Horovod: no compression, no predivide; the handle is a function.
                handle = sparse_allreduce_async(tensor, name=self._parameter_names[id(p)],
                                                op=self._op, process_set=self._process_set)
                self._handles[id(p)] = (p, handle, (None, None))
                continue
            wire, ctx = self._compression.compress(tensor)
            wires.append(wire)
            names.append(self._parameter_names[id(p)])
            covered.append((p, (wire, ctx)))
        if wires:
            # Scales per step: with a predivide factor they follow the set's size, which
            # an elastic reset changes. Kept alive, not pinned: the optimizer owns its
            # gradients until synchronize().
            op, prescale, postscale = self._scales()
            handle = _tops.allreduce(wires, self._process_set, op, names, prescale, postscale,
                                     inplace=True, drive=drive, pin=False)
            for i, (p, wire_ctx) in enumerate(covered):
                self._handles[id(p)] = (p, handle if i == 0 else _IN_GROUP, wire_ctx)

    def _not_in_buckets(self):
        """The parameters the buckets do not cover (cached per layout)."""
        version, params = self._outside
        if self._buckets is None:
            return self._requires_update
        if version != self._buckets.version:
            params = [p for p in self._requires_update if not self._buckets.covers(p)]
            self._outside = (self._buckets.version, params)
        return params

    def _submit_group(self, index):
        members = self._groups[index]
        op, prescale, postscale = self._scales()
        wires, ctxs = [], []
        for p in members:
            wire, ctx = self._compression.compress(self._to_reduce(p, grouped=True))
            wires.append(wire)
            ctxs.append(ctx)
        name = "group%d.%s" % (index, self._parameter_names[id(members[0])])
        # Kept alive, not pinned: the optimizer owns its gradients until synchronize().
        handle = _tops.allreduce(wires, self._process_set, op, name, prescale, postscale,
                                 inplace=True, grouped=True, pin=False)
        # The group's first member holds the handle; the others are marked as covered.
        for i, p in enumerate(members):
            self._handles[id(p)] = (p, handle if i == 0 else _IN_GROUP, (wires[i], ctxs[i]))
        self._group_ready[index] = set()

    # ---- Horovod's API --------------------------------------------------------

    # The settings Horovod's optimizer keeps as attributes, for scripts that read them;
    # read-only, since the buckets and scale factors were made from them.
    op = property(lambda self: self._op, doc="The reduce op (hvd.Average, ...).")
    gradient_predivide_factor = property(lambda self: self._predivide)
    sparse_as_dense = property(lambda self: self._sparse_as_dense)
    process_set = property(lambda self: self._process_set)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for key in self._allreduce_delay:
            self._allreduce_delay[key] = passes

    def synchronize(self):
        """Starts the reductions not yet started (gradients of parameters that got none
        this step, or passes short of backward_passes_per_step), waits for all, and
        writes the reduced gradients into p.grad. Outside the optimizer's process set:
        nothing (the gradients stay this rank's)."""
        if self._trains_locally:
            self._synchronized = True
            return
        ungrouped = []  # gathered ones too (their entries have no handle yet)
        buckets = self._buckets
        if buckets is not None:
            ungrouped += buckets.submit_rest()  # sparse members are reduced alone
        for p in self._not_in_buckets() + (buckets.leaving() if buckets else []):
            entry = self._handles.get(id(p))
            if entry is not None and entry[1] is not None:
                continue
            index = self._group_of.get(id(p))
            if index is not None:
                self._submit_group(index)
            else:
                ungrouped.append(p)
        self._gathered, self._gathered_bytes = [], 0
        if ungrouped:
            self._submit_all(ungrouped, drive=True)
        try:
            sparse = {}
            dense = []
            for key, (p, handle, _) in self._handles.items():
                if callable(handle):  # sparse_allreduce_async's
                    sparse[key] = handle
                elif handle is not _IN_GROUP and handle is not _IN_BUCKET:
                    dense.append(handle)
            if buckets is not None:
                dense += buckets.handles
            # One wait for all dense reductions (a failure raises as synchronize()
            # of its handle would), then the sparse ones, as before.
            _tops.synchronize_all(dense)
            for key, handle in sparse.items():
                sparse[key] = handle()
            for key, (p, handle, wire_ctx) in self._handles.items():
                if key in sparse:
                    # Into the same gradient tensor, as Horovod (sparse tensors lack set_).
                    p.grad.zero_().add_(sparse[key])
                elif handle is not _IN_BUCKET:
                    self._apply(p, *wire_ctx)
            if buckets is not None:
                buckets.deliver()
            for p, sparse_dims in self._made_dense.values():
                p.grad = p.grad.to_sparse(sparse_dims)
        finally:
            self._made_dense.clear()
            self._handles.clear()
            self._gathered, self._gathered_bytes = [], 0
            self._group_ready = [set() for _ in self._groups]
            if self._buckets is not None:
                self._buckets.end_step()
            for key in self._allreduce_delay:
                self._allreduce_delay[key] = self.backward_passes_per_step
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize (call synchronize() first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _step_unreduced(self):
        """The wrapped optimizer's step, without reducing (broadcast_optimizer_state's
        step that gives the optimizer its state)."""
        return super(_DistributedMixin, self).step()

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's wording: scripts filter on it.
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if self._handles:
            pending = sorted(self._parameter_names[key] for key in self._handles)
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition. (%d parameter(s) pending: %s)"
                % (len(pending), ", ".join(pending[:5])
                                         + (", ..." if len(pending) > 5 else "")))
        return super().zero_grad(set_to_none)
