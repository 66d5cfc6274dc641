"""hvd.elastic for PyTorch: TorchState (a model, an optimizer and plain values)
and run(). The rules (what commit, restore, sync and run do, and what differs from
Horovod on MPI's fixed world) are perseus.common.elastic's."""

import copy

import torch

from perseus.common.basics import rank
from perseus.common.elastic import ObjectState, State, run_fn
from perseus.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from perseus.common.objects import allgather_object, broadcast_object
from perseus.torch.elastic_sampler import ElasticSampler
from perseus.torch.functions import broadcast_optimizer_state, broadcast_parameters

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]


def run(func):
    """Decorator: func(state, ...) is retried from the last commit after a
    HorovodInternalError (see perseus.common.elastic.run_fn)."""
    return run_fn(func)


class _ModelHandler:
    def __init__(self, model):
        self.value = model
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        self._broadcast()
        self.save()  # the synced values are the committed ones: restore() returns to them

    def _broadcast(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)

    def persisted(self):
        return self._saved


class _OptimizerHandler(_ModelHandler):
    def _broadcast(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_ModelHandler):
    def _broadcast(self):
        # Every rank's processed samples count as processed, then rank 0's epoch.
        state = self.value.state_dict()
        state["processed_indices"] = set().union(*allgather_object(state["processed_indices"]))
        self.value.load_state_dict(broadcast_object(state, root_rank=0))

    def persisted(self):
        # Every rank's committed record, joined (one allgather), as the sync joins them.
        joined = set().union(*allgather_object(self._saved["processed_indices"]))
        return dict(self._saved, processed_indices=joined)


# What TorchState tracks beyond plain values, by type (as Horovod does).
_HANDLERS = ((torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
             (ElasticSampler, _SamplerHandler))


def _handler_for(value):
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """State of a PyTorch training loop: `model`, `optimizer`, and keyword values,
    all available as attributes. A module, optimizer or ElasticSampler (any
    keyword) is tracked through its state_dict; other values must pickle.
    Assigning such an attribute later tracks the new object."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {}
        for name in list(kwargs):
            handler = _handler_for(kwargs[name])
            if handler is not None:
                handlers[name] = handler
                del kwargs[name]
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def __setattr__(self, name, value):
        handler = self._handlers.get(name)
        if handler is not None and value is not handler.value:
            handler.value = value
            handler.save()
        object.__setattr__(self, name, value)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _persisted(self):
        return {"values": super()._persisted(),
                "tracked": {name: handler.persisted() for name, handler in self._handlers.items()}}

    def _load_persisted(self, data):
        for name, handler in self._handlers.items():
            handler._saved = data["tracked"][name]
        super()._load_persisted(data["values"])
