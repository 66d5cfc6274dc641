"""poll() and synchronize() of a handle that is not pending raise ValueError on every
rank: a made-up handle, one already synchronized, one from before the last init(),
and any handle before init(). Nothing is sent, and the engine keeps working."""
import torch

from common import expect_raises, hvd, init, main


def refused(what, fn, handle):
    expect_raises(ValueError, what, fn, handle, contains=["unknown or already synchronized"],
                  within_s=10)


def body():
    for fn in (hvd.synchronize, hvd.poll):
        refused("%s before init" % fn.__name__, fn, 1)
    rank, size = init()
    for fn in (hvd.synchronize, hvd.poll):
        refused("%s of a made-up handle" % fn.__name__, fn, 123456789)
        refused("%s of None" % fn.__name__, fn, None)

    h = hvd.allreduce_async(torch.ones(4), name="bad_handles.once", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), torch.full((4,), float(size)))
    for fn in (hvd.synchronize, hvd.poll):
        refused("%s of a synchronized handle" % fn.__name__, fn, h)

    # A handle completed but never synchronized, then shutdown() and init(): it means
    # nothing to the new engine.
    stale = hvd.allreduce_async(torch.ones(4), name="bad_handles.stale", op=hvd.Sum)
    while not hvd.poll(stale):
        pass
    hvd.shutdown()
    init()
    for fn in (hvd.synchronize, hvd.poll):
        refused("%s of a handle from before init" % fn.__name__, fn, stale)

    got = hvd.allreduce(torch.full((3,), float(rank)), name="bad_handles.after", op=hvd.Sum)
    assert torch.equal(got, torch.full((3,), float(sum(range(size))))), got
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
