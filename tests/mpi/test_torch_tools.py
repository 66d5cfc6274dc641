"""The tools torch users train with, over the "perseus" backend under mpirun (issue 48):
PyTorch Lightning's DDPStrategy with its MPIEnvironment, DeepSpeed ZeRO stages 0-3
on its CPU accelerator, and Hugging Face accelerate on a process group made before it.

Each test runs its example (examples/pytorch/lightning_mpi.py, deepspeed_mpi.py,
accelerate_mpi.py) at np 2 and checks the result: every rank ends with the same
weights (bitwise), and they equal, to TOLERANCE, the weights of one process that
trains the same model on the same global batches (tool_digits.reference()), so a
backend that reduced wrongly, or not at all, fails. A tool that is not installed
skips its test, except under CI, where it fails (scripts/setup.sh --all installs
them): a CI machine that lost one must not pass by skipping.
"""
import importlib.util
import re
import sys

import pytest
import torch

from support.jobs import REPO_ROOT, clean_env, find_mpirun, run_bounded, skip_unless_possible

EXAMPLES = REPO_ROOT / "examples" / "pytorch"
sys.path.insert(0, str(EXAMPLES))
import tool_digits  # noqa: E402

pytestmark = pytest.mark.mpi

EPOCHS = 1
# The examples' defaults: batch 16 per rank, SGD lr 0.1, momentum 0.9.
SETTINGS = dict(epochs=EPOCHS, batch=16, ranks=2, lr=0.1, momentum=0.9)
# Data-parallel training averages two ranks' mean gradients where the reference takes
# one mean over both halves: equal but for rounding, which the 45 steps of an epoch
# (SGD with momentum) grow to a few 1e-7 (29 Nov: 2.4e-7 for Lightning and ZeRO 0-3,
# 1.8e-7 for accelerate; 3.4e-7 and 4.8e-7 after 2 epochs).
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    """shuffle -> the one-process reference's weights (Lightning and deepspeed_mpi.py
    draw each epoch's order as DistributedSampler(shuffle=True, seed=0) does;
    accelerate_mpi.py reads the data in order)."""
    made = {}

    def get(shuffle):
        if shuffle not in made:
            made[shuffle] = tool_digits.reference(shuffle=shuffle, **SETTINGS)
        return made[shuffle]

    return get


def need(package, *alternatives):
    """Skips (fails under CI) unless one of the packages is installed; find_spec of a
    top-level name does not import it (Lightning's import alone takes seconds)."""
    if not any(importlib.util.find_spec(p) is not None for p in (package,) + alternatives):
        skip_unless_possible("%s is not installed (bash scripts/setup.sh --all installs it)"
                             % package)


def run_example(script, args, timeout=120):
    """`mpirun -np 2 python examples/pytorch/<script> <args>` -> stdout; fails the test,
    with the job's output, on a non-zero exit or a timeout."""
    cmd = [find_mpirun(), "-np", "2", sys.executable, EXAMPLES / script] + [str(a) for a in args]
    code, out, err, seconds = run_bounded(cmd, clean_env(), timeout)
    if code != 0:
        pytest.fail("%s exited with %d after %.1f s\nstdout:\n%s\nstderr:\n%s"
                    % (" ".join(map(str, cmd)), code, seconds, out, err[-8000:]), pytrace=False)
    return out


def check(out, what, saved, expected):
    """The example's report of `what`: over perseus on 2 ranks, the same weights on both
    (the digest line), a model that learned, and weights that match the reference."""
    found = re.search(r"^%s, %d epoch\(s\): test accuracy ([\d.]+)%% on 2 rank\(s\) over perseus$"
                      % (re.escape(what), EPOCHS), out, re.M)
    assert found, out
    assert float(found.group(1)) >= 60.0, out  # an epoch reaches 69-74 %, chance is 10 %
    position = out.index(found.group(0))
    assert out[position:].splitlines()[1].startswith("Ranks' weights: identical"), out
    weights = torch.load(saved)
    assert weights.shape == expected.shape
    difference = float((weights - expected).abs().max())
    assert difference <= TOLERANCE, "%s: %.3g from the one-process reference" % (what, difference)


def test_lightning_ddp_strategy(tmp_path, reference):
    need("lightning", "pytorch_lightning")
    saved = tmp_path / "lightning.pt"
    out = run_example("lightning_mpi.py", ["--epochs", EPOCHS, "--save", saved])
    check(out, "Lightning DDPStrategy", saved, reference(shuffle=True))


def test_deepspeed_zero_stages(tmp_path, reference):
    """Stages 0-3 in one job, each from the same start: every one must reach the
    reference (ZeRO-3's weights gathered from the ranks' partitions)."""
    need("deepspeed")
    out = run_example("deepspeed_mpi.py", ["--epochs", EPOCHS, "--stage", 0, 1, 2, 3,
                                           "--save", tmp_path / "zero"])
    for stage in range(4):
        check(out, "DeepSpeed ZeRO-%d" % stage, tmp_path / ("zero%d.pt" % stage),
              reference(shuffle=True))
    assert "deepspeed_shm_comm" not in out, out  # not compiled: it takes a minute


def test_accelerate_on_a_group_made_first(tmp_path, reference):
    need("accelerate")
    saved = tmp_path / "accelerate.pt"
    out = run_example("accelerate_mpi.py", ["--epochs", EPOCHS, "--save", saved])
    assert "torch.distributed's backend: perseus" in out, out
    assert "DistributedType.MULTI_CPU" in out, out  # prepare() wrapped the model in DDP
    check(out, "accelerate", saved, reference(shuffle=False))


_ACCELERATE_BACKEND = """
import perseus.torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
try:
    Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="perseus")])
except ValueError as e:
    print("REFUSED:", e)
"""


def test_accelerate_refuses_perseus_as_its_own_cpu_backend(run_python):
    """Why accelerate_mpi.py makes the group itself (docs/ddp.md says so): on a CPU run
    accelerate picks gloo (or mpi) and refuses any other backend it is given. It decides
    before making any group, so one process with MPICH's PMI_SIZE shows it. Should a
    release of accelerate take the name, this fails, and the docs can say so."""
    need("accelerate")
    result = run_python(_ACCELERATE_BACKEND, env={"PMI_SIZE": "2", "PMI_RANK": "0"})
    assert "REFUSED: Your assigned backend perseus is not available, please use gloo" \
        in result.stdout, result.stdout + result.stderr
