"""PERSEUS_ALLREDUCE_NANCHECK=1 (set by tests/mpi/test_diagnostics.py): a NaN or Inf in
one rank's allreduce input fails the request on every rank with the same error, naming
the tensor and the ranks where it appeared; clean requests, integer tensors and the
requests after an error are unaffected, also clean requests fused into the same buffer
as a bad one (tests/mpi/test_diagnostics.py holds small requests long enough for that)."""
import zlib

import torch

from common import FLOAT_DTYPES, assert_reduced, check_engine_settings, expect_raises, hvd, init, \
    main, make_tensor, touch, wait_for


def raises_everywhere(what, fn, *args, contains=(), **kwargs):
    e = expect_raises(hvd.HorovodInternalError, what, fn, *args, contains=contains, within_s=20,
                      **kwargs)
    assert "NaN or Inf" in str(e), str(e)
    # Every rank got the same text: compare through an allgather of its length and hash.
    text = torch.tensor([len(str(e)), zlib.crc32(str(e).encode())], dtype=torch.int64)
    texts = hvd.allgather(text.unsqueeze(0), name="nancheck.text." + what)
    assert torch.all(texts == texts[0]), (what, str(e))


def body():
    rank, size = init()
    check_engine_settings()  # the test runs two settings in one process
    last = size - 1
    for dtype in FLOAT_DTYPES:
        name = "nan.%s" % str(dtype).split(".")[1]
        t = torch.ones(37, dtype=dtype)
        if rank == last:
            t[11] = float("nan")
        raises_everywhere(name, hvd.allreduce, t, name=name,
                          contains=["%s' on rank(s) [%d]" % (name, last)])
        # Clean input of the same dtype right after: reduced as usual.
        got = hvd.allreduce(torch.ones(37, dtype=dtype), name=name + ".clean", op=hvd.Sum)
        assert torch.all(got == size), got

    # Infinities, on two ranks, in place.
    t = torch.ones(5)
    if rank in (0, 1):
        t[rank] = float("inf") if rank == 0 else float("-inf")
    raises_everywhere("inf", hvd.allreduce_, t, name="inf", contains=["inf' on rank(s) [0, 1]"])

    # Fused with clean tensors: the error names only the bad one.
    tensors = [torch.ones(8) for _ in range(4)]
    if rank == 0:
        tensors[2][3] = float("nan")
    raises_everywhere("grouped", hvd.grouped_allreduce, tensors, name="grouped",
                      contains=["grouped", "on rank(s) [0]"])

    # Many requests fused into one buffer, one bad: only that one fails. Every rank
    # submits all of them before any waits (a file signal, not the library), so the
    # first wait starts one round holding them all.
    for dtype in FLOAT_DTYPES:
        tag = "fused.%s" % str(dtype).split(".")[1]
        inputs = [[make_tensor("%s.%d" % (tag, i), r, (i + 3,), dtype) for r in range(size)]
                  for i in range(12)]
        bad = 7
        if rank == last:
            inputs[bad][last][1] = float("inf")
        handles = [hvd.allreduce_async(xs[rank], name="%s.%d" % (tag, i), op=hvd.Sum)
                   for i, xs in enumerate(inputs)]
        touch("%s.submitted.%d" % (tag, rank))
        for r in range(size):
            wait_for("%s.submitted.%d" % (tag, r))
        for i, (h, xs) in enumerate(zip(handles, inputs)):
            name = "%s.%d" % (tag, i)
            if i == bad:
                raises_everywhere(name, hvd.synchronize, h,
                                  contains=["%s' on rank(s) [%d]" % (name, last)])
            else:
                assert_reduced(hvd.synchronize(h), xs, hvd.Sum, dtype, name)

    # Integers cannot hold NaN; the engine keeps working.
    got = hvd.allreduce(torch.full((6,), rank, dtype=torch.int32), name="ints", op=hvd.Sum)
    assert torch.all(got == size * (size - 1) // 2), got
    got = hvd.allreduce(torch.ones(1000), name="after", op=hvd.Sum)
    assert torch.all(got == size), got
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
