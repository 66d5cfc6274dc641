"""The exception types a Horovod PyTorch script catches for invalid collective
arguments (Horovod 0.28.1's tests): RuntimeError for an uneven equal-split alltoall,
splits that do not fit, and a scalar reducescatter; ValueError for float splits.
Perseus raises one error that is both, on every rank, and goes on working.

Then each request the core's rules refuse (tests/support/request_rules.py) is refused alike
by a raw perseus_enqueue and by the torch call that makes it (whose check asks the
core, through perseus.common.builder): the same exception class and the core's
message. So are the checks only Python makes (an integer root rank, a name's text):
with their owners' messages."""
import torch

from common import hvd, log, main

from support import request_rules  # tests/, on the path once common is imported
from perseus.common import ops

TORCH_DTYPES = {"bool": torch.bool, "int32": torch.int32, "float32": torch.float32}


def torch_call(case, size, name):
    """The public torch call that makes `case`'s request."""
    tensor = torch.zeros(case["shape"](size), dtype=TORCH_DTYPES[case["dtype"].name])
    op, reduce = case["op"], case["reduce"]
    if op == ops.ALLREDUCE:
        return lambda: hvd.allreduce(tensor, name=name, op=reduce)
    if op == ops.REDUCESCATTER:
        return lambda: hvd.reducescatter(tensor, name=name, op=reduce)
    if op == ops.ALLGATHER:
        return lambda: hvd.allgather(tensor, name=name)
    splits = case["splits"](size) if case["splits"] else None
    return lambda: hvd.alltoall(tensor, splits=splits, name=name)


def refused_alike(size):
    for i, case in enumerate(request_rules.cases(size)):
        core = request_rules.core_refusal(case, size, "rules.raw.%d" % i)
        try:
            torch_call(case, size, "rules.%d" % i)()
        except Exception as e:  # noqa: BLE001 - its class is checked
            request_rules.check_alike(case, size, e, "rules.raw.%d" % i, core)
        else:
            raise AssertionError("torch took %s" % case["what"])
    calls = {"root_rank=1.5": lambda: hvd.broadcast(torch.zeros(3), 1.5, name="rules.root"),
             "a lone surrogate": lambda: hvd.allreduce(torch.zeros(3), name="rules.\udc80")}
    for what, kind, text in request_rules.front_end_texts():
        try:
            calls[what]()
        except Exception as e:  # noqa: BLE001 - its class is checked
            assert type(e) is kind and str(e) == text, (what, type(e), e, text)
        else:
            raise AssertionError("torch took %s" % what)


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    cases = [
        ("uneven equal-split alltoall", lambda: hvd.alltoall(torch.ones(size + 1)), RuntimeError),
        ("splits that do not fit", lambda: hvd.alltoall(
            torch.ones(size - 1), torch.ones(size, dtype=torch.int32)), RuntimeError),
        ("float splits", lambda: hvd.alltoall(
            torch.ones(size), torch.ones(size, dtype=torch.float32)), ValueError),
        ("scalar reducescatter", lambda: hvd.reducescatter(torch.tensor(float(rank))),
         RuntimeError),
        ("scalar in grouped_reducescatter", lambda: hvd.grouped_reducescatter(
            [torch.zeros(3, 1), torch.tensor(float(rank))]), RuntimeError),
    ]
    for what, bad, horovod_catches in cases:
        try:
            bad()
        except horovod_catches as e:
            assert isinstance(e, ValueError) and isinstance(e, RuntimeError), (what, type(e))
        else:
            raise AssertionError("%s was not refused" % what)
        log(what, "refused")
    refused_alike(size)
    log("the core's refusals refused alike")
    out = hvd.alltoall(torch.arange(size, dtype=torch.float32))
    out = out[0] if isinstance(out, tuple) else out
    assert torch.equal(out, torch.full((size,), float(rank))), out
    hvd.shutdown()


main(body)
