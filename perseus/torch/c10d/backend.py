"""The torch.distributed backend "perseus": torch's own collectives, DDP (its C++
reducer), FSDP2 and ZeroRedundancyOptimizer on Perseus's engine.

perseus/torch/c10d/__init__.py registers the name when perseus.torch is imported and
routes init_process_group("perseus") and new groups here; this module does the work:

  * init_process_group(): ranks from MPI (ops/world.py, which warns once about a
    script's contradicting world_size or rank), and the store torch wants: a TCPStore
    served by rank 0 (its port sent over Perseus), or a HashStore in a world of one.
    The backend itself never uses it; torch's own code may (a gloo group made with
    new_group(backend="gloo"), store-based barriers).
  * a group is a process set: the default group the global set, new_group(ranks)
    the set of those ranks, registered on every rank before torch asks only the
    members for their group (register_set(), from the registration's hook).
  * ProcessGroupPerseus is a torch ProcessGroup written in Python. Each collective is
    one Perseus request (a coalesced call one grouped request) made by the torch
    operations layer (perseus/torch/ops/torch_api.py), and returns its Work, whose
    get_future() is what DDP's reducer and its comm hooks chain on. Results, mismatch
    errors and argument checks are those of Perseus's own API.
  * A collective of CPU tensors whose caller waits for it at once (_now: a synchronous
    call; torch's C++ code, such as DDP's reducer, which asks for the future at once) is
    driven by the calling thread from its submission, as hvd.allreduce_ is: the engine
    thread is not woken, which with no idle core would take the caller's core (an
    all_reduce or broadcast of one tensor even completes in one call into the core).
    async_op=True calls of torch.distributed's functions, which may be waited later,
    are left to the engine thread.
"""

import socket
import sys
import time

import torch
import torch.distributed as _torch_dist

from perseus.common import basics as _basics
from perseus.common import launch_check as _launch_check
from perseus.common import process_sets as _process_sets
from perseus.common import requests as _requests
from perseus.common.exceptions import CollectiveArgumentError
from perseus.common.objects import broadcast_object as _broadcast_object
from perseus.torch.ops import all_as_sent, as_sent
from perseus.torch.ops import timeouts as _timeouts
from perseus.torch.ops import torch_api as _torch_api
from perseus.torch.ops import world as _world
from perseus.torch.ops.reduce_ops import core_op

NAME = "perseus"


# ---- init ------------------------------------------------------------------------

def init_process_group(original, arguments):
    """torch's init_process_group (`original`, its bound `arguments`) for the perseus
    backend: starts Perseus, then lets torch build the default group over a store of
    ours with MPI's rank and size. A store the caller gave is used as it is."""
    _world.start(arguments.get("world_size", -1), arguments.get("rank", -1), stacklevel=4)
    rank, size = _basics.rank(), _basics.size()
    _launch_check.check_launched_world(size)  # torchrun: each process a world of one
    if arguments.get("store") is None:
        arguments["store"] = _make_store(rank, size, arguments.get("timeout"))
    arguments.update(init_method=None, rank=rank, world_size=size)
    # The group binds to no device: Perseus picks MPI or NCCL per tensor, and torch
    # would ask a device backend of a Python group for splitting at once.
    arguments.pop("device_id", None)
    result = original(**arguments)
    # No rank returns before every rank has connected to rank 0's store: a rank 0 that
    # went on to destroy_process_group() would take the store from a rank connecting.
    _torch_api.barrier(_process_sets.global_process_set).wait()
    return result


def _make_store(rank, size, timeout=None):
    """A store every rank shares: a TCPStore served by rank 0 on a free port, told to
    the others over Perseus. `timeout` (init_process_group's) bounds its operations."""
    if size == 1:
        return _torch_dist.HashStore()
    bound = {} if timeout is None else {"timeout": timeout}
    address = None
    server = None
    if rank == 0:
        host = "127.0.0.1" if _basics.local_size() == size else socket.gethostname()
        server = _torch_dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False,
                                      **bound)
        address = (host, server.port)
    host, port = _broadcast_object(address, 0, name="perseus.torch.store")
    return server or _torch_dist.TCPStore(host, port, size, is_master=False, **bound)


# ---- groups ----------------------------------------------------------------------

