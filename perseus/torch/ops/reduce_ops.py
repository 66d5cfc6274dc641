"""ReduceOp: torch.distributed's reduction names, mapped onto the core's ops.

`ReduceOp.SUM` etc. are what scripts pass to all_reduce / reduce_scatter_tensor.
torch's own ``torch.distributed.ReduceOp`` values are accepted too (by name), so a
script that imports ReduceOp from torch keeps working. The core codes come from
perseus.common.ops, the one table of them.
"""

from perseus.common import ops as _ops


class _Op:
    """One reduction: its torch name and the core's code (None: no core support)."""
    __slots__ = ("name", "code")

    def __init__(self, name, code):
        self.name, self.code = name, code

    def __repr__(self):
        return "ReduceOp.%s" % self.name

    def __reduce__(self):
        return (getattr, (ReduceOp, self.name))


class ReduceOp:
    SUM = _Op("SUM", _ops.Sum)
    AVG = _Op("AVG", _ops.Average)
    PRODUCT = _Op("PRODUCT", _ops.Product)
    MIN = _Op("MIN", _ops.Min)
    MAX = _Op("MAX", _ops.Max)
    # torch has these; the core does not reduce bitwise or with a per-call multiplier.
    BAND = _Op("BAND", None)
    BOR = _Op("BOR", None)
    BXOR = _Op("BXOR", None)
    PREMUL_SUM = _Op("PREMUL_SUM", None)


def core_op(op):
    """The core's reduce-op code for `op` (ours, or torch's by name); a clear error
    for anything else."""
    ours = op
    if not isinstance(op, _Op):
        # torch.distributed.ReduceOp.SUM (a RedOpType enum) or a ReduceOp instance
        # (what torch's option structs hold: its `op` is the enum).
        op = getattr(op, "op", op)
        name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
        ours = getattr(ReduceOp, str(name).upper(), None)
        if not isinstance(ours, _Op):
            raise ValueError("unknown reduce op %r: use perseus.torch.distributed.ReduceOp."
                             "SUM, AVG, PRODUCT, MIN or MAX" % (op,))
    if ours.code is None:
        raise NotImplementedError("ReduceOp.%s is not supported by Perseus (supported: SUM, "
                                  "AVG, PRODUCT, MIN, MAX)" % ours.name)
    return ours.code


def op_name(code):
    """torch's name (ReduceOp.MAX) of the core's reduce-op `code`, for messages."""
    return next("ReduceOp.%s" % op.name for op in vars(ReduceOp).values()
                if isinstance(op, _Op) and op.code == code)
