"""DistributedDataParallel.join(): training with uneven inputs across ranks.

The core does the hard part: once a rank has called mpi_ops.join(), it counts as
contributing zeros to every allreduce the other ranks still run, until all ranks
have joined. So a rank that runs out of data just leaves the `with` block and
waits in join(); the others go on. What DDP adds, per forward inside the block:

* one small allreduce of a per-rank "still training" mask, which gives the number
  of active ranks (for divide_by_initial_world_size=False, and for
  throw_on_early_termination) and the highest active rank, whose buffers count
  (rank 0 may have joined);
* buffers synced by an allreduce instead of a broadcast, since only allreduce runs
  while ranks have joined (BufferSync.sum_from).

On exit every rank joins, then takes the parameters and buffers of the rank that
joined last, as torch does.
"""

import torch

from perseus.common import ops as _ops
from perseus.common import process_sets as _process_sets
from perseus.torch import ops as _tops

_EARLY_TERMINATION = ("Detected at least one rank that exhausted inputs. Throwing across all "
                      "ranks.")


class Join:
    """What DistributedDataParallel.join() returns."""

    def __init__(self, ddp, divide_by_initial_world_size, enable, throw_on_early_termination):
        self._ddp = ddp
        self._divide_by_initial = divide_by_initial_world_size
        self._enable = enable
        self._throw = throw_on_early_termination
        self._terminated = False
        self.authoritative = 0  # rank within the process set whose buffers count
        self._name = "ddp%d.join" % ddp._id

    def __enter__(self):
        if not self._enable:
            return self
        ddp = self._ddp
        if ddp._join is not None:
            raise RuntimeError("DistributedDataParallel.join() is already active")
        if ddp._process_set is not _process_sets.global_process_set:
            raise NotImplementedError("DistributedDataParallel.join() needs the default process "
                                      "group: Perseus's join spans all ranks")
        ddp._join = self
        return self

    def on_forward(self):
        process_set = self._ddp._process_set
        mask = torch.zeros(process_set.size(), dtype=torch.int32)
        mask[process_set.rank()] = 1
        _tops.allreduce_now_(mask, process_set, _ops.Sum, self._name + ".active")
        active = mask.nonzero().flatten().tolist()
        if self._throw and len(active) < len(mask):
            self._terminated = True
            raise RuntimeError(_EARLY_TERMINATION)
        self.authoritative = active[-1]
        reducer = self._ddp._reducer
        if self._divide_by_initial:
            reducer.op, reducer.postscale = _ops.Average, 1.0
        else:
            reducer.op, reducer.postscale = _ops.Sum, 1.0 / len(active)

    def __exit__(self, exc_type, exc, tb):
        if not self._enable:
            return False
        ddp = self._ddp
        ddp._join = None
        ddp._reducer.op, ddp._reducer.postscale = _ops.Average, 1.0
        try:
            last = _tops.join()
            terminated = self._terminated
            if self._throw:
                flag = torch.tensor([int(terminated)], dtype=torch.int32)
                _tops.allreduce_now_(flag, ddp._process_set, _ops.Max, self._name + ".terminated")
                terminated = bool(flag.item())
            states = [_tops.as_sent(t) for _, t in ddp._module_states()]
            _tops.synchronize(_tops.broadcast(states, last, ddp._process_set, self._name + ".final",
                                              inplace=True, grouped=True, drive=True))
        except Exception as e:
            if exc is None:
                raise
            raise e from exc
        if exc is None and terminated:
            raise RuntimeError(_EARLY_TERMINATION)
        return False
