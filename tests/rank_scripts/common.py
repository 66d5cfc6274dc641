"""Helpers shared by the scripts that mpirun runs on every rank.

Inputs come from `make_tensor(tag, rank, shape, dtype)`, a pure function of its
arguments, so every rank can rebuild every other rank's input and compute the expected
result of a collective locally with plain torch, without trusting the library under test.

A script calls `main(body)`: any exception prints a traceback tagged with the rank and
ends the process with exit code 1 at once (MPICH then tears the job down), so a
failure on one rank fails the test instead of leaving the others waiting.

PTEST_DEVICE=cuda (or cuda:N) runs a script's checks on CUDA tensors (tests/gpu/test_gpu.py):
make_tensor() then puts every input on this rank's GPU (or on GPU N, shared by all
ranks), results must come back on that device, and references are still computed on
the CPU.
"""
import os
import sys
import tempfile
import time
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.rank_script import launcher_rank_size, log, main, rank_tag  # noqa: E402,F401 - shared by scripts

import perseus.torch.horovod as hvd  # noqa: E402

INT_DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INT_DTYPES + FLOAT_DTYPES
DTYPES_WITH_BOOL = DTYPES + [torch.bool]

# Value ranges chosen so that no reference result overflows with up to MAX_RANKS ranks.
MAX_RANKS = 4
_INT_RANGES = {
    "sum": {torch.uint8: (0, 60), torch.int8: (-30, 30),
            torch.int32: (-10**6, 10**6), torch.int64: (-10**6, 10**6)},
    "product": {torch.uint8: (0, 3), torch.int8: (-3, 3),
                torch.int32: (-20, 20), torch.int64: (-1000, 1000)},
    # Values a float64 cannot hold exactly: a path through double would show.
    "big": {torch.uint8: (0, 60), torch.int8: (-30, 30),
            torch.int32: (-2**28, 2**28), torch.int64: (-2**60, 2**60)},
}


# Where make_tensor() puts the inputs: the CPU unless PTEST_DEVICE says otherwise.
DEVICE = torch.device("cpu")


def pick_device(spec):
    """'cpu'; 'cuda': this rank's own GPU (local rank modulo the GPU count); 'cuda:N':
    GPU N whatever the rank (several ranks sharing one GPU). Call after hvd.init()."""
    if spec in (None, "", "cpu"):
        return torch.device("cpu")
    if spec == "cuda":
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    else:
        device = torch.device(spec)
    torch.cuda.set_device(device)
    return device


def init():
    global DEVICE
    hvd.init()
    assert hvd.size() <= MAX_RANKS, "value ranges in common.py assume at most %d ranks" % MAX_RANKS
    DEVICE = pick_device(os.environ.get("PTEST_DEVICE"))
    return hvd.rank(), hvd.size()


# Horovod's names of settings that config() reports under Perseus's: name -> (Perseus's
# name, {value: config()'s value}, or None where it is the same).
HOROVOD_SETTINGS = {"HOROVOD_FUSION_THRESHOLD": ("PERSEUS_FUSION_THRESHOLD", None),
                    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("PERSEUS_ALLREDUCE_MODE",
                                                       {"1": "hierarchical", "0": "flat"})}


def check_engine_settings():
    """The engine runs under the settings of this process's environment now. A test that
    runs a script under several settings in one process (run_mpi_batch's settings,
    tests/conftest.py) relies on each init() reading them again: were the first init()'s
    kept, every run after it would test those."""
    config = hvd.config()
    given = {k: v for k, v in os.environ.items() if k in config}
    for name, (ours, values) in HOROVOD_SETTINGS.items():
        if name in os.environ and ours not in os.environ:
            given[ours] = values[os.environ[name]] if values else os.environ[name]
    for name, value in sorted(given.items()):
        if config[name] in ("0", "1"):  # a switch: config() says 0 or 1 for any spelling
            value = {"true": "1", "on": "1", "yes": "1", "false": "0", "off": "0",
                     "no": "0"}.get(value.lower(), value)
        assert config[name] == value, "%s: the engine runs with %r, the environment says %r" % (
            name, config[name], value)


