"""Single-process tests (no mpirun, a world of size 1), run inside the pytest process,
plus configuration checks run in fresh `python -c` subprocesses because configuration
is read at init()."""
import json
import textwrap
import time

import pytest
import torch

from support import init_batch

pytestmark = pytest.mark.timeout(120)

INT_DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INT_DTYPES + FLOAT_DTYPES
SHAPES = [(), (0,), (1,), (17,), (4, 5), (2, 0, 3)]
OP_NAMES = ["Sum", "Average", "Min", "Max", "Product"]


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).mul(4).to(dtype)
    low = 0 if dtype == torch.uint8 else -50
    return torch.randint(low, 50, shape, generator=g).to(dtype)


def assert_same(got, expected):
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert torch.equal(got, expected), (got, expected)


def assert_new_tensor(out, inp):
    if inp.numel():
        assert out.data_ptr() != inp.data_ptr(), "the out-of-place op returned its input's storage"


# ---------------------------------------------------------------- compression

@pytest.mark.parametrize("name,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cast_compressors_keep_horovods_ctx(name, wire, dtype):
    """ctx is the tensor's own dtype, whatever it is, as Horovod's compressors give it
    (it was None for an integer tensor or one of the wire dtype); decompress gives back
    the dtype and, for what the wire dtype holds, the values."""
    from perseus.torch.horovod import Compression
    compressor = getattr(Compression, name)
    tensor = make((4, 5), dtype).round()  # small whole numbers: exact in either wire dtype
    wire_tensor, ctx = compressor.compress(tensor)
    assert ctx == dtype
    assert wire_tensor.dtype == (wire if dtype.is_floating_point else dtype)
    assert_same(compressor.decompress(wire_tensor, ctx), tensor)


# ---------------------------------------------------------------- topology

def test_world_of_one(initialized):
    hvd = initialized
    assert hvd.is_initialized()
    assert (hvd.size(), hvd.rank()) == (1, 0)
    assert (hvd.local_size(), hvd.local_rank()) == (1, 0)
    assert (hvd.cross_size(), hvd.cross_rank()) == (1, 0)
    assert hvd.is_homogeneous() is True


def test_build_and_backend_queries(initialized):
    hvd = initialized
    assert hvd.mpi_built() and hvd.mpi_enabled()
    for fn in (hvd.mpi_threads_supported, hvd.gloo_enabled, hvd.gloo_built, hvd.nccl_built,
               hvd.ddl_built, hvd.ccl_built, hvd.cuda_built, hvd.rocm_built):
        assert isinstance(fn(), (bool, int)), fn.__name__
    assert not hvd.gloo_enabled()


# ---------------------------------------------------------------- allreduce

@pytest.mark.parametrize("op_name", OP_NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_of_one_is_identity(initialized, op_name, dtype):
    hvd = initialized
    op = getattr(hvd, op_name)
    for i, shape in enumerate(SHAPES):
        x = make(shape, dtype, seed=i)
        before = x.clone()
        out = hvd.allreduce(x, name="sp.ar.%s.%s.%d" % (op_name, dtype, i), op=op)
        assert_same(out, before)
        assert_same(x, before)
        assert_new_tensor(out, x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_allreduce_scaling_sync_async_inplace(initialized, dtype):
    hvd = initialized
    x = make((33,), dtype)
    expected = (x.double() * 3.0 * 0.5).to(dtype)
    tol = dict(rtol=4 * torch.finfo(dtype).eps, atol=torch.finfo(dtype).tiny)
    out = hvd.allreduce(x, name="sp.scale", op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
    torch.testing.assert_close(out, expected, **tol)

    handle = hvd.allreduce_async(x, name="sp.scale.async", op=hvd.Average, prescale_factor=3.0,
                                 postscale_factor=0.5)
    torch.testing.assert_close(hvd.synchronize(handle), expected, **tol)

    y = x.clone()
    out = hvd.allreduce_(y, name="sp.scale.inplace", op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5)
    torch.testing.assert_close(y, expected, **tol)
    torch.testing.assert_close(out, expected, **tol)

    y = x.clone()
    handle = hvd.allreduce_async_(y, name="sp.scale.async_", op=hvd.Sum, prescale_factor=3.0,
                                  postscale_factor=0.5)
    while not hvd.poll(handle):
        time.sleep(0.001)
    hvd.synchronize(handle)
    torch.testing.assert_close(y, expected, **tol)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_adasum_of_one_is_the_scaled_input(initialized, dtype):
    hvd = initialized
    for i, shape in enumerate(SHAPES):
        x = make(shape, dtype, seed=i)
        assert_same(hvd.allreduce(x, name="sp.adasum.%s.%d" % (dtype, i), op=hvd.Adasum), x)
    x = make((33,), dtype)
    expected = (x.double() * 3.0 * 0.5).to(dtype)
    tol = dict(rtol=4 * torch.finfo(dtype).eps, atol=torch.finfo(dtype).tiny)
    out = hvd.allreduce(x, name="sp.adasum.scaled", op=hvd.Adasum, prescale_factor=3.0,
                        postscale_factor=0.5)
    torch.testing.assert_close(out, expected, **tol)
    outs = hvd.grouped_allreduce([x, x[:5]], name="sp.adasum.grouped", op=hvd.Adasum)
    assert_same(outs[0], x)
    assert_same(outs[1], x[:5])


def test_packed_requests_serve_every_route(initialized):
    """allreduce_ under a name packs its request at the first call and reuses it from
    the second; DistributedOptimizer's route (a list of names, not pinned) takes the
    same one for that name and settings; another shape under the name has its own;
    every result is the reduction."""
    hvd = initialized
    from perseus.common import ops
    from perseus.torch import adapter
    settings = dict(name="sp.packed", op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    packed = {}
    for shape, seed in [((6,), 0), ((2, 3), 1), ((6,), 2), ((6,), 3), ((2, 3), 4), ((2, 3), 5)]:
        x = make(shape, torch.float32, seed=seed)
        y = x.clone()
        before = dict(adapter._packed_requests)
        assert hvd.allreduce_(y, **settings) is y
        torch.testing.assert_close(y, x * 2.0)  # one rank: the sum is x, scaled by 0.5 * 4
        added = [v for k, v in adapter._packed_requests.items() if k not in before]
        if shape in packed:
            assert not added, "%s was packed again" % (shape,)
        else:
            packed[shape], = added
    assert packed[(6,)] is not packed[(2, 3)]
    x = make((6,), torch.float32, seed=6)
    y = x.clone()
    before = dict(adapter._packed_requests)
    handle = adapter.submit(ops.ALLREDUCE, [y], ["sp.packed"], hvd.global_process_set,
                            inplace=True, op=hvd.Sum, prescale=0.5, postscale=4.0, pin=False)
    assert adapter._packed_requests == before, "the optimizer's route packed its own"
    assert hvd.synchronize(handle) == [y]
    torch.testing.assert_close(y, x * 2.0)
    # A batch of a request packed before and a new one: the new one is packed and kept
    # beside the other, each result is its reduction.
    y, z = x.clone(), x[:4].clone()
    handle = adapter.submit(ops.ALLREDUCE, [y, z], ["sp.packed", "sp.packed.new"],
                            hvd.global_process_set, inplace=True, op=hvd.Sum, prescale=0.5,
                            postscale=4.0, pin=False)
    added = [k for k in adapter._packed_requests if k not in before]
    assert len(added) == 1 and "sp.packed.new" in added[0], added
    assert all(adapter._packed_requests[k] is p for k, p in before.items())
    assert hvd.synchronize(handle) == [y, z]
    torch.testing.assert_close(y, x * 2.0)
    torch.testing.assert_close(z, x[:4] * 2.0)


def test_repeated_inplace_call_skips_preparing(initialized, monkeypatch):
    """A named in-place call that repeats the last one under its settings (dtype,
    shape, a contiguous CPU tensor) reuses its packed request without preparing the
    tensor again, synchronous or async (pinned); any change takes the general path,
    with its result or its refusal, and what every call does stays (the version
    bump, the grad-mode check, an unregistered set's error)."""
    hvd = initialized
    from perseus.torch import adapter, keepalive
    prepared = []
    real = adapter.prepare
    monkeypatch.setattr(adapter, "prepare", lambda t: prepared.append(t) or real(t))
    settings = dict(name="sp.repeat", op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)

    def check(x, preparing, **changed):
        y = x.clone() if x.is_contiguous() else x.clone().t().contiguous().t()
        version = y._version
        del prepared[:]
        assert hvd.allreduce_(y, **dict(settings, **changed)) is y
        torch.testing.assert_close(y, x * 2.0)  # one rank: x, scaled by 0.5 * 4
        assert len(prepared) == preparing and y._version > version
        return y

    x = make((6,), torch.float32, seed=1)
    check(x, 1)  # packs
    check(x, 0)  # the repeat
    y = x.clone()
    del prepared[:]
    handle = hvd.allreduce_async_(y, **settings)
    assert not prepared
    if keepalive._CAN_PIN:
        assert keepalive.pinned_count() == 1
    assert hvd.synchronize(handle) is y and keepalive.pinned_count() == 0
    torch.testing.assert_close(y, x * 2.0)
    x = make((2, 3), torch.float32, seed=2)
    check(x, 1)  # another shape
    check(x, 0)
    x = x.double()
    check(x, 1)  # another dtype
    check(x, 0)
    check(make((3, 2), torch.float64, seed=3).t(), 1)  # not contiguous: a copy
    check(x, 0)  # the last packed request is still the one of the contiguous call
    check(x, 1, postscale_factor=2.0 * 4.0, prescale_factor=0.25)  # other settings
    leaf = x.clone().requires_grad_()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="in-place allreduce"):
            hvd.allreduce_(leaf, **settings)
    with torch.no_grad():
        check(x, 0)
    with pytest.raises(TypeError, match="allreduce expects a torch.Tensor as tensor, got list"):
        hvd.allreduce_([1.0] * 6, **settings)
    # The global set's id on a set of other ranks (one forged, or since removed):
    # refused, though its settings are those of the request packed last.
    forged = hvd.ProcessSet([1])
    forged.process_set_id = hvd.global_process_set.process_set_id
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce_(x.clone(), process_set=forged, **settings)


def test_allreduce_defaults_to_average(initialized):
    hvd = initialized
    x = make((5,), torch.float32)
    assert_same(hvd.allreduce(x, name="sp.default"), x)  # Average over one rank
    doubled = hvd.allreduce(x, name="sp.default.scaled", prescale_factor=2.0)
    torch.testing.assert_close(doubled, x * 2)


def test_grouped_allreduce(initialized):
    hvd = initialized
    xs = [make(shape, torch.float32, seed=i) for i, shape in enumerate(SHAPES)]
    outs = hvd.grouped_allreduce(xs, name="sp.gar", op=hvd.Sum, postscale_factor=2.0)
    assert len(outs) == len(xs)
    for out, x in zip(outs, xs):
        torch.testing.assert_close(out, x * 2)
    outs = hvd.synchronize(hvd.grouped_allreduce_async(xs, name="sp.gar.async", op=hvd.Max))
    for out, x in zip(outs, xs):
        assert_same(out, x)
    ys = [x.clone() for x in xs]
    hvd.grouped_allreduce_(ys, name="sp.gar.inplace", op=hvd.Sum, prescale_factor=-1.0)
    for y, x in zip(ys, xs):
        torch.testing.assert_close(y, -x)
    ys = [x.clone() for x in xs]
    hvd.synchronize(hvd.grouped_allreduce_async_(ys, name="sp.gar.async_", op=hvd.Sum, prescale_factor=4.0))
    for y, x in zip(ys, xs):
        torch.testing.assert_close(y, 4 * x)


# ---------------------------------------------------------------- other collectives

@pytest.mark.parametrize("dtype", DTYPES + [torch.bool], ids=str)
def test_allgather_broadcast_alltoall_of_one(initialized, dtype):
    hvd = initialized
    for i, shape in enumerate([(0,), (1,), (6,), (3, 2), (2, 0)]):
        x = make(shape, dtype, seed=i)
        before = x.clone()
        tag = "%s.%d" % (dtype, i)

        out = hvd.allgather(x, name="sp.ag." + tag)
        assert_same(out, before)
        assert_new_tensor(out, x)
        assert_same(hvd.synchronize(hvd.allgather_async(x, name="sp.ag.async." + tag)), before)
        outs = hvd.grouped_allgather([x, x], name="sp.gag." + tag)
        assert len(outs) == 2 and all(torch.equal(o, before) for o in outs)

        out = hvd.broadcast(x, 0, name="sp.bc." + tag)
        assert_same(out, before)
        assert_new_tensor(out, x)
        assert_same(hvd.broadcast_(x, 0, name="sp.bc_." + tag), before)
        assert_same(x, before)

        out, received = hvd.alltoall(x, splits=[shape[0]], name="sp.a2a." + tag)
        assert_same(out, before)
        assert [int(v) for v in received] == [shape[0]]
        result = hvd.alltoall(x, name="sp.a2a.even." + tag)
        assert_same(result[0] if isinstance(result, tuple) else result, before)
        assert_same(x, before)

    # Broadcast of a 0-d tensor.
    x = make((), dtype, seed=99)
    assert_same(hvd.broadcast(x, 0, name="sp.bc.scalar.%s" % dtype), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reducescatter_of_one(initialized, dtype):
    hvd = initialized
    for i, shape in enumerate([(1,), (7,), (4, 3), (0, 2)]):
        x = make(shape, dtype, seed=i)
        assert_same(hvd.reducescatter(x, name="sp.rs.%s.%d" % (dtype, i), op=hvd.Sum), x)
        assert_same(hvd.reducescatter(x, name="sp.rs.avg.%s.%d" % (dtype, i)), x)  # default: Average
        assert_same(hvd.synchronize(hvd.reducescatter_async(x, name="sp.rs.async.%s.%d" % (dtype, i))), x)
    xs = [make((3, 2), dtype, seed=7), make((5,), dtype, seed=8)]
    outs = hvd.grouped_reducescatter(xs, name="sp.grs.%s" % dtype, op=hvd.Sum)
    assert len(outs) == 2 and all(torch.equal(o, x) for o, x in zip(outs, xs))
    outs = hvd.synchronize(hvd.grouped_reducescatter_async(xs, name="sp.grs.async.%s" % dtype, op=hvd.Sum))
    assert len(outs) == 2 and all(torch.equal(o, x) for o, x in zip(outs, xs))
    if dtype.is_floating_point:
        out = hvd.reducescatter(xs[0], name="sp.rs.scaled.%s" % dtype, op=hvd.Sum, prescale_factor=2.0,
                                postscale_factor=1.5)
        torch.testing.assert_close(out, (xs[0].double() * 3).to(dtype))


def test_join_barrier_process_set(initialized):
    hvd = initialized
    assert hvd.join() == 0
    hvd.barrier()
    hvd.barrier(process_set=hvd.global_process_set)
    ps = hvd.global_process_set
    assert ps.size() == 1 and ps.rank() == 0 and list(ps.ranks) == [0]
    x = make((4,), torch.float32)
    assert_same(hvd.allreduce(x, name="sp.ps", op=hvd.Sum, process_set=ps), x)


def test_remove_process_set_returns_false_when_nothing_is_removed(initialized):
    # As Horovod 0.28.1: False for the global set (here with a warning), and for a set
    # never registered (Horovod: an assertion); the global set keeps working.
    hvd = initialized
    with pytest.warns(UserWarning, match="the global process set always exists; nothing removed"):
        assert hvd.remove_process_set(hvd.global_process_set) is False
    assert hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.ranks == [0]
    assert hvd.remove_process_set(hvd.ProcessSet([0])) is False
    x = make((3,), torch.float32)
    assert_same(hvd.allreduce(x, name="sp.after_remove", op=hvd.Sum, process_set=hvd.global_process_set), x)


# ---------------------------------------------------------------- errors

def test_local_argument_errors(initialized):
    hvd = initialized
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(3, dtype=torch.bool), name="sp.bool", op=hvd.Sum)
    with pytest.raises(ValueError, match="Adasum needs a floating-point tensor"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), name="sp.adasum", op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.reducescatter(torch.ones(3), name="sp.adasum_rs", op=hvd.Adasum)
    # The engine still serves requests afterwards.
    assert_same(hvd.allreduce(torch.arange(3.0), name="sp.after_errors", op=hvd.Sum), torch.arange(3.0))


def test_inplace_ops_and_autograd(initialized):
    """In-place ops bump the version counter and refuse a leaf in grad mode (issue 37;
    every in-place op at np 2 and 4: tests/rank_scripts/torch_arguments.py). Here what a world of
    one shows as well: the optimizer's path, and inference tensors, which have no
    version counter and are taken as before (as by Horovod and torch.distributed)."""
    hvd = initialized
    from perseus.common import ops
    from perseus.torch import adapter

    def submit(tensor):  # as DistributedOptimizer submits a gradient
        return adapter.submit(ops.ALLREDUCE, [tensor], ["sp.grad"], hvd.global_process_set,
                              inplace=True, op=hvd.Sum, prescale=2.0, pin=False)

    for step in range(2):  # packed at the first, reused at the second
        g = torch.arange(4.0)
        before = g._version
        handle = submit(g)
        assert g._version > before, "the optimizer's in-place allreduce did not bump the version"
        hvd.synchronize(handle)
        assert_same(g, torch.arange(4.0) * 2)
    leaf = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place allreduce: a leaf Variable that requires grad"):
        submit(leaf)
    with torch.inference_mode():
        made_there = torch.arange(3.0)
        assert_same(hvd.allreduce_(made_there, name="sp.inference", op=hvd.Sum), torch.arange(3.0))
    assert_same(hvd.broadcast_(made_there, 0, name="sp.inference.out"), torch.arange(3.0))
    assert_same(hvd.allreduce(torch.ones(2), name="sp.after_inplace", op=hvd.Sum), torch.ones(2))


def test_errors_before_init_and_reinit(hvd):
    if hvd.is_initialized():
        hvd.shutdown()
    try:
        assert not hvd.is_initialized()
        for call in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size,
                     lambda: hvd.allreduce(torch.ones(2), name="sp.pre", op=hvd.Sum),
                     lambda: hvd.allgather(torch.ones(2), name="sp.pre"),
                     lambda: hvd.broadcast(torch.ones(2), 0, name="sp.pre")):
            with pytest.raises(ValueError):
                call()
        for cycle in range(3):
            hvd.init()
            assert hvd.is_initialized() and hvd.size() == 1
            x = make((6,), torch.float64, seed=cycle)
            assert_same(hvd.allreduce(x, name="sp.cycle", op=hvd.Sum), x)
            hvd.shutdown()
            assert not hvd.is_initialized()
            with pytest.raises(ValueError):
                hvd.rank()
    finally:
        if not hvd.is_initialized():
            hvd.init()


# ---------------------------------------------------------------- configuration (subprocesses)

INIT_SNIPPET = textwrap.dedent("""
    import sys
    import perseus.torch.horovod as hvd
    try:
        hvd.init()
    except ValueError as e:
        print("VALUE_ERROR:", e)
        sys.exit(0)
    print("INITIALISED size=%d" % hvd.size())
    hvd.shutdown()
    sys.exit(0)
""")

BAD_SETTINGS = [
    ("PERSEUS_FUSION_THRESHOLD", "abc", "PERSEUS_FUSION_THRESHOLD"),
    ("PERSEUS_FUSION_THRESHOLD", "-1", "PERSEUS_FUSION_THRESHOLD"),
    ("HOROVOD_FUSION_THRESHOLD", "abc", "FUSION_THRESHOLD"),
    ("PERSEUS_ALLREDUCE_STREAMS", "0", "PERSEUS_ALLREDUCE_STREAMS"),
    ("PERSEUS_ALLREDUCE_STREAMS", "-2", "PERSEUS_ALLREDUCE_STREAMS"),
    ("PERSEUS_ALLREDUCE_STREAMS", "two", "PERSEUS_ALLREDUCE_STREAMS"),
    ("PERSEUS_CYCLE_TIME", "abc", "PERSEUS_CYCLE_TIME"),
    ("PERSEUS_CYCLE_TIME", "-5", "PERSEUS_CYCLE_TIME"),
    ("HOROVOD_CYCLE_TIME", "abc", "CYCLE_TIME"),
    ("PERSEUS_HOLD_BYTES", "-1", "PERSEUS_HOLD_BYTES"),
    ("PERSEUS_HOLD_BYTES", "automatic", "PERSEUS_HOLD_BYTES"),
    ("PERSEUS_HOLD_TIME", "soon", "PERSEUS_HOLD_TIME"),
    ("PERSEUS_RANKS_PER_NODE", "0", "PERSEUS_RANKS_PER_NODE"),
    ("PERSEUS_RANKS_PER_NODE", "two", "PERSEUS_RANKS_PER_NODE"),
    ("PERSEUS_ELASTIC_PERSIST_INTERVAL", "0", "PERSEUS_ELASTIC_PERSIST_INTERVAL"),
    ("PERSEUS_ELASTIC_PERSIST_INTERVAL", "every", "PERSEUS_ELASTIC_PERSIST_INTERVAL"),
]


GOOD_SETTINGS = [
    {"PERSEUS_FUSION_THRESHOLD": "0"},
    {"PERSEUS_FUSION_THRESHOLD": "1048576", "PERSEUS_ALLREDUCE_STREAMS": "4"},
    {"HOROVOD_FUSION_THRESHOLD": "4096", "HOROVOD_CYCLE_TIME": "2.5"},
    {"PERSEUS_CYCLE_TIME": "5"},
    {"PERSEUS_HOLD_BYTES": "0", "PERSEUS_HOLD_TIME": "0"},
    {"PERSEUS_HOLD_BYTES": "AUTO"},
    {"PERSEUS_RANKS_PER_NODE": "2"},
]


def case_id(env):
    return ",".join("%s=%s" % kv for kv in env.items())


@pytest.fixture(scope="module")
def init_results():
    """Every bad and good setting's init() in one process (support/init_batch.py)."""
    cases = [{variable: value} for variable, value, _ in BAD_SETTINGS] + GOOD_SETTINGS
    return init_batch.run({case_id(env): (env, INIT_SNIPPET) for env in cases})


@pytest.mark.parametrize("variable,value,named", BAD_SETTINGS, ids=["%s=%s" % s[:2] for s in BAD_SETTINGS])
def test_bad_setting_fails_init_naming_the_variable(init_results, variable, value, named):
    result = init_results[case_id({variable: value})]
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "VALUE_ERROR:" in result.stdout, "init() accepted %s=%s:\n%s" % (variable, value, output)
    assert named in result.stdout, "the error does not name %s:\n%s" % (named, output)


@pytest.mark.parametrize("env", GOOD_SETTINGS, ids=case_id)
def test_good_settings_are_accepted(init_results, env):
    result = init_results[case_id(env)]
    assert result.returncode == 0 and "INITIALISED size=1" in result.stdout, result.stdout + result.stderr


def test_config_shows_the_values_the_core_took(run_python):
    code = textwrap.dedent("""
        import json
        import perseus.torch.horovod as hvd
        hvd.init()
        print("CONFIG", json.dumps(hvd.config()))
        hvd.shutdown()
    """)
    env = {"PERSEUS_HOLD_TIME": "2.5", "PERSEUS_ALLREDUCE_NANCHECK": "on",
           "PERSEUS_RANKS_PER_NODE": "3", "HOROVOD_FUSION_THRESHOLD": "4096"}
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    shown = json.loads(result.stdout.split("CONFIG", 1)[1])
    expected = {"PERSEUS_HOLD_TIME": "2.5", "PERSEUS_ALLREDUCE_NANCHECK": "1",
                "PERSEUS_RANKS_PER_NODE": "3", "PERSEUS_FUSION_THRESHOLD": "4096",
                "PERSEUS_CYCLE_TIME": "0", "PERSEUS_ALLREDUCE_DTYPE": "none",
                "PERSEUS_LOG_LEVEL": "warning", "PERSEUS_TIMELINE": "", "PERSEUS_HOLD_BYTES": "auto"}
    assert {k: shown.get(k) for k in expected} == expected, shown


def test_plain_python_gets_a_world_of_one(run_python):
    code = textwrap.dedent("""
        import torch
        import perseus.torch.horovod as hvd
        hvd.init()
        out = hvd.allreduce(torch.arange(4.0), name="x", op=hvd.Sum)
        print("RESULT", hvd.size(), hvd.rank(), out.tolist())
        hvd.shutdown()
    """)
    result = run_python(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT 1 0 [0.0, 1.0, 2.0, 3.0]" in result.stdout, result.stdout + result.stderr


def test_mpi_initialised_by_mpi4py_first(run_python):
    code = textwrap.dedent("""
        from mpi4py import MPI
        import torch
        import perseus.torch.horovod as hvd
        hvd.init()
        a = hvd.size()
        hvd.shutdown()
        hvd.init(comm=MPI.COMM_WORLD)
        out = hvd.allreduce(torch.ones(3), name="x", op=hvd.Sum)
        hvd.shutdown()
        print("RESULT", a, hvd.is_initialized(), out.tolist(), MPI.Is_finalized())
    """)
    result = run_python(code)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT 1 False [1.0, 1.0, 1.0] False" in result.stdout, result.stdout + result.stderr
