"""perseus.torch.nn.parallel: DistributedDataParallel over Perseus (torch's API).

Re-exports only: the module wrapper lives in distributed.py, the gradient buckets
and hooks in reducer.py, uneven-input support in join.py, built-in communication
hooks in comm_hooks.py.
"""

from perseus.torch.nn.parallel.distributed import DistributedDataParallel
from perseus.torch.nn.parallel.reducer import GradBucket

__all__ = ["DistributedDataParallel", "GradBucket"]
