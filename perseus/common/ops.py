"""Numeric constants of the C ABI that front ends pass to the core.

Values mirror the enums in csrc/include/perseus/perseus.h; changing one here
without the header breaks every request. Framework dtype tables live in the
adapters and map onto the dtype codes below.
"""

import operator

from perseus.common.exceptions import CollectiveTypeError

# perseus_reduce_op_t, with Horovod's values: these are hvd.Average, hvd.Sum, ...
Average = 0
Sum = 1
Adasum = 2  # allreduce of float tensors only (csrc/src/collectives/adasum.cc)
Min = 3
Max = 4
Product = 5
# Not Horovod's (hvd.* refuses them): torch.distributed's bitwise ops, integer tensors only.
BAND = 6
BOR = 7
BXOR = 8

REDUCE_OP_NAMES = ("Average", "Sum", "Adasum", "Min", "Max", "Product", "BAND", "BOR", "BXOR")


def resolve_op(op, average):
    """The reduce op of a front end's collective call, by Horovod's op/average rules
    (average= is deprecated). Unknown ops are refused here, before anything is
    enqueued. Called from the front end's public function, so the warning points
    at the user's line."""
    if op is None:
        if average is None:
            return Average
        import warnings
        # Horovod's text, which scripts may filter warnings by.
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op not in (Sum, Average, Min, Max, Product, Adasum):
        raise ValueError("unknown reduce op %r" % (op,))
    return op


def integer(value, what):
    """`value` as an int, for an argument Horovod takes as an integer (a root rank, a
    process set's ranks, alltoall splits): ints, bools, numpy integers and 0-d integer
    tensors pass (what has __index__, as Horovod's C++ bindings take); anything else,
    a float such as 1.0 included, is a CollectiveTypeError naming `what`, on every
    front end, rather than truncated."""
    try:
        return operator.index(value)
    except TypeError:
        raise CollectiveTypeError("%s must be an integer, got %s %r"
                                  % (what, type(value).__name__, value)) from None


def check_predivide(op, gradient_predivide_factor):
    """A DistributedOptimizer's gradient_predivide_factor, by Horovod's rule (and its
    text): only with op=Average. Every front end calls this one check."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be positive, got %r"
                         % (gradient_predivide_factor,))

# Raised by the front ends' gradient of an allreduce with op=Adasum: Adasum is not
# linear in its inputs, so reducing the upstream gradients again (what Horovod does)
# would not be the gradient.
ADASUM_HAS_NO_GRADIENT = ("allreduce with op=Adasum has no gradient (Adasum is not linear in "
                          "its inputs); reduce the gradients with op=Adasum instead")


# perseus_op_type_t
ALLREDUCE = 0
ALLGATHER = 1
BROADCAST = 2
ALLTOALL = 3
REDUCESCATTER = 4
BARRIER = 5
JOIN = 6

# Lower-case names, used as the prefix of request names ("allreduce.<name>").
OP_TYPE_NAMES = ("allreduce", "allgather", "broadcast", "alltoall",
                 "reducescatter", "barrier", "join")

# perseus_dtype_t
UINT8 = 0
INT8 = 1
INT32 = 2
INT64 = 3
FLOAT16 = 4
BFLOAT16 = 5
FLOAT32 = 6
FLOAT64 = 7
BOOL = 8
INT16 = 9
NUM_DTYPES = 10

# Bytes per element, indexed by dtype code (sizes core-allocated outputs).
DTYPE_SIZES = (1, 1, 4, 8, 2, 2, 4, 8, 1, 2)
DTYPE_NAMES = ("uint8", "int8", "int32", "int64", "float16", "bfloat16",
               "float32", "float64", "bool", "int16")

# Device id of host memory (PERSEUS_CPU_DEVICE) and the id of the set of all
# ranks (PERSEUS_GLOBAL_PROCESS_SET).
CPU_DEVICE = -1
GLOBAL_PROCESS_SET = 0