def register_set(ranks):
    """The process set of a new group's global ranks, registered now if it is not yet:
    collective, so every rank calls it as torch makes the group, members or not."""
    return _world.set_of_ranks(ranks)


def create(options, backend_options=None):
    """register_backend's creator (extended API): the group of
    options.global_ranks_in_group (empty: every rank), whose set register_set()
    registered."""
    ranks = list(options.global_ranks_in_group) or None
    process_set = (_process_sets.global_process_set if ranks is None
                   else _process_sets.find_process_set(ranks))
    if process_set is None:
        raise RuntimeError("the 'perseus' backend found no process set for the group of "
                           "ranks %s; make groups with torch.distributed.new_group() after "
                           "importing perseus.torch" % ranks)
    if process_set.rank() != options.group_rank or process_set.size() != options.group_size:
        raise RuntimeError("the 'perseus' backend: torch places this rank at %d of %d in the "
                           "group of ranks %s, Perseus at %d of %d"
                           % (options.group_rank, options.group_size, ranks,
                              process_set.rank(), process_set.size()))
    return ProcessGroupPerseus(process_set, getattr(options, "timeout", None))


# ---- the process group -----------------------------------------------------------

# Names per group that the core caches: each call takes the next in turn, whatever
# its kind, so a sequence of collectives that repeats with a period dividing this (a
# DDP step's buckets and buffer broadcasts) is agreed by cached bits alone, and ranks
# that call different collectives at one turn meet under one name, where the core
# fails the call on every rank. Names carry no shape or dtype: ranks that disagree on
# those meet too, and fail alike. A call refused before it was submitted uses no turn,
# so its corrected retry meets the peers' call.
_NAMES = 60
_groups_per_set = {}  # process set id -> groups made over it so far (name prefixes)


def monitored_barrier(group, timeout, wait_all_ranks):
    """torch.distributed.monitored_barrier on a perseus group (torch allows gloo only;
    c10d/__init__.py routes the call here): the group's monitored_barrier()."""
    if group is None:
        group = _torch_dist.distributed_c10d._get_default_group()
    return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


# torch.distributed's functions (all_reduce, ...): the one caller whose opts.asyncOp says
# whether it waits for the Work at once.
_TORCH_FUNCTIONS = vars(_torch_dist.distributed_c10d)
_BOOL = torch.bool  # reduced logically (reduce_ops), as their uint8 views
_SOON = _requests.SOON


def _now(opts, tensor):
    """When the caller of the group's method that calls this (frame 1) waits for its
    collective of `tensor` (torch_api's `now`): for a CPU tensor, at once (True) in a
    synchronous call of torch.distributed's functions (opts.asyncOp False); maybe much
    later (False) in one with async_op=True; soon (SOON) from anywhere else: torch's C++
    code (DDP's reducer asks for the future at once; its buffer broadcasts, two in
    flight, are waited for in turn; the frame below is then whatever Python that thread
    ran last) or a direct call."""
    if not getattr(tensor, "is_cpu", False):
        return False  # CUDA: the handle completes once queued; the future pool waits
    if opts is None:
        return _SOON
    if not opts.asyncOp:
        return True
    try:
        if sys._getframe(2).f_globals is _TORCH_FUNCTIONS:
            return False
    except ValueError:  # no Python frame below: a thread of torch's C++ code
        pass
    return _SOON


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError("the 'perseus' backend's %s takes one tensor per call, got %d"
                         % (what, len(tensors)))
    return tensors[0]


