"""The gradient reducer behind DistributedDataParallel.

Parameters are packed into buckets (flat tensors of one dtype, about
bucket_cap_mb each, the first one 1 MiB) in reverse registration order, which is
roughly the order backward produces their gradients. A post-accumulate-grad hook
on every parameter copies its gradient into the bucket (or, with
gradient_as_bucket_view, makes .grad a view of it); when the last gradient of a
bucket is in, the bucket is submitted as ONE allreduce request (averaged by the
core), so communication overlaps the rest of backward. A callback queued on the
autograd engine runs at the end of backward: it waits for every bucket and writes
the averaged gradients back into .grad, so they are final when backward() returns.

Readiness, per backward pass:
* normally every parameter's hook must fire exactly once; one that did not is an
  error naming it, raised from backward() on every rank (see _finish_missing);
* find_unused_parameters: parameters the forward's outputs do not reach (found by
  walking the autograd graph) are ready at once, as zeros or their accumulated
  gradient; a one-byte-per-parameter MAX allreduce tells which were used on any
  rank: the .grad of a parameter no rank used is left as it was, as torch does;
* static_graph: the first backward reduces everything at its end and records how
  often each hook fired (0 = unused, 2 = reentrant checkpointing); later passes
  use those counts, without the graph walk or the used-parameter allreduce.

Requests are named after the DDP instance and bucket index, so every rank agrees
on them and the core's name cache makes each negotiation one bit-vector round.
"""

import dataclasses
import weakref

import torch
from torch.autograd import Variable

from perseus.common import ops as _ops
from perseus.torch import ops as _tops
from perseus.torch.buckets import assign_buckets, flat_with_views

_queue_callback = Variable._execution_engine.queue_callback


class GradBucket:
    """What a communication hook gets (torch's GradBucket interface)."""

    def __init__(self, bucket, is_last, process_set):
        self._bucket = bucket
        self._is_last = is_last
        self._process_set = process_set  # default group of Perseus's built-in hooks
        self._name = bucket.name         # request name prefix for Perseus's built-in hooks

    def index(self):
        return self._bucket.index

    def buffer(self):
        """The bucket's gradients, flattened into one 1-D tensor."""
        return self._bucket.flat

    def gradients(self):
        """One view of buffer() per parameter, shaped like it."""
        return list(self._bucket.views)

    def parameters(self):
        return list(self._bucket.params)

    def is_last(self):
        return self._is_last

    def set_buffer(self, tensor):
        self._bucket.flat.copy_(tensor)


class _Bucket:
    __slots__ = ("index", "name", "members", "params", "flat", "views", "wire", "pending",
                 "handle", "future", "poisoned")

    def __init__(self, index, name, members, params):
        self.index = index
        self.name = name
        self.members = members  # parameter indices
        self.params = params
        self.flat, self.views = flat_with_views(params)
        self.wire = _tops.as_sent(self.flat)  # what is reduced: complex gradients' real view
        self.pending = len(members)
        self.handle = None
        self.future = None
        self.poisoned = False


def find_tensors(obj):
    """Every tensor in a (nested) forward output: tuples, lists, dicts, dataclasses."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in find_tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in find_tensors(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in find_tensors(getattr(obj, f.name))]
    return []


def _reachable_variables(tensors):
    """ids of the leaf tensors whose AccumulateGrad the outputs' graph reaches."""
    seen = set()
    found = set()
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)  # keeps the node object alive, so its identity is stable
        variable = getattr(fn, "variable", None)
        if variable is not None:
            found.add(id(variable))
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return found