# ---------------------------------------------------------------- inputs

def seed_of(tag, rank):
    return zlib.crc32(("%s|%d" % (tag, rank)).encode())


def make_tensor(tag, rank, shape, dtype, kind="sum"):
    """The input `rank` contributes under `tag`.

    kind: 'sum' (also Average/Min/Max), 'product' (magnitudes kept near 1),
    'big' (integers beyond 2**53), 'exact' (small integers stored in any dtype:
    every sum and average over <= 4 ranks is exactly representable).
    """
    return _make_cpu_tensor(tag, rank, tuple(shape), dtype, kind).to(DEVICE)


def _make_cpu_tensor(tag, rank, shape, dtype, kind):
    g = torch.Generator().manual_seed(seed_of(tag, rank))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if kind == "exact":
        lo, hi = (0, 15) if dtype == torch.uint8 else (-8, 8)
        return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)
    if dtype.is_floating_point:
        if kind == "product":
            magnitude = torch.rand(shape, generator=g, dtype=torch.float64) * 1.5 + 0.5
            sign = torch.randint(0, 2, shape, generator=g).to(torch.float64) * 2 - 1
            return (magnitude * sign).to(dtype)
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
    lo, hi = _INT_RANGES[kind][dtype]
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64).to(dtype)


def kind_for(op):
    return "product" if op == hvd.Product else "sum"


def op_name(op):
    for name in ("Sum", "Average", "Min", "Max", "Product"):
        if op == getattr(hvd, name):
            return name
    return str(op)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------- references

def reference_reduce(inputs, op, dtype, prescale=1.0, postscale=1.0):
    """(expected, bound): the exact reduction computed in int64 / float64, and the
    largest error a float result may carry (None for integer dtypes: exact).

    The bound allows one rounding per addend, per scaling and for the final cast:
    (n + 3) * eps * sum(|scaled addends|) for Sum/Average, relative for Product,
    zero for Min/Max (a selection, never rounded).
    """
    inputs = [x.cpu() for x in inputs]  # the reference never runs on a GPU
    n = len(inputs)
    if not dtype.is_floating_point:
        xs = torch.stack([x.to(torch.int64) for x in inputs])
        if op == hvd.Sum:
            return xs.sum(0), None
        if op == hvd.Average:
            # Sum scaled by 1/n, truncated toward zero.
            return torch.div(xs.sum(0), n, rounding_mode="trunc"), None
        if op == hvd.Min:
            return xs.amin(0), None
        if op == hvd.Max:
            return xs.amax(0), None
        if op == hvd.Product:
            return xs.prod(0), None
        raise AssertionError("no reference for op %r" % op)
    xs = torch.stack([x.to(torch.float64) for x in inputs]) * prescale
    eps = torch.finfo(dtype).eps
    tiny = torch.finfo(dtype).tiny
    if op in (hvd.Sum, hvd.Average):
        scale = postscale / n if op == hvd.Average else postscale
        expected = xs.sum(0) * scale
        bound = (n + 3) * eps * xs.abs().sum(0) * abs(scale) + tiny
        return expected, bound
    if op == hvd.Min:
        return xs.amin(0) * postscale, torch.zeros(xs.shape[1:], dtype=torch.float64)
    if op == hvd.Max:
        return xs.amax(0) * postscale, torch.zeros(xs.shape[1:], dtype=torch.float64)
    if op == hvd.Product:
        expected = xs.prod(0) * postscale
        return expected, (n + 3) * eps * expected.abs() + tiny
    raise AssertionError("no reference for op %r" % op)


