"""Float alltoall splits are refused (Horovod converts splits to int32 and fails),
not truncated; the error is a ValueError (and a TypeError) on every rank and the
library goes on. So are, through the code every front end shares (issue 37), a root
rank or a process set's rank that is not an integer (TypeError) and a name that is not
valid Unicode text (ValueError), with those checks' own messages.

Each request the core's rules refuse (tests/support/request_rules.py) is refused alike by a
raw perseus_enqueue, by the TensorFlow call that makes it (whose Python side asks the
core through perseus.common.builder, or whose op does) and by the op itself, given
the request with no Python check before it: the same status (as the exception class
each raises for it) and the core's message."""
import re

from common import hvd, log, main, tf

from support import request_rules  # tests/, on the path once common is imported
from perseus.common import ops
from perseus.common.exceptions import exception_for
from perseus.tensorflow import op_library

_OPS = op_library.load()
# A core status as the op raises it (perseus_tf_ops.cc: ToStatus).
TF_ERRORS = {1: tf.errors.InvalidArgumentError, 7: tf.errors.UnimplementedError}
# What TensorFlow puts around an op's message.
_TF_DECORATION = re.compile(r"^\{\{[^}]*\}\} | \[Op:\w+\].*$", re.S)


def refused(exc_type, what, call, *words):
    try:
        call()
    except exc_type as e:
        for word in words:
            assert word in str(e), (what, word, e)
        return e
    raise AssertionError("%s was accepted" % what)


def tf_calls(case, size, name):
    """The public call that makes `case`'s request, and the op given it directly."""
    tensor = tf.zeros(case["shape"](size), dtype=case["dtype"].name)
    op, reduce = case["op"], case["reduce"]
    splits = case["splits"](size) if case["splits"] else None
    if op == ops.ALLREDUCE:
        return (lambda: hvd.allreduce(tensor, name=name, op=reduce),
                lambda: _OPS.perseus_allreduce([tensor], [name], reduce_op=reduce))
    if op == ops.REDUCESCATTER:
        return (lambda: hvd.reducescatter(tensor, name=name, op=reduce),
                lambda: _OPS.perseus_reducescatter([tensor], [name], reduce_op=reduce))
    if op == ops.ALLGATHER:
        return (lambda: hvd.allgather(tensor, name=name),
                lambda: _OPS.perseus_allgather([tensor], [name]))
    wire = tf.constant(splits or [], dtype=tf.int32)
    return (lambda: hvd.alltoall(tensor, splits=splits, name=name),
            lambda: _OPS.perseus_alltoall(tensor, wire, name))


def as_core_error(error):
    """A TensorFlow op's error as the front end's exception for the same status, its
    text without TensorFlow's decoration; other errors as they are."""
    for status, kind in TF_ERRORS.items():
        if isinstance(error, kind):
            return exception_for(status, _TF_DECORATION.sub("", error.message))
    return error


def refused_alike(size):
    for i, case in enumerate(request_rules.cases(size)):
        core = request_rules.core_refusal(case, size, "rules.raw.%d" % i)
        for call in tf_calls(case, size, "rules.%d" % i):
            error = refused(Exception, case["what"], call)
            request_rules.check_alike(case, size, as_core_error(error), "rules.raw.%d" % i,
                                      core)
    calls = {"root_rank=1.5": lambda: hvd.broadcast(tf.zeros(3), 1.5, name="rules.root"),
             "a lone surrogate": lambda: hvd.allreduce(tf.zeros(3), name="rules.\udc80")}
    for what, kind, text in request_rules.front_end_texts():
        error = refused(Exception, what, calls[what])
        assert type(error) is kind and str(error) == text, (what, type(error), error, text)


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for splits in (tf.ones(size, tf.float32), [1.5] * size, [1.0] * size):
        try:
            hvd.alltoall(tf.ones(size), splits=splits)
        except ValueError as e:
            assert "integers" in str(e) and isinstance(e, TypeError), e
        else:
            raise AssertionError("float splits %r were accepted" % (splits,))
    mine = tf.fill([3], float(rank))
    refused(TypeError, "root_rank=1.5", lambda: hvd.broadcast(mine, 1.5, name="te.root"),
            "root_rank", "float")
    refused(TypeError, "ProcessSet([0, 0.5])", lambda: hvd.add_process_set([0, 0.5]), "rank")
    refused(ValueError, "a name with a lone surrogate",
            lambda: hvd.allreduce(mine, name="te.\udc80", op=hvd.Sum), "name")
    out = hvd.broadcast(mine, size - 1, name="te.root")
    assert out.numpy().tolist() == [float(size - 1)] * 3, out
    out, received = hvd.alltoall(tf.fill([size], float(rank)), splits=[1] * size)
    assert out.numpy().tolist() == [float(r) for r in range(size)], out
    assert received.numpy().tolist() == [1] * size, received
    log("float splits refused")
    refused_alike(size)
    log("the core's refusals refused alike")
    hvd.shutdown()


main(body)
