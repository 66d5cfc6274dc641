"""Horovod's state-broadcast helpers for PyTorch on Perseus.

broadcast_parameters       root's parameters/buffers into every rank's, in place
broadcast_optimizer_state  root's optimizer state (tensors, scalars such as `step`)
                           and param_groups hyperparameters onto every rank
broadcast_object           any picklable object from root
allgather_object           every rank's picklable object, as a list in rank order

Horovod's module path; the code is shared with the drop-in (perseus/torch/ops/state.py,
perseus/common/objects.py).
"""

# Framework-neutral (pickle over numpy), shared with the TensorFlow front end.
from perseus.common.objects import allgather_object, broadcast_object  # noqa: F401
from perseus.torch.ops.state import broadcast_optimizer_state, broadcast_parameters  # noqa: F401