def assert_close(got, expected, bound, dtype, what, exact=False):
    """got (a tensor of `dtype`) against an int64/float64 expectation."""
    assert isinstance(got, torch.Tensor), "%s: expected a tensor, got %r" % (what, type(got))
    assert got.dtype == dtype, "%s: dtype %s, expected %s" % (what, got.dtype, dtype)
    assert tuple(got.shape) == tuple(expected.shape), \
        "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(expected.shape))
    got = on_host(got, what)
    expected = expected.cpu()
    if bound is None or exact:
        ok = torch.equal(got.to(expected.dtype), expected)
        if not ok:
            raise AssertionError("%s: not equal to the reference\n got %s\n expected %s"
                                 % (what, got.flatten()[:8].tolist(), expected.flatten()[:8].tolist()))
        return
    diff = (got.to(torch.float64) - expected).abs()
    bad = ~(diff <= bound.cpu())  # also catches NaN
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError("%s: %d of %d elements off; first at flat index %d: got %r, "
                             "expected %r (allowed error %.3g)"
                             % (what, int(bad.sum()), bad.numel(), i, got.flatten()[i].item(),
                                expected.flatten()[i].item(), bound.flatten()[i].item()))


def assert_reduced(got, inputs, op, dtype, what, prescale=1.0, postscale=1.0, exact=False):
    expected, bound = reference_reduce(inputs, op, dtype, prescale, postscale)
    assert_close(got, expected, bound, dtype, what, exact)


def on_host(got, what):
    """got, checked to be on DEVICE (where the inputs were), copied to the CPU. The copy
    runs on the current CUDA stream: a result the library let the caller read too early
    shows up here as wrong values."""
    assert got.device == DEVICE, "%s: result on %s, the inputs were on %s" % (what, got.device, DEVICE)
    return got.cpu()


def assert_equal(got, expected, what):
    """Exact comparison for data-movement collectives (and dtype, shape)."""
    assert isinstance(got, torch.Tensor), "%s: expected a tensor, got %r" % (what, type(got))
    got, expected = on_host(got, what), expected.cpu()
    assert got.dtype == expected.dtype, "%s: dtype %s, expected %s" % (what, got.dtype, expected.dtype)
    assert tuple(got.shape) == tuple(expected.shape), \
        "%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(expected.shape))
    if not torch.equal(got, expected):
        raise AssertionError("%s: values differ\n got %s\n expected %s"
                             % (what, got.flatten()[:8].tolist(), expected.flatten()[:8].tolist()))


def assert_unchanged(tensor, original, what):
    if not torch.equal(tensor, original):
        raise AssertionError("%s: the input tensor was modified" % what)


