"""Stream ordering without host synchronisation, on the default stream and on a
torch.cuda.Stream made current.

Every input is written by a kernel queued behind busy() (tens of ms of GPU spinning)
on the current stream, after the buffer was set to a stale pattern and synchronised;
every result is read by a further kernel queued on the same stream right after the
call returns, and only then copied to the host. So:
  * a library that read its input without waiting for the caller's stream reduces
    the stale pattern;
  * a caller stream that was not made to wait for the library reads the output
    before the collective wrote it (results are scaled, so even in-place at size 1
    the output differs from the input).
No torch.cuda.synchronize() sits between producing, reducing and consuming.
Also: many requests in flight at once, every collective kind, and core-allocated
outputs (allgather, alltoall) freed and their memory reused many times.
"""
import torch

from common import hvd, main
from gpu_torch_common import busy, init, synchronize

N = (1 << 22) + 5   # 16 MiB of float32, odd
STALE = -7.0
BUSY_MS = 40


def produced_many(device, values, sizes):
    """Tensors whose final values are written by kernels queued behind one busy()."""
    xs = [torch.full((n,), STALE, dtype=torch.float32, device=device) for n in sizes]
    synchronize()  # the stale pattern is really there
    busy(BUSY_MS)
    for x, value in zip(xs, values):
        x.fill_(value)
    return xs


def produced(device, value, n=N):
    return produced_many(device, [value], [n])[0]


def expect(t, value, what):
    """t must hold `value` everywhere; read by a kernel on the current stream first."""
    doubled = t * 2  # the consuming kernel, queued right after the library returned
    host = doubled.cpu()
    bad = host != 2 * value
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError("%s: element %d of %d is %r, expected %r (%d wrong): an ordering "
                             "mistake (stale input %r)" % (what, i, host.numel(), host[i].item() / 2,
                                                           value, int(bad.sum()), STALE))


def run(rank, size, device, tag):
    total = size * (size + 1) / 2  # every rank contributes rank + 1

    # allreduce: out of place, in place, scaled.
    out = hvd.allreduce(produced(device, rank + 1), name=tag + ".ar", op=hvd.Sum, postscale_factor=3.0)
    expect(out, 3 * total, tag + " allreduce")
    x = produced(device, rank + 1)
    hvd.allreduce_(x, name=tag + ".ar_", op=hvd.Sum, prescale_factor=2.0)
    expect(x, 2 * total, tag + " allreduce_ (in place)")

    # Many in flight: each produced behind its own busy period, all awaited afterwards.
    xs = produced_many(device, [rank + 1 + i for i in range(12)], [N // 8 + i for i in range(12)])
    handles = [hvd.allreduce_async(x, name="%s.async.%d" % (tag, i), op=hvd.Sum, postscale_factor=0.5)
               for i, x in enumerate(xs)]
    for i, handle in enumerate(handles):
        expect(hvd.synchronize(handle), 0.5 * (total + size * i), "%s async #%d" % (tag, i))
    outs = hvd.grouped_allreduce(produced_many(device, [rank + 1] * 5, [1000 + i for i in range(5)]),
                                 name=tag + ".grouped", op=hvd.Sum, postscale_factor=3.0)
    for i, out in enumerate(outs):
        expect(out, 3 * total, "%s grouped[%d]" % (tag, i))

    # The other collectives.
    root = size - 1
    expect(hvd.broadcast(produced(device, 10 + rank), root, name=tag + ".bc"), 10 + root, tag + " broadcast")
    x = produced(device, 20 + rank)
    hvd.broadcast_(x, 0, name=tag + ".bc_")
    expect(x, 20, tag + " broadcast_")
    gathered = hvd.allgather(produced(device, 5.0, n=N // 4), name=tag + ".ag")
    assert gathered.shape[0] == size * (N // 4), tag
    expect(gathered, 5.0, tag + " allgather")
    out = hvd.alltoall(produced(device, 4.0, n=size * 1000), name=tag + ".a2a")
    expect(out[0] if isinstance(out, (tuple, list)) else out, 4.0, tag + " alltoall")
    out = hvd.reducescatter(produced(device, rank + 1, n=size * 1001), name=tag + ".rs", op=hvd.Sum)
    expect(out, total, tag + " reducescatter")

    # Core-allocated outputs freed (stream-ordered) and their memory reused: results
    # accumulated on the device stay right.
    acc = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(40):
        g = hvd.allgather(produced(device, float(i), n=4096 + i) if i % 8 == 0
                          else torch.full((4096 + i,), float(i), device=device), name="%s.free.%d" % (tag, i))
        acc += g.double().sum()
        del g
    expected = sum(float(i) * size * (4096 + i) for i in range(40))
    assert abs(acc.item() - expected) < 1e-6 * expected, "%s: reused outputs: %r vs %r" % (tag, acc.item(), expected)


def body():
    rank, size, device = init(inputs_on_gpu=True)
    run(rank, size, device, "order.default")
    if device.type == "cuda":  # not under PTEST_GPU=cpu
        side = torch.cuda.Stream(device=device)
        with torch.cuda.stream(side):
            # The default stream stays idle: waiting on it instead of the current one is wrong.
            assert torch.cuda.current_stream(device) == side
            run(rank, size, device, "order.side")
    synchronize()
    hvd.shutdown()


main(body)
