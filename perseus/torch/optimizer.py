"""DistributedOptimizer: Horovod's data-parallel optimizer wrapper on Perseus.

`DistributedOptimizer(opt, named_parameters=model.named_parameters())` returns an
optimizer of a class made on the fly as a subclass of opt's class (so isinstance
checks on the user's optimizer type still hold) with a mixin placed first in its
MRO: optimizer_mixin.py's, which reduces gradients as backward() produces them,
or for op=Adasum adasum_optimizer.py's, which reduces parameter deltas.
"""

from perseus.common.ops import check_predivide
from perseus.common.process_sets import global_process_set
from perseus.torch.adasum_optimizer import _AdasumMixin
from perseus.torch.compression import Compression
from perseus.torch.mpi_ops import Adasum, Average
from perseus.torch.optimizer_mixin import _DistributedMixin


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, gradient_as_bucket_view=None):
    """Wraps `optimizer` so that gradients are averaged (op) over the process set.

    Returns an instance of a subclass of optimizer's class sharing its param_groups
    (hyperparameters included) and its state. gradient_as_bucket_view (a Perseus
    addition; None: PERSEUS_GRADIENT_AS_BUCKET_VIEW, on by default): gradients
    reduced one by one become views into bucket buffers reduced in place
    (grad_buckets.py); False keeps Horovod's one request per gradient.
    """
    check_predivide(op, gradient_predivide_factor)
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be a positive integer, got %r"
                         % (backward_passes_per_step,))
    if groups is not None and num_groups:
        raise ValueError("pass either groups or num_groups, not both")
    if groups is None and num_groups:
        groups = int(num_groups)
    if isinstance(optimizer, _DistributedMixin):
        raise ValueError("the optimizer is already a DistributedOptimizer")

    base = optimizer.__class__
    mixin = _DistributedMixin
    if op == Adasum and process_set.size() > 1:
        # Over one rank, Adasum of the gradient is the gradient: the plain wrapper does.
        mixin = _AdasumMixin
    cls = type(base.__name__, (mixin, base), {"__module__": base.__module__})
    wrapped = cls(optimizer.param_groups, named_parameters, compression,
                  backward_passes_per_step, op, gradient_predivide_factor, groups,
                  sparse_as_dense, process_set, gradient_as_bucket_view)
    # The base __init__ saw only param_groups (which carry the hyperparameters): keep
    # the original's defaults (for add_param_group) and any state it already has.
    wrapped.defaults = optimizer.defaults
    for key, value in optimizer.state.items():
        wrapped.state[key] = value
    return wrapped