def split_rows(dim0, size):
    """Row counts per rank for reducescatter: as even as possible, the first
    dim0 % size ranks get one extra row."""
    return [dim0 // size + (1 if r < dim0 % size else 0) for r in range(size)]


# ---------------------------------------------------------------- errors

def expect_raises(exc_type, what, fn, *args, contains=(), within_s=60.0, **kwargs):
    """Call fn and require that it raises exc_type (within within_s seconds) with every
    string of `contains` in its message. Returns the exception."""
    start = time.monotonic()
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        elapsed = time.monotonic() - start
        assert elapsed < within_s, "%s: the error took %.1f s" % (what, elapsed)
        for text in contains:
            assert text in str(e), "%s: %r does not mention %r" % (what, str(e), text)
        return e
    except BaseException as e:
        raise AssertionError("%s: expected %s, got %s: %s" % (what, exc_type.__name__, type(e).__name__, e))
    raise AssertionError("%s: expected %s, nothing was raised" % (what, exc_type.__name__))


def captured_stderr(fn):
    """Runs fn() with file descriptor 2 (where the core logs) sent to a file; returns
    what was written."""
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return f.read()


# ---------------------------------------------------------------- cross-rank signals
# Some scripts must order events across ranks without using the library under test
# (e.g. "rank 3 submits only after set {0,1} finished"). They touch files in the job's
# scratch directory.

def _signal_path(name):
    return os.path.join(os.environ["PTEST_TMPDIR"], name)


def touch(name):
    tmp = _signal_path(name + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(time.time()))
    os.replace(tmp, _signal_path(name))


def exists(name):
    return os.path.exists(_signal_path(name))


def wait_for(name, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not exists(name):
        if time.monotonic() > deadline:
            raise AssertionError("waited %.0f s for signal %r" % (timeout_s, name))
        time.sleep(0.005)


# ---------------------------------------------------------------- elastic training
# The scripts that lose a rank (elastic_shrink.py, elastic_restart.py) train the same
# small regression, so that what they check after a failure is checked on one model.

def regression_data(samples, features):
    """(x, y): the same noisy linear data on every rank and in every run."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(samples, features, generator=generator)
    w = torch.arange(1.0, features + 1) / features
    return x, x @ w + 0.01 * torch.randn(samples, generator=generator)


def without_dynamo_import():
    """torch.optim.Optimizer's methods decorated with torch._disable_dynamo (the
    constructor's add_param_group, zero_grad, state_dict, ...) import torch._dynamo at
    their first call, to turn off a compiler these scripts never run: 1.2-1.9 s of CPU
    in each process (up to 4 ranks on 2 cores, in every job, restart and spawned
    process; CI time, issue 50). Each is told its undecorated self is its disabled form,
    which is what it runs in eager mode anyway: nothing Perseus does changes. Where
    torch's decorator is not the one known (another torch), nothing is done."""
    for name, value in vars(torch.optim.Optimizer).items():
        original = getattr(value, "__wrapped__", None)
        code = getattr(value, "__code__", None)
        if (original is not None and code is not None and code.co_name == "inner"
                and code.co_filename.endswith("_compile.py")
                and "__dynamo_disable" in code.co_names):
            setattr(original, "__dynamo_disable", original)


class PlainSGD(torch.optim.SGD):
    """torch.optim.SGD as the failure scripts use it (a learning rate; no momentum,
    dampening, weight decay nor nesterov: p -= lr * grad), without torch._dynamo: its
    step() is written out (torch's is wrapped by _use_grad_for_differentiable, which
    imports torch._dynamo at its first call), and the base class's methods are told not
    to import it (without_dynamo_import). The update and the optimizer's state (none)
    are SGD's; what the scripts check is what Perseus does around it."""

    def __init__(self, params, *args, **kwargs):  # DistributedOptimizer passes groups only
        without_dynamo_import()
        super().__init__(params, *args, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            assert not (group["momentum"] or group["weight_decay"] or group["nesterov"]), group
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
        return loss


def elastic_regression(x, y):
    """(model, optimizer, state): a linear model on (x, y) with DistributedOptimizer, an
    ElasticSampler, and a TorchState that also keeps epoch, step and losses."""
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    optimizer = hvd.DistributedOptimizer(PlainSGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(torch.utils.data.TensorDataset(x, y), shuffle=True)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                   epoch=0, step=0, losses=[])
    return model, optimizer, state


def train_batch(model, optimizer, state, x, y, mine, batch, size):
    """One step of the elastic scripts' loop on the samples `mine` (batch `batch` of
    `size`): the update, the sampler told, the mean loss kept and the step counted."""
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[mine]).squeeze(1), y[mine])
    loss.backward()
    optimizer.step()
    state.sampler.record_batch(batch, size)
    state.losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    state.step += 1


def assert_trained_alike(model, losses, window):
    """Every rank holds the same parameters, bit for bit, and the loss fell (the mean of
    the last `window` losses below the first's) -> (first, last)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    for r in range(hvd.size()):
        assert torch.equal(gathered[r], flat), "rank %d holds other parameters" % r
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    assert last < first, "the loss did not fall: %.4f -> %.4f" % (first, last)
    return first, last
