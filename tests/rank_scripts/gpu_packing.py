"""Packing and unpacking of fused GPU batches (csrc/src/cuda/memory/batched_copy.h) on the fake
CUDA runtime: each fused batch makes the calls its way promises, and every byte lands
where it should.

Calls, per fusion buffer (counted by the fake):
  kernel   one pack kernel launch to pack and one to unpack per 160 tensors, no copies;
  batched  one cudaMemcpyBatchAsync each way, a cudaMemsetAsync per zero slot;
  each     one cudaMemcpyAsync per tensor each way, a cudaMemsetAsync per zero slot.
Bytes: odd sizes; tensors at addresses 1..15 bytes past a 16-byte boundary (views into a
byte buffer), input and output skewed alike or not; every dtype; more tensors than one
launch takes; a joined rank's zeros (new device memory on the fake is garbage, so a zero
fill not made shows); fused broadcasts. The 32 guard bytes around every array must stay
untouched. The fake's ordering checker judges every call (capi reads each result on a
consumer stream), and the kernel library is loaded once per process, across init()s.

Environment: FAKE_GPU_LIB; GPU_PACK = kernel, batched or each: the way that the fake's
switches (FAKE_CUDA_NO_LIBRARY, FAKE_CUDA_RUNTIME_VERSION, FAKE_CUDA_NO_BATCH_COPY) leave;
PERSEUS_ALLREDUCE_STREAMS=1 (one lane, so that a joined rank's fusion buffer is the one
an earlier batch dirtied).
"""
import contextlib
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import capi  # noqa: E402
from support import fake_gpu  # noqa: E402
from support.capi import ALLREDUCE, BFLOAT16, BROADCAST  # noqa: E402
from gpu_collectives import DTYPES, assert_fake_released, reduce_ref, same  # noqa: E402
from support.rank_script import log, main  # noqa: E402

MAX_PER_LAUNCH = 160  # PERSEUS_COPY_MAX_ENTRIES
GUARD = 32
GUARD_BYTE = 0xA5
SIZES = [1, 3, 17, 255, 1023, 4097, 2, 33, 8, 12345]  # elements
SKEWS = [0, 1, 4, 15, 8, 2, 7, 12, 3, 0, 14, 9, 5, 11, 6, 10, 13]  # address mod 16


def storage(dtype):
    return np.dtype(np.uint16 if dtype == BFLOAT16 else dtype)


class Slab:
    """Arrays at chosen addresses mod 16, each inside a byte buffer with guard bytes."""

    def __init__(self):
        self.parts = []

    def array(self, values, skew):
        nbytes = values.nbytes
        raw = np.full(GUARD + 16 + nbytes + GUARD, GUARD_BYTE, np.uint8)
        start = GUARD + (skew - (raw.ctypes.data + GUARD)) % 16
        view = raw[start:start + nbytes].view(values.dtype)
        assert view.ctypes.data % 16 == skew and view.flags["C_CONTIGUOUS"]
        view[...] = values
        self.parts.append((raw, start, nbytes))
        return view

    def check_guards(self, what):
        for raw, start, nbytes in self.parts:
            outside = np.concatenate([raw[:start], raw[start + nbytes:]])
            bad = np.flatnonzero(outside != GUARD_BYTE)
            assert bad.size == 0, "%s: %d guard bytes around a %d-byte array were written" % (
                what, bad.size, nbytes)


def expected_calls(way, packed, zeros, unpacked):
    """(launches, copies) for one fusion buffer: `packed` tensors copied in, `zeros`
    slots zero-filled, `unpacked` tensors copied out."""
    if way == "kernel":
        return (math.ceil((packed + zeros) / MAX_PER_LAUNCH) + math.ceil(unpacked / MAX_PER_LAUNCH),
                0)
    if way == "batched":
        return (packed > 0) + (unpacked > 0), zeros
    return 0, packed + zeros + unpacked


class Calls:
    """What one fused batch costs, counted by the fake, checked against its way."""

    def __init__(self, what, packed, zeros, unpacked, aligned=False):
        self.what = what
        self.expected = expected_calls(os.environ["GPU_PACK"], packed, zeros, unpacked)
        self.aligned = aligned  # every tensor 16-byte aligned: so must every kernel copy be

    def __enter__(self):
        self.before = fake_gpu.calls()
        self.entries = fake_gpu.kernel_entries()

    def __exit__(self, *exc):
        if exc[0] is not None:
            return
        entries, narrow = (a - b for a, b in zip(fake_gpu.kernel_entries(), self.entries))
        if self.aligned:  # the fusion buffer's slots start on 16-byte boundaries
            assert narrow == 0, "%s: %d of %d kernel copies not 16-byte congruent" % (
                self.what, narrow, entries)
        after = fake_gpu.calls()
        got = tuple(after[k] - self.before[k] for k in ("launches", "copies"))
        nccl = after["nccl"] - self.before["nccl"]
        assert nccl == 1, "%s: %d NCCL calls, expected one fused call" % (self.what, nccl)
        assert got == self.expected, "%s (%s): %d launches and %d copies, expected %d and %d" % (
            self.what, os.environ["GPU_PACK"], got[0], got[1], self.expected[0], self.expected[1])


