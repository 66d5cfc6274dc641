"""Float alltoall splits are refused (Horovod converts splits to int32 and fails),
not truncated; the error is a ValueError on every rank and the library goes on."""
from common import hvd, log, main, tf


def body():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for splits in (tf.ones(size, tf.float32), [1.5] * size):
        try:
            hvd.alltoall(tf.ones(size), splits=splits)
        except ValueError as e:
            assert "integers" in str(e), e
        else:
            raise AssertionError("float splits %r were accepted" % (splits,))
    out, received = hvd.alltoall(tf.fill([size], float(rank)), splits=[1] * size)
    assert out.numpy().tolist() == [float(r) for r in range(size)], out
    assert received.numpy().tolist() == [1] * size, received
    log("float splits refused")
    hvd.shutdown()


main(body)
