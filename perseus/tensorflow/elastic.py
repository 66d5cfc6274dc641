"""hvd.elastic for TensorFlow: TensorFlowKerasState (a Keras model and its
optimizer), TensorFlowState (a list of variables) and run(). The rules (commit,
restore, sync, run, and what differs from Horovod on MPI's fixed world) are
perseus.common.elastic's. Eager TensorFlow (TF2) only: Perseus' TF1 graph support
has no elastic state.
"""

import functools

import tensorflow as tf

from perseus.common.basics import rank
from perseus.common.elastic import ObjectState, State, run_fn
from perseus.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from perseus.common.objects import broadcast_object
from perseus.tensorflow.functions import broadcast_variables

__all__ = ["ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "run"]

# The TF errors a failed Perseus collective becomes (perseus_tf_ops.cc ToStatus) for
# the statuses Python reports as HorovodInternalError. Invalid arguments and
# unsupported requests are the script's bug: retrying would fail again.
_COLLECTIVE_FAILURES = (tf.errors.FailedPreconditionError, tf.errors.AbortedError,
                        tf.errors.InternalError, tf.errors.UnknownError)


def _is_collective_failure(error):
    text = str(error)
    return "Perseus" in text and "hvd.init()" not in text  # not "not initialized"


def run(func):
    """Decorator: func(state, ...) is retried from the last commit after a
    HorovodInternalError, or after a Perseus op fails with the TF error such a
    failure becomes (as Horovod does for its ops)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except _COLLECTIVE_FAILURES as e:
            if _is_collective_failure(e):
                raise HorovodInternalError(str(e)) from e
            raise

    return run_fn(wrapper)


def _eager_only(what):
    if not tf.executing_eagerly():
        raise NotImplementedError("%s needs eager TensorFlow (TF2); Perseus has no elastic "
                                  "state for TF1 graphs and sessions" % what)


def _snapshot(variables):
    return [tf.identity(tf.convert_to_tensor(v)) for v in variables]  # copies, eager


def _assign(variables, values):
    for variable, value in zip(variables, values):
        variable.assign(value)


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    variables = optimizer.variables  # a property in Keras 3, a method in Keras 2
    return list(variables() if callable(variables) else variables)


class TensorFlowKerasState(ObjectState):
    """State of a Keras model: its variables and its optimizer's (model.optimizer
    unless `optimizer` is given), plus picklable keyword values as attributes.
    `backend` is accepted for Horovod's signature; eager TF needs none."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        _eager_only("TensorFlowKerasState")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer",
                                                                         None)
        self.backend = backend
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self):
        return list(self.model.variables), _optimizer_variables(self.optimizer)

    def _save_model(self):
        model_vars, opt_vars = self._variables()
        self._saved_model_state = _snapshot(model_vars)
        self._saved_optimizer_state = _snapshot(opt_vars)

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        model_vars, opt_vars = self._variables()
        _assign(model_vars, self._saved_model_state)
        # An optimizer that created its slots after the commit keeps their values.
        _assign(opt_vars, self._saved_optimizer_state)
        super().restore()

    def sync(self):
        model_vars, opt_vars = self._variables()
        broadcast_variables(model_vars, root_rank=0)
        if opt_vars:
            broadcast_variables(opt_vars, root_rank=0)
        self._save_model()  # the synced values are the committed ones: restore() returns to them
        super().sync()


class TensorFlowState(ObjectState):
    """State of a list of tf.Variables plus picklable keyword values. Horovod
    defaults `variables` to the TF1 global variables; eager TF has none, so pass
    them. `session` is accepted for Horovod's signature and must be None."""

    def __init__(self, variables=None, session=None, **kwargs):
        _eager_only("TensorFlowState")
        if variables is None or session is not None:
            raise ValueError("TensorFlowState needs `variables` (a list of tf.Variable) in "
                             "eager TensorFlow, and no session")
        self.variables = list(variables)
        self._values = _snapshot(self.variables)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        self._values = _snapshot(self.variables)
        super().save()

    def restore(self):
        _assign(self.variables, self._values)
        super().restore()

    def sync(self):
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
        self._values = _snapshot(self.variables)  # restore() returns to rank 0's values
        super().sync()
