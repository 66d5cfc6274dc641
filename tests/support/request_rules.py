"""Requests the core's rules refuse (csrc/src/common/request_rules.cc), for the rank
scripts that feed them to every place that applies them: a raw perseus_enqueue (the
rules' owner), each front end's public call (which asks the core before it sends
anything, through perseus.common.builder) and the TensorFlow op itself. Each must
refuse alike: the same status (so the same exception class) and the core's message,
bare from a front end's check or after "request '<name>': " from perseus_enqueue.

Framework-free (numpy and perseus.common), so the torch and the TensorFlow scripts
share it. A case is a dict: what, op (op type), dtype (a numpy dtype, or "bool"),
shape and splits (functions of the set's size; splits None: an even split), reduce
(reduce op), min_size (the smallest world it is a refusal in).
"""
import re

import numpy as np

from perseus.common import builder, library, ops
from perseus.common.exceptions import exception_for


def _case(what, op, dtype, shape, splits=None, reduce=ops.Sum, min_size=1):
    return dict(what=what, op=op, dtype=np.dtype(dtype), shape=shape, splits=splits,
                reduce=reduce, min_size=min_size)


CASES = [
    _case("bool allreduce", ops.ALLREDUCE, np.bool_, lambda n: (4,)),
    _case("bool reducescatter", ops.REDUCESCATTER, np.bool_, lambda n: (2 * n,)),
    _case("Adasum of int32", ops.ALLREDUCE, np.int32, lambda n: (4,), reduce=ops.Adasum),
    _case("Adasum reducescatter", ops.REDUCESCATTER, np.float32, lambda n: (2 * n,),
          reduce=ops.Adasum),
    _case("scalar reducescatter", ops.REDUCESCATTER, np.float32, lambda n: ()),
    _case("scalar alltoall", ops.ALLTOALL, np.float32, lambda n: ()),
    _case("scalar allgather", ops.ALLGATHER, np.float32, lambda n: ()),
    _case("splits one too many", ops.ALLTOALL, np.float32, lambda n: (n + 1,),
          splits=lambda n: [1] * (n + 1)),
    _case("a negative split", ops.ALLTOALL, np.float32, lambda n: (n,),
          splits=lambda n: [-1] + [1] * (n - 2) + [2] if n > 1 else [-1]),
    _case("splits that do not sum to dim 0", ops.ALLTOALL, np.float32, lambda n: (n + 1,),
          splits=lambda n: [1] * n),
    _case("an uneven even split", ops.ALLTOALL, np.float32, lambda n: (n + 1,), min_size=2),
]
_CODES = {np.dtype(getattr(np, name if name != "bool" else "bool_")): code
          for code, name in enumerate(ops.DTYPE_NAMES) if name != "bfloat16"}


def cases(size):
    """The cases that are refusals in a world of `size`."""
    return [c for c in CASES if size >= c["min_size"]]


def core_refusal(case, size, name):
    """(status, message) of perseus_enqueue given the case's request, raw (no front
    end's check before it), named `name`; nothing is enqueued."""
    shape = case["shape"](size)
    data = np.zeros(shape, dtype=case["dtype"])
    out = np.zeros(max(data.size, 1), dtype=case["dtype"])
    splits = case["splits"](size) if case["splits"] else None
    request = builder.Request(case["op"], ops.GLOBAL_PROCESS_SET, _CODES[case["dtype"]], shape,
                              data.ctypes.data, out.ctypes.data, name.encode(), case["reduce"],
                              splits=splits)
    buf, n = builder.pack([request])
    base = buf.buffer_info()[0]
    status = library.perseus_enqueue(base + 8 * n, n, base)
    assert status, "%s: perseus_enqueue took it" % case["what"]
    return status, library.perseus_last_error().decode()


_NAMED = re.compile(r"^request '([^']*)': ")


def check_alike(case, size, error, name, core):
    """Asserts that `error` (an exception a front end raised for the case) is the
    core's refusal `core` ((status, message) from core_refusal() under `name`): of
    the status's exception class (library.error's), with the core's message, bare or
    after "request '<its name>': "."""
    status, named_message = core
    rule = _NAMED.sub("", named_message)
    assert named_message == "request '%s': %s" % (name, rule), named_message
    expected = type(exception_for(status, rule))
    assert isinstance(error, expected), (case["what"], type(error), expected, error)
    text = str(error)
    assert text == rule or (_NAMED.match(text) and _NAMED.sub("", text) == rule), \
        (case["what"], text, rule)


def front_end_texts():
    """What the Python front ends' own checks (the values only Python sees) say, from
    their one owner each: (what, exception class, message) for a broadcast root_rank
    of 1.5 (ops.integer) and a request name with a lone surrogate (builder)."""
    found = []
    for what, call in (("root_rank=1.5", lambda: ops.integer(1.5, "broadcast root_rank")),
                       ("a lone surrogate", lambda: builder.wire_name(ops.ALLREDUCE,
                                                                      "rules.\udc80"))):
        try:
            call()
        except Exception as e:  # noqa: BLE001 - its class is what is compared
            found.append((what, type(e), str(e)))
        else:
            raise AssertionError("%s was accepted by its owner" % what)
    return found
