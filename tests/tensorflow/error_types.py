"""Float alltoall splits are refused (Horovod converts splits to int32 and fails),
not truncated; the error is a ValueError (and a TypeError) on every rank and the
library goes on. So are, through the code every front end shares (issue 37), a root
rank or a process set's rank that is not an integer (TypeError) and a name that is not
valid Unicode text (ValueError)."""
from common import hvd, log, main, tf


def refused(exc_type, what, call, *words):
    try:
        call()
    except exc_type as e:
        for word in words:
            assert word in str(e), (what, word, e)
    else:
        raise AssertionError("%s was accepted" % what)


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
    hvd.shutdown()


main(body)
