"""PERSEUS_AUTOTUNE: the ranks try settings during the first steps, agree on every
choice and settle on one; results stay right throughout.

Each step trains a float64 model with DistributedOptimizer on this rank's slice of a
fixed batch, and allreduces tensors of several dtypes and shapes (one larger than the
smallest chunk size tried, so it goes in pieces) whose reference each rank computes
itself, once: each step rolls the inputs and the reference by the step's number, so
every element changes every step. After STEPS steps:
- the tuner has settled, and on the same setting on every rank (config()'s
  PERSEUS_AUTOTUNE_STATE, the core's debug getter);
- rank 0's PERSEUS_AUTOTUNE_LOG has one row per sample of the grid (knobs the user
  fixed never change) and ends with the settled setting;
- the weights equal single-process training on the whole batch, bit-identical across
  ranks.
The job's environment (tests/mpi/test_autotune.py) sets the autotuner's variables.
"""
import csv
import os

import torch
import torch.nn as nn

from common import assert_close, check_engine_settings, hvd, init, main, make_tensor, reference_reduce

from perseus.torch.optimizer import DistributedOptimizer

STEPS = 72  # settles after 1 + (1 warmup + 2 x 15 samples) x 2 steps = 63
BATCH = 24
TOL = 1e-9
CHECKED = [  # name, shape, dtype, op
    ("big", (300000,), torch.float32, "sum"),
    ("f64", (37, 11), torch.float64, "average"),
    ("i32", (1000,), torch.int32, "sum"),
    ("f16", (513,), torch.float16, "sum"),
]
GRID = {"PERSEUS_ALLREDUCE_STREAMS": 3, "PERSEUS_FUSION_THRESHOLD": 4,
        "PERSEUS_CHUNK_SIZE": 4, "PERSEUS_HOLD_BYTES": 5}  # values tried per knob
COLUMNS = ["lanes", "fusion_threshold", "hold_bytes", "hold_time_ms", "chunk_bytes", "score"]
FIXED_COLUMN = {"PERSEUS_FUSION_THRESHOLD": "fusion_threshold", "PERSEUS_CHUNK_SIZE": "chunk_bytes",
                "PERSEUS_HOLD_BYTES": "hold_bytes"}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 16)
        self.fc2 = nn.Linear(16, 8)
        self.fc3 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def make_model():
    torch.manual_seed(1234)
    return Net().double()


def batch():
    g = torch.Generator().manual_seed(99)
    return (torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=g, dtype=torch.float64))


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def reference_weights():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def checked_inputs(rank, size):
    """name -> (this rank's input, the reference and its bound), made once: step s
    rolls all three by s elements (an elementwise reduction of rolled inputs is the
    rolled reduction), so every element gets a new value each step (a stale result
    shows) without drawing every rank's inputs again on every rank."""
    made = {}
    for name, shape, dtype, op in CHECKED:
        xs = [make_tensor("autotune." + name, r, shape, dtype) for r in range(size)]
        expected, bound = reference_reduce(xs, hvd.Sum if op == "sum" else hvd.Average, dtype)
        made[name] = (xs[rank], expected, bound)
    return made


def rolled(x, step):
    return None if x is None else torch.roll(x.flatten(), step).reshape(x.shape)


def check_collectives(step, made):
    handles = []
    for name, shape, dtype, op in CHECKED:
        hvd_op = hvd.Sum if op == "sum" else hvd.Average
        handles.append(hvd.allreduce_async(rolled(made[name][0], step), op=hvd_op,
                                           name="autotune." + name))
    for (name, shape, dtype, op), handle in zip(CHECKED, handles):
        _, expected, bound = made[name]
        assert_close(hvd.synchronize(handle), rolled(expected, step), rolled(bound, step), dtype,
                     "step %d %s" % (step, name))


def tuned_knobs():
    if os.environ.get("PERSEUS_ALLREDUCE_STREAMS") == "auto":
        return ["PERSEUS_ALLREDUCE_STREAMS"]
    return [k for k in GRID if k not in os.environ]


def check_log(path, settled):
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0] == COLUMNS, rows[0]
    samples, best = rows[1:-1], rows[-1]
    expected = 2 * sum(GRID[k] for k in tuned_knobs())  # each value twice: a..z, z..a
    assert len(samples) == expected, "%d samples logged, expected %d:\n%s" % (len(samples), expected, rows)
    for knob, column in FIXED_COLUMN.items():
        if knob in os.environ:
            i = COLUMNS.index(column)
            values = {row[i] for row in rows[1:]}
            assert values == {os.environ[knob]}, "%s was set to %s but took %s" % (knob, os.environ[knob], values)
    described = dict(item.split("=") for item in settled.split() if "=" in item)
    for column, value in zip(COLUMNS[:-1], best):
        if column == "hold_time_ms":
            assert float(value) == float(described[column]), (column, value, described)
        else:
            assert value == described[column], (column, value, described)
    assert float(best[-1]) > 0, best


def body():
    rank, size = init()
    check_engine_settings()  # the test runs its cases of one np in one process
    assert hvd.config()["PERSEUS_AUTOTUNE"] == "1" or os.environ.get("PERSEUS_ALLREDUCE_STREAMS") == "auto"
    assert hvd.config()["PERSEUS_AUTOTUNE_STATE"] == "tuning", hvd.config()
    model = make_model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters())
    made = checked_inputs(rank, size)
    x, y = batch()
    rows = BATCH // size
    x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
    for step in range(STEPS):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        check_collectives(step, made)

    for got, want in zip(model.parameters(), reference_weights()):
        assert torch.allclose(got.detach(), want, rtol=TOL, atol=TOL), \
            "weights differ from single-process training by %g" % (got.detach() - want).abs().max()
    mine = [p.detach() for p in model.parameters()]
    theirs = hvd.broadcast_object(mine, root_rank=0)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs)), "weights differ across ranks"

    state = hvd.config()["PERSEUS_AUTOTUNE_STATE"]
    assert state.startswith("settled: "), "rank %d after %d steps: %s" % (rank, STEPS, state)
    everyone = hvd.allgather_object(state)
    assert everyone == [state] * size, "the ranks settled differently: %r" % everyone
    if rank == 0:
        check_log(os.environ.get("PERSEUS_AUTOTUNE_LOG") or os.environ["HOROVOD_AUTOTUNE_LOG"],
                  state)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
