"""A stress run of the device lanes (issue 36): STRESS_STEPS steps (scripts/gpu_check.sh
runs 1,000 on a GPU; CI a few on the fake GPU) of random batches, each checked against
the same collectives on host copies of the inputs through Perseus's MPI path (what
host-staging computes), under a watchdog that turns a hang into a failure naming the
step.

A step is one burst of requests on one of two process sets (the global set, and the
upper half of the ranks as a second), or now and then on both at once (so that the two
sets' GPU collectives are in flight together and must launch in one order across sets),
submitted together so that they fuse into batches spread over the lanes: allreduce (Sum, Average, Min, Max, Product; scaled Sum and Average), broadcast
from a random root, allgather with rows differing by rank, reducescatter with rows that
do and do not split evenly; eight dtypes; sizes on both sides of every boundary (empty,
one element, 16 bytes, the chunk, the fusion threshold, 1 MiB, 16 MiB where
STRESS_LARGEST allows; the test sets PERSEUS_CHUNK_SIZE and PERSEUS_FUSION_THRESHOLD),
and now and then 170 small tensors at once (the pack kernel takes 160 per launch).
Inputs are small integers and scales are powers of two: integer results must be equal,
floating ones within a few units of the last place (an average over 3 ranks rounds as
each path divides).

STRESS_DEVICE: fake (the core's C ABI with device 0 on tests/gpu_fakes; GPU_MODE=nccl: NCCL
must have run) or cuda / cuda:N (the torch front end on this rank's GPU, or on GPU N for
every rank); cpu runs the torch front end's part with CPU tensors on both sides (a
smoke test of this script where torch has no CUDA, not of the GPU path). STRESS_SEED
varies the run; STRESS_STEP_TIMEOUT_S (60) is the watchdog's limit.
"""
import faulthandler
import os
import sys
import threading
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.rank_script import log, main  # noqa: E402

STEPS = int(os.environ.get("STRESS_STEPS", "1000"))
LARGEST = int(os.environ.get("STRESS_LARGEST", str(64 << 20)))  # bytes per tensor at most
SEED = int(os.environ.get("STRESS_SEED", "36"))
STEP_TIMEOUT_S = float(os.environ.get("STRESS_STEP_TIMEOUT_S", "60"))
BOUNDARIES = [0, 1, 16, 4096, int(os.environ.get("PERSEUS_CHUNK_SIZE", 4 << 20)),
              int(os.environ.get("PERSEUS_FUSION_THRESHOLD", 128 << 20)), 1 << 20, 16 << 20]
REDUCED = ["float32", "float16", "bfloat16", "float64", "int32", "int64"]
MOVED = REDUCED + ["uint8", "int8"]
OPS = ["Sum", "Average", "Min", "Max", "Product"]
KINDS = ["allreduce"] * 6 + ["broadcast", "allgather", "reducescatter"]  # drawn from, allreduce the most
SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "uint8": 1, "int8": 1}


# ---------------------------------------------------------------- what a step does