class Reducer:
    """Buckets, hooks and per-backward state of one DistributedDataParallel."""

    def __init__(self, named_params, process_set, name, bucket_cap_bytes, find_unused,
                 gradient_as_bucket_view, static_graph):
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.process_set = process_set
        self.name = name
        self.find_unused = find_unused and not static_graph
        self.static_graph = static_graph
        self.as_view = gradient_as_bucket_view
        self.comm_hook = None
        self.comm_hook_state = None
        # Scaling of the default reduction; join(divide_by_initial_world_size=False)
        # switches to a sum divided by the number of ranks still training.
        self.op, self.postscale = _ops.Average, 1.0

        n = len(self.params)
        self.buckets = [
            _Bucket(k, "%s.b%d" % (name, k), members, [self.params[i] for i in members])
            for k, members in enumerate(assign_buckets(self.params, bucket_cap_bytes))]
        self.bucket_of = [None] * n
        self.view_of = [None] * n
        for bucket in self.buckets:
            for i, view in zip(bucket.members, bucket.views):
                self.bucket_of[i] = bucket
                self.view_of[i] = view
        if self.as_view:
            with torch.no_grad():
                for p, view in zip(self.params, self.view_of):
                    if p.grad is not None:
                        view.copy_(p.grad)
                        p.grad = view

        # Static graph: hook firings per parameter and parameters used on any rank,
        # both learnt in the first synchronized backward (None until then).
        self.expected = None if static_graph else [1] * n
        self.static_global_used = None

        self.armed = False           # a synchronized forward ran; its backward reduces
        self.started = False         # a gradient of that backward has arrived
        self.finalize_queued = False
        self.token = 0               # forward counter; stale output hooks are ignored
        self.fired = [0] * n
        self.ready = [False] * n
        self.unused_at_forward = ()
        self.locally_used = bytearray(n)  # since the last synchronized backward
        self.hook_handles = [p.register_post_accumulate_grad_hook(self._hook_for(i))
                             for i, p in enumerate(self.params)]

    def remove_hooks(self):
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles = []

    # ---- forward ----------------------------------------------------------------

    def prepare_for_backward(self, output):
        """Called at the end of a forward whose backward must reduce."""
        self._drain()
        n = len(self.params)
        self.finalize_queued = False  # a backward that failed never ran its callback
        self.armed = True
        self.started = False
        self.fired = [0] * n
        self.ready = [False] * n
        for bucket in self.buckets:
            bucket.pending = len(bucket.members)
            bucket.poisoned = False
        self.token += 1
        tensors = [t for t in find_tensors(output) if t.requires_grad]
        token = self.token
        for t in tensors:
            # The first output gradient queues the end-of-backward callback on the
            # outermost backward (a parameter hook may run in a reentrant inner one).
            t.register_hook(lambda grad: self._queue_finalize(token))
        if self.find_unused:
            reached = _reachable_variables(tensors)
            self.unused_at_forward = [i for i, p in enumerate(self.params)
                                      if id(p) not in reached]

    def disarm(self):
        """A forward that will not reduce (no_sync, or no grad)."""
        self._drain()
        self.finalize_queued = False
        self.armed = False

    def _drain(self):
        """Waits out requests a failed backward left in flight (their names must be
        free before the next submission); their errors were reported already."""
        for bucket in self.buckets:
            try:
                if bucket.handle is not None:
                    _tops.synchronize(bucket.handle)
                if bucket.future is not None:
                    bucket.future.wait()
            except Exception:
                pass
            bucket.handle = bucket.future = None

    # ---- backward ---------------------------------------------------------------

    def _hook_for(self, i):
        # Runs once per parameter per backward pass: kept to a few attribute lookups.
        # Holds the reducer weakly: once its DDP is gone, the module trains alone.
        reducer = weakref.ref(self)

        def hook(param):
            self = reducer()
            if self is None:
                return
            if not self.armed:
                self.locally_used[i] = 1  # no_sync: remember for the next reduction
                return
            if not self.started:
                self._start()
            self.locally_used[i] = 1
            fired = self.fired[i] + 1
            self.fired[i] = fired
            expected = self.expected
            if expected is None:
                return  # static graph, first backward: everything at the end
            count = expected[i]
            if fired == count and not self.ready[i]:
                self._mark_ready(i)
            elif fired >= count:
                self._fired_again(i, fired)
            # fired < count: static graph, more passes of this parameter to come
        return hook

    def _fired_again(self, i, fired):
        if fired <= self.expected[i]:
            raise RuntimeError(
                "DistributedDataParallel: parameter '%s' received a gradient although the "
                "outputs of forward() do not depend on it, so it was reduced as unused "
                "already. Compute the loss from forward()'s outputs only." % self.names[i])
        raise RuntimeError(
            "DistributedDataParallel: parameter '%s' received its gradient %d times in one "
            "backward pass (expected %d). A parameter used in several reentrant backward "
            "passes (e.g. torch.utils.checkpoint with use_reentrant=True) needs "
            "static_graph=True." % (self.names[i], fired, self.expected[i]))

    def _start(self):
        self.started = True
        self._queue_finalize(self.token)
        if self.find_unused:
            for i in self.unused_at_forward:
                self._mark_ready(i)
        elif self.static_graph and self.expected is not None:
            for i, count in enumerate(self.expected):
                if count == 0:
                    self._mark_ready(i)

    def _queue_finalize(self, token):
        if token == self.token and self.armed and not self.finalize_queued:
            self.finalize_queued = True
            _queue_callback(self._finalize)

    def _mark_ready(self, i):
        """Moves parameter i's gradient (zeros when it has none) into its bucket."""
        self.ready[i] = True
        p = self.params[i]
        view = self.view_of[i]
        grad = p.grad
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr() or grad.shape != view.shape:
            if grad.layout is not torch.strided:
                raise NotImplementedError(
                    "DistributedDataParallel: the gradient of '%s' is %s; Perseus reduces "
                    "dense gradients only" % (self.names[i], grad.layout))
            view.copy_(grad)
            if self.as_view:
                p.grad = view
        bucket = self.bucket_of[i]
        bucket.pending -= 1
        if bucket.pending == 0:
            self._submit(bucket)

    def _submit(self, bucket, poison=False):
        if poison:
            # Ranks disagree on the prescale factor, so the core fails this request
            # on every rank instead of leaving the others waiting for it.
            bucket.poisoned = True
            bucket.handle = _tops.allreduce((bucket.wire,), self.process_set, self.op,
                                            bucket.name, 0.0, self.postscale, inplace=True)
        elif self.comm_hook is None:
            bucket.handle = _tops.allreduce((bucket.wire,), self.process_set, self.op,
                                            bucket.name, 1.0, self.postscale, inplace=True)
        else:
            grad_bucket = GradBucket(bucket, bucket.index == len(self.buckets) - 1,
                                     self.process_set)
            future = self.comm_hook(self.comm_hook_state, grad_bucket)
            if not isinstance(future, torch._C.Future):  # then() returns the C++ class
                raise TypeError("DistributedDataParallel: the communication hook must return a "
                                "torch.futures.Future, got %s" % type(future).__name__)
            bucket.future = future

    def _finalize(self):
        """End of backward: complete every bucket, write the averages into .grad."""
        self.finalize_queued = False
        if not self.armed:
            return
        self.armed = False
        if not self.started:
            return  # no gradient reached the parameters (e.g. torch.autograd.grad)
        first_static = self.expected is None
        if first_static:
            self.expected = list(self.fired)
        missing = [i for i, ready in enumerate(self.ready) if not ready]
        if missing and not (self.find_unused or self.static_graph):
            self._finish_missing(missing)
        for i in missing:
            self._mark_ready(i)
        used = None
        if self.find_unused or first_static:
            flags = torch.frombuffer(bytearray(self.locally_used), dtype=torch.uint8)
            used = _tops.allreduce((flags,), self.process_set, _ops.Max, self.name + ".used",
                                   inplace=True)
        errors = self._wait_buckets()
        if used is not None:
            used = _tops.synchronize(used).tolist()
            if first_static:
                self.static_global_used = used
        elif self.static_graph:
            used = self.static_global_used
        self.locally_used = bytearray(len(self.params))
        if errors:
            raise errors[0]
        self._write_back(used)

    def _wait_buckets(self):
        errors = []
        for bucket in self.buckets:
            try:
                if bucket.handle is not None:
                    _tops.synchronize(bucket.handle)
                elif bucket.future is not None:
                    result = bucket.future.wait()
                    if isinstance(result, (list, tuple)):
                        result = result[0]
                    if result is not bucket.flat:
                        bucket.flat.copy_(result)
            except Exception as e:
                errors.append(RuntimeError(
                    "DistributedDataParallel: reducing the gradients of bucket %d (%s) failed: "
                    "%s%s" % (bucket.index, self._describe(bucket.members), e,
                              "" if bucket.poisoned else _MAYBE_MISSING)))
            finally:
                bucket.handle = bucket.future = None
        return errors

    def _write_back(self, used):
        """Averaged gradients into .grad; a parameter no rank used keeps its .grad."""
        if used is None and not self.as_view:
            # Every parameter had a gradient (else _finalize raised): one batched copy.
            grads = [p.grad for p in self.params]
            if not any(g is None for g in grads):  # `None in grads` would call Tensor.__eq__
                with torch.no_grad():
                    torch._foreach_copy_(grads, self.view_of)
                return
        targets, sources = [], []
        for i, (p, view) in enumerate(zip(self.params, self.view_of)):
            if used is not None and not used[i]:
                continue
            if p.grad is None:
                p.grad = view if self.as_view else view.clone()
            elif p.grad.data_ptr() != view.data_ptr():
                targets.append(p.grad)
                sources.append(view)
        if targets:
            with torch.no_grad():
                torch._foreach_copy_(targets, sources)

    def _finish_missing(self, missing):
        """Some hooks never fired and unused parameters were not allowed: submit the
        incomplete buckets poisoned (so ranks that have the gradients fail too, rather
        than wait), wait for everything, and raise the error naming the parameters.

        A communication hook issues requests this class cannot name, so with one the
        incomplete buckets go through the hook as usual: the other ranks then finish
        this step and only this rank raises."""
        for i in missing:
            self.ready[i] = True
            self.view_of[i].zero_()
        for bucket in self.buckets:
            if bucket.handle is None and bucket.future is None:
                self._submit(bucket, poison=self.comm_hook is None)
        self._wait_buckets()
        self.locally_used = bytearray(len(self.params))
        raise RuntimeError(
            "DistributedDataParallel: %d parameter(s) did not receive a gradient in this "
            "backward pass on rank %d: %s. Every parameter's gradient is averaged over the "
            "ranks, so each must take part in computing the loss; if some are unused (or "
            "used only on some ranks or iterations), pass find_unused_parameters=True to "
            "DistributedDataParallel, or static_graph=True if the same ones are always unused."
            % (len(missing), self.process_set.rank(), self._describe(missing)))

    def _describe(self, indices, limit=8):
        names = ["'%s'" % self.names[i] for i in indices[:limit]]
        if len(indices) > limit:
            names.append("... (%d more)" % (len(indices) - limit))
        return ", ".join(names)


_MAYBE_MISSING = (". If another rank reports parameters without a gradient, pass "
                  "find_unused_parameters=True to DistributedDataParallel")