class ProcessGroupPerseus(_torch_dist.ProcessGroup):
    """The group of a process set's ranks (rank() and size() within it). Every
    collective returns a Work (perseus/torch/ops/work.py); CPU and CUDA tensors."""

    def __init__(self, process_set, timeout=None):
        super().__init__(process_set.rank(), process_set.size())
        self.process_set = process_set
        sid = process_set.process_set_id
        # torch's timeout of the group: every collective must have been called on every
        # rank within it, else it fails here naming the ranks that did not call it.
        self._bound = _timeouts.group_bound(timeout)  # (seconds, reason) or None
        # A rank with nothing to do still answers within a fraction of a timeout.
        _timeouts.answer_within(process_set, self._bound and self._bound[0])
        # Every member makes the groups over one set in the same order: the same
        # prefix on every rank, and none shared with another group over that set.
        self._prefix = "torch%d" % _groups_per_set.get(sid, 0)
        _groups_per_set[sid] = _groups_per_set.get(sid, 0) + 1
        self._turn = 0  # calls submitted so far
        self._in_flight = [None] * _NAMES  # per name: the handle that last used it
        self._group_name = self._group_desc = ""

    def getBackendName(self):
        return NAME

    # torch keeps a group's name and description in its C++ backends, which a group
    # written in Python has none of: kept here (DeviceMesh and FSDP2 look groups up by
    # name).
    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    def __repr__(self):
        return "ProcessGroupPerseus(ranks=%s)" % self.process_set.ranks

    def _named(self, start, bound=None):
        """start(name, bound) -> Work, under this call's name: the group's next name. A
        name is used again once the call that had it has completed here (waiting for it
        if need be: every rank submitted it before this one). bound: (seconds, reason),
        the time limit of this call instead of the group's timeout; start gets it as
        (deadline, reason), or None, for a call it runs to completion."""
        turn = self._turn % _NAMES
        previous = self._in_flight[turn]
        if previous is not None:
            _requests.settle(previous)
        if bound is None:
            bound = self._bound
        if bound is not None:  # inline, not _timeouts.deadline(): a call per collective
            bound = (time.monotonic() + bound[0], bound[1])
        work = start("%s.%d" % (self._prefix, turn), bound)
        if bound is not None:
            work._deadline, work._deadline_reason = bound
        self._turn += 1
        self._in_flight[turn] = work._handle
        return work

    # -- reductions

    def allreduce(self, tensors, opts=None):
        first = tensors[0] if tensors else None
        code = core_op(_torch_dist.ReduceOp.SUM if opts is None else opts.reduceOp, first)
        now = _now(opts, first)
        if tensors and tensors[0].layout == torch.sparse_coo:
            tensor = _one(tensors, "sparse allreduce")
            return self._named(lambda name, _: _torch_api.all_reduce_sparse(
                tensor, code, self.process_set, name, now))
        if len(tensors) != 1:
            tensors = all_as_sent(tensors, code, "all_reduce_coalesced")
            return self._named(lambda name, _: _torch_api.all_reduce_coalesced(
                tensors, code, self.process_set, name, now))
        tensor = tensors[0]
        if tensor.requires_grad or tensor.dtype is _BOOL:  # no call on the budgeted path
            tensor = as_sent(tensor, code, "all_reduce")
        return self._named(lambda name, bound: _torch_api.all_reduce(
            tensor, code, self.process_set, name, now, bound))

    def allreduce_coalesced(self, tensors, opts=None):
        """One grouped request: the core fuses what fits in a buffer."""
        first = tensors[0] if tensors else None
        code = core_op(_torch_dist.ReduceOp.SUM if opts is None else opts.reduceOp, first)
        now = _now(opts, first)
        tensors = all_as_sent(tensors, code, "all_reduce_coalesced")
        return self._named(lambda name, _: _torch_api.all_reduce_coalesced(
            tensors, code, self.process_set, name, now))

    def reduce(self, tensors, opts):
        tensor = _one(tensors, "reduce")
        now = _now(opts, tensor)
        root, code = self._global(opts.rootRank, "reduce"), core_op(opts.reduceOp, tensor)
        return self._named(lambda name, bound: _torch_api.reduce(
            tensor, root, code, self.process_set, name, now, bound))

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        output = _one(output_tensors, "reduce_scatter")
        chunks = _one(input_tensors, "reduce_scatter")
        now, code = _now(opts, output), core_op(opts.reduceOp, output)
        return self._named(lambda name, _: _torch_api.reduce_scatter(
            output, chunks, code, self.process_set, name, now))

    def reduce_scatter_single(self, output, input, opts):
        return self._reduce_scatter(output, input, opts, _now(opts, input))

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, output, input, opts, now):
        code = core_op(opts.reduceOp, input)
        return self._named(lambda name, _: _torch_api.reduce_scatter_tensor(
            output, input, code, self.process_set, name, now))

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        """One grouped reducescatter (FSDP's coalesced gradients)."""
        first = inputs[0] if inputs else None
        code = core_op(opts.reduceOp, first)
        now = _now(opts, first)
        return self._named(lambda name, _: _torch_api.reduce_scatter_coalesced(
            outputs, inputs, code, self.process_set, name, now))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- gathers

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = _one(output_tensors, "allgather")
        tensor = _one(input_tensors, "allgather")
        now = _now(opts, tensor)
        return self._named(lambda name, _: _torch_api.all_gather(
            outputs, tensor, self.process_set, name, now))

    def all_gather_single(self, output, input, opts=None):
        now = _now(opts, input)
        return self._named(lambda name, _: _torch_api.all_gather_into_tensor(
            output, input, self.process_set, name, now))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """One grouped allgather."""
        now = _now(opts, inputs[0] if inputs else None)
        return self._named(lambda name, _: _torch_api.all_gather_coalesced(
            outputs, inputs, self.process_set, name, now))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts):
        tensor = _one(input_tensors, "gather")
        outputs = output_tensors[0] if output_tensors else []
        now, root = _now(opts, tensor), self._global(opts.rootRank, "gather")
        return self._named(lambda name, _: _torch_api.gather(
            outputs, tensor, root, self.process_set, name, now))

    def scatter(self, output_tensors, input_tensors, opts):
        output = _one(output_tensors, "scatter")
        chunks = _one(input_tensors, "scatter") if input_tensors else []
        now, root = _now(opts, output), self._global(opts.rootRank, "scatter")
        return self._named(lambda name, _: _torch_api.scatter(
            output, chunks, root, self.process_set, name, now))

    # -- the rest

    def broadcast(self, tensors, opts):
        tensor = as_sent(_one(tensors, "broadcast"))  # torch's DDP sends complex parameters
        root = self._global(opts.rootRank, "broadcast")
        now = _now(opts, tensor)
        return self._named(lambda name, bound: _torch_api.broadcast(
            tensor, root, self.process_set, name, now, bound))

    def _global(self, group_rank, what):
        """The global rank of a root given as a rank in the group."""
        if not 0 <= group_rank < self.size():
            raise CollectiveArgumentError("%s: root %d is outside the group's %d ranks"
                                          % (what, group_rank, self.size()))
        return self.process_set.ranks[group_rank]

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        now = _now(opts, input)
        return self._named(lambda name, _: _torch_api.all_to_all_single(
            output, input, output_split_sizes or None, input_split_sizes or None,
            self.process_set, name, now))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        now = _now(opts, input_tensors[0] if input_tensors else None)
        return self._named(lambda name, _: _torch_api.all_to_all(
            output_tensors, input_tensors, self.process_set, name, now))

    def barrier(self, opts=None):
        """Driven by the caller whether it waits at once or not (perseus.torch.ops.barrier):
        it carries no data."""
        return self._named(lambda name, _: _torch_api.barrier(self.process_set, name))

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's monitored barrier: a barrier that fails after `timeout` (a timedelta;
        None: torch's default) unless every rank of the group has called it
        (perseus/torch/ops/timeouts.py)."""
        seconds = _timeouts.monitored_seconds(timeout)
        work = self._named(lambda name, _: _torch_api.barrier(self.process_set, name),
                           _timeouts.monitored_bound(seconds))
        _timeouts.wait_monitored(work, self.process_set, seconds, wait_all_ranks)

    # -- point-to-point: not collectives, so no turn of the group's names; MPI matches
    # them by source and tag. The group's timeout bounds each (withdrawn at its end).

    def send(self, tensors, dst, tag=0):
        return self._bounded(_torch_api.send(_one(tensors, "send"), dst, tag, self.process_set))

    def recv(self, tensors, src, tag=0):
        return self._bounded(_torch_api.recv(_one(tensors, "recv"), src, tag, self.process_set))

    def recv_anysource(self, tensors, tag=0):
        return self._bounded(_torch_api.recv(_one(tensors, "recv"), -1, tag, self.process_set))

    def _bounded(self, work):
        return _timeouts.bounded(work, self._bound)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """all_gather_coalesced: one grouped allgather; output_lists[r][i] gets rank r's
        inputs[i]."""
        now = _now(opts, inputs[0] if inputs else None)
        return self._named(lambda name, _: _torch_api.all_gather_lists(
            output_lists, inputs, self.process_set, name, now))