def upper_half(size):
    return list(range(size // 2, size))


# Relative differences the paths may show, by dtype (0: equal).
TOLERANCE = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}


def same(got, want, dtype):
    if got.shape != want.shape:
        return False
    rtol = TOLERANCE.get(dtype, 0)
    return np.array_equal(got, want) if rtol == 0 else np.allclose(got, want, rtol=rtol, atol=rtol)


def elements(rng, dtype):
    """A size on one side of a boundary, in elements of dtype, within STRESS_LARGEST."""
    size = SIZES[dtype]
    fits = [b for b in BOUNDARIES if b <= LARGEST]
    n = max(0, fits[int(rng.integers(len(fits)))] // size + int(rng.integers(-1, 2)))
    return min(n, LARGEST // size)


def step_parts(step, size, second_set):
    """The same on every rank: a step's parts, each (set: 0 or 1, members, [request])."""
    rng = np.random.default_rng(zlib.crc32(b"stress-sets|%d|%d" % (SEED, step)))
    both = second_set and rng.random() < 0.25
    first = step_plan(step, size, second_set)
    if not both:
        return [first]
    return [first, step_plan(step, size, second_set, on_second=first[0] == 0, prefix="t")]


def step_plan(step, size, second_set, on_second=None, prefix="s"):
    """One part of a step: (set: 0 or 1, members, [request]), a request being a dict."""
    rng = np.random.default_rng(zlib.crc32(b"stress|%d|%d|%s" % (SEED, step, prefix.encode())))
    drawn = second_set and rng.random() < 0.3
    on_second = drawn if on_second is None else on_second
    members = upper_half(size) if on_second else list(range(size))
    requests = []
    many = rng.random() < 0.05
    for i in range(170 if many else int(rng.integers(1, 9))):
        kind = "allreduce" if many else str(rng.choice(KINDS))
        dtype = str(rng.choice(REDUCED if kind in ("allreduce", "reducescatter") else MOVED))
        r = {"kind": kind, "name": "%s%d.%d" % (prefix, step, i), "dtype": dtype, "op": "Sum", "pre": 1.0, "post": 1.0,
             "rows": 1 if many else elements(rng, dtype), "root": members[int(rng.integers(len(members)))],
             "uneven": bool(rng.random() < 0.5)}
        if kind == "allreduce":
            r["op"] = str(rng.choice(OPS))
            if r["op"] in ("Sum", "Average") and dtype.startswith(("float", "bfloat")) and rng.random() < 0.3:
                r["pre"], r["post"] = float(rng.choice([0.5, 2.0])), float(rng.choice([0.5, 1.0, 2.0]))
        if kind == "reducescatter":  # rows that split evenly over the set, or (uneven) do not
            extra = int(rng.integers(1, len(members))) if r["uneven"] and len(members) > 1 else 0
            r["rows"] = r["rows"] // 4 * len(members) + extra
        requests.append(r)
    return (1 if on_second else 0), members, requests


def make_input(r, rank, members):
    """This rank's input: small integers (exact in every dtype, sum and product)."""
    rows = r["rows"] + (members.index(rank) if r["kind"] == "allgather" and r["uneven"] else 0)
    shape = (rows, 2) if r["kind"] in ("allgather", "reducescatter") else (rows,)
    rng = np.random.default_rng(zlib.crc32(("%s|%d" % (r["name"], rank)).encode()))
    low, high = (0, 3) if r["dtype"] == "uint8" else ((-2, 2) if r["op"] == "Product" else (-4, 4))
    return rng.integers(low, high + 1, size=shape).astype(np.float32 if r["dtype"] == "bfloat16" else r["dtype"])


# ---------------------------------------------------------------- two ways in

class FakeGpu:
    """The core's C ABI (tests/support/capi.py), device 0 on the fake CUDA runtime and NCCL."""

    def __init__(self):
        from support import capi
        self.capi = capi
        self.rank, self.size = capi.init()

    def add_set(self, ranks):
        return self.capi.add_process_set(ranks)

    def start(self, requests, on_gpu, process_set):
        capi = self.capi
        built = []
        for r, x in requests:
            device = 0 if on_gpu else capi.CPU
            dtype = capi.BFLOAT16 if r["dtype"] == "bfloat16" else None
            data = np.ascontiguousarray(capi.to_bf16(x) if dtype else x)
            name = r["name"] + (".gpu" if on_gpu else ".cpu")
            common = dict(device=device, process_set=process_set, dtype=dtype)
            if r["kind"] == "allreduce":
                built.append(capi.request(capi.ALLREDUCE, name, data, reduce_op=getattr(capi, r["op"].upper()),
                                          prescale=r["pre"], postscale=r["post"], **common))
            elif r["kind"] == "broadcast":
                built.append(capi.request(capi.BROADCAST, name, data, root=r["root_in_set"], **common))
            elif r["kind"] == "allgather":
                built.append(capi.request(capi.ALLGATHER, name, data, **common))
            else:  # into an output of this rank's rows (the first rows % size ranks get one more)
                n = len(r["members"])
                mine = data.shape[0] // n + (1 if r["members"].index(self.rank) < data.shape[0] % n else 0)
                built.append(capi.request(capi.REDUCESCATTER, name, data, reduce_op=capi.SUM,
                                          out=np.empty((mine,) + data.shape[1:], data.dtype), **common))
        return capi.submit(*built)

    def result(self, pending, dtype):
        out = np.asarray(pending.value())
        return self.capi.from_bf16(out) if dtype == "bfloat16" else out

    def close(self):
        from support import fake_gpu
        self.capi.shutdown()
        stats = fake_gpu.stats()
        assert stats["misuses"] == 0, stats
        if os.environ.get("GPU_MODE") == "nccl":  # the GPU results came from NCCL, not host staging
            assert stats["nccl_calls"] > 0, stats


class TorchGpu:
    """The torch front end, CUDA tensors on this rank's GPU (or on STRESS_DEVICE's)."""

    def __init__(self, device):
        import torch
        import perseus.torch.horovod as hvd
        self.torch, self.hvd = torch, hvd
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        if device == "cpu":
            self.device = torch.device("cpu")
        else:
            self.device = torch.device(device if ":" in device else "cuda:%d" % hvd.local_rank())
            torch.cuda.set_device(self.device)

    def add_set(self, ranks):
        return self.hvd.add_process_set(ranks)

    def start(self, requests, on_gpu, process_set):
        torch, hvd = self.torch, self.hvd
        handles = []
        for r, x in requests:
            t = torch.from_numpy(np.ascontiguousarray(x))
            if r["dtype"] == "bfloat16":
                t = t.to(torch.bfloat16)
            t = t.to(self.device) if on_gpu else t
            name = r["name"] + (".gpu" if on_gpu else ".cpu")
            if r["kind"] == "allreduce":
                handles.append(hvd.allreduce_async(t, name=name, op=getattr(hvd, r["op"]), prescale_factor=r["pre"],
                                                   postscale_factor=r["post"], process_set=process_set))
            elif r["kind"] == "broadcast":
                handles.append(hvd.broadcast_async(t, r["root"], name=name, process_set=process_set))  # a global rank
            elif r["kind"] == "allgather":
                handles.append(hvd.allgather_async(t, name=name, process_set=process_set))
            else:
                handles.append(hvd.reducescatter_async(t, name=name, op=hvd.Sum, process_set=process_set))
        return handles

    def result(self, handle, dtype):
        out = self.hvd.synchronize(handle)
        return out.float().cpu().numpy() if dtype == "bfloat16" else out.cpu().numpy()

    def close(self):
        self.hvd.shutdown()


# ---------------------------------------------------------------- the run

class Watchdog:
    """Turns a step that does not finish in STRESS_STEP_TIMEOUT_S into a failure that
    names it (every thread's stack, then exit 3), instead of a hang."""

    def __init__(self):
        self.step, self.what, self.since = None, "", time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def begin(self, step, what):
        self.step, self.what, self.since = step, what, time.monotonic()

    def _watch(self):
        while True:
            time.sleep(0.5)
            if self.step is not None and time.monotonic() - self.since > STEP_TIMEOUT_S:
                log("HANG: step %d (%s) did not finish in %.0f s" % (self.step, self.what, STEP_TIMEOUT_S))
                faulthandler.dump_traceback(all_threads=True)
                sys.stdout.flush()
                os._exit(3)


def body():
    where = os.environ.get("STRESS_DEVICE", "fake")
    way = FakeGpu() if where == "fake" else TorchGpu(where)
    rank, size = way.rank, way.size
    second = way.add_set(upper_half(size)) if size > 1 else None
    sets = [0 if where == "fake" else way.hvd.global_process_set, second]
    watchdog = Watchdog()
    checked = 0
    start = time.monotonic()
    for step in range(STEPS):
        parts = step_parts(step, size, second is not None)
        watchdog.begin(step, "; ".join("set %d, %d requests: %s" % (which, len(requests), ", ".join(
            " ".join([r["kind"]] + ([r["op"]] if r["kind"] == "allreduce" else []) + [r["dtype"], "x%d" % r["rows"]])
            for r in requests[:8])) for which, _, requests in parts))
        started = []  # every part's GPU requests first, so that the sets' collectives overlap
        for which, members, requests in parts:
            if rank not in members:
                continue
            for r in requests:
                r["root_in_set"], r["members"] = members.index(r["root"]), members
            inputs = [(r, make_input(r, rank, members)) for r in requests]
            started.append((requests, way.start(inputs, True, sets[which]), way.start(inputs, False, sets[which])))
        for requests, on_gpu, on_host in started:
            for r, got_h, want_h in zip(requests, on_gpu, on_host):
                got, want = way.result(got_h, r["dtype"]), way.result(want_h, r["dtype"])
                if not same(got, want, r["dtype"]):
                    bad = np.flatnonzero(got.ravel() != want.ravel()) if got.shape == want.shape else []
                    raise AssertionError("step %d, %s (%s %s, %s, rows %d): the GPU result differs from the host's: "
                                         "shape %s vs %s; %d element(s) differ, first at %s: %r vs %r"
                                         % (step, r["name"], r["kind"], r["op"], r["dtype"], r["rows"], got.shape,
                                            want.shape, len(bad), bad[:1], got.ravel()[bad[:1]], want.ravel()[bad[:1]]))
                checked += 1
        if step % 100 == 99:
            log("step %d: %d results checked, %.1f s" % (step + 1, checked, time.monotonic() - start))
    watchdog.begin(STEPS, "shutdown")
    way.close()
    log("stress: %d steps, %d results equal to the host's, in %.1f s" % (STEPS, checked, time.monotonic() - start))


if __name__ == "__main__":
    main(body)