def fused_allreduce(rank, size, device, tag, specs):
    """specs: (elements, dtype, input skew, output skew) per tensor, all in one batch."""
    slab = Slab()
    xs = [[capi.make("%s.%d" % (tag, i), r, (n,), dtype) for r in range(size)]
          for i, (n, dtype, _, _) in enumerate(specs)]
    ins = [slab.array(x[rank], skew) for x, (_, _, skew, _) in zip(xs, specs)]
    outs = [slab.array(np.zeros_like(x[rank]), skew) for x, (_, _, _, skew) in zip(xs, specs)]
    aligned = all(s_in == 0 and s_out == 0 for _, _, s_in, s_out in specs)
    with Calls("allreduce %s of %d tensors" % (tag, len(specs)), len(specs), 0, len(specs), aligned):
        pending = capi.submit(*[capi.request(ALLREDUCE, "%s.%d" % (tag, i), x, out=out,
                                             device=device, dtype=spec[1])
                                for i, (x, out, spec) in enumerate(zip(ins, outs, specs))])
        for i, (p, x, spec) in enumerate(zip(pending, xs, specs)):
            same(p.value(), reduce_ref(x, capi.SUM, spec[1]), "%s #%d (%s)" % (tag, i, spec))
    slab.check_guards(tag)


def specs_of(count, dtypes, congruent=True):
    """`count` tensors of SIZES elements cycling through dtypes and skews; the output's
    skew equals the input's when congruent (16-byte units), else it differs."""
    return [(SIZES[i % len(SIZES)], dtypes[i % len(dtypes)], SKEWS[i % len(SKEWS)],
             SKEWS[i % len(SKEWS)] if congruent else SKEWS[(i + 5) % len(SKEWS)])
            for i in range(count)]


def check_allreduce(rank, size, device):
    for dtype in DTYPES:  # dtypes never share an allreduce batch
        name = dtype if dtype == BFLOAT16 else np.dtype(dtype).name
        fused_allreduce(rank, size, device, "ar.%s.aligned" % name,
                        [(n, dtype, 0, 0) for n in SIZES])
        fused_allreduce(rank, size, device, "ar.%s" % name, specs_of(11, [dtype]))
        fused_allreduce(rank, size, device, "ar.%s.skewed" % name, specs_of(11, [dtype], False))
    for count in (2, MAX_PER_LAUNCH, MAX_PER_LAUNCH + 1, 2 * MAX_PER_LAUNCH + 1):
        fused_allreduce(rank, size, device, "ar.many%d" % count, specs_of(count, [np.float32]))


def check_join(rank, size, device):
    """Rank 0 reduces a fused batch while the others have joined: their slots must be
    zeros. The same batch first runs on every rank, so that a joined rank's fusion buffer
    holds other values where its zeros must go."""
    if size < 2:
        return
    specs = specs_of(7, [np.float32])
    fused_allreduce(rank, size, device, "dirty", specs)
    slab = Slab()
    if rank == 0:
        xs = [capi.make("joined.%d" % i, rank, (n,), np.float32) for i, (n, *_) in enumerate(specs)]
        ins = [slab.array(x, s) for x, (_, _, s, _) in zip(xs, specs)]
        outs = [slab.array(np.zeros_like(x), s) for x, (_, _, _, s) in zip(xs, specs)]
        with Calls("allreduce with joined ranks", len(specs), 0, len(specs)):
            pending = capi.submit(*[capi.request(ALLREDUCE, "joined.%d" % i, x, out=out, device=device)
                                    for i, (x, out) in enumerate(zip(ins, outs))])
            for i, (p, x) in enumerate(zip(pending, xs)):
                same(p.value(), x, "allreduce #%d with joined ranks (their zeros)" % i)
        slab.check_guards("joined")
    with Calls("a joined rank's zeros", 0, len(specs), 0) if rank else contextlib.nullcontext():
        last = capi.submit(capi.request(capi.JOIN, "join"))[0]
        status, message = last.wait()
        last.release()
    assert status == 0, message


def check_broadcast(rank, size, device):
    """One fused broadcast of mixed dtypes (as bytes) and skews; on the root the first
    tensor is its own output (in place: not unpacked)."""
    root = size - 1
    specs = [(n, d, s_in, s_out) for n, d, s_in, s_out in specs_of(9, DTYPES, congruent=False)]
    slab = Slab()
    values = [capi.make("bc.%d" % i, rank, (n,), d) for i, (n, d, _, _) in enumerate(specs)]
    ins = [slab.array(v, s) for v, (_, _, s, _) in zip(values, specs)]
    outs = [ins[0] if rank == root and i == 0 else slab.array(np.zeros_like(v), s)
            for i, (v, (_, _, _, s)) in enumerate(zip(values, specs))]
    packed, unpacked = (len(specs), len(specs) - 1) if rank == root else (0, len(specs))
    with Calls("fused broadcast", packed, 0, unpacked):
        pending = capi.submit(*[capi.request(BROADCAST, "bc.%d" % i, x, out=out, device=device,
                                             root=root, dtype=spec[1])
                                for i, (x, out, spec) in enumerate(zip(ins, outs, specs))])
        for i, (p, spec) in enumerate(zip(pending, specs)):
            same(p.value(), capi.make("bc.%d" % i, root, (spec[0],), spec[1]), "broadcast #%d" % i)
    slab.check_guards("broadcast")


def libraries_expected():
    return 0 if os.environ.get("FAKE_CUDA_NO_LIBRARY") == "1" else 1


def body():
    rank, size = capi.init()
    device = 0
    # The lane opens first: choosing the way launches the kernel once (batched_copy.h).
    x = capi.make("open", rank, (3,), np.float32)
    capi.run(ALLREDUCE, "open", x, device=device)
    check_allreduce(rank, size, device)
    check_join(rank, size, device)
    check_broadcast(rank, size, device)
    capi.shutdown()
    assert_fake_released()
    # Another init(): new lanes, the same kernel library.
    capi.init()
    fused_allreduce(rank, size, device, "again", specs_of(5, [np.float64]))
    capi.shutdown()
    assert_fake_released()
    assert fake_gpu.libraries() == libraries_expected(), (fake_gpu.libraries(), libraries_expected())
    log("packed with", os.environ["GPU_PACK"], fake_gpu.calls())


if __name__ == "__main__":
    main(body)
