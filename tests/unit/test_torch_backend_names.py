"""Backend names (issue 49, point 5): `import perseus` registers the torch backend
"perseus" once torch is imported (before or after), without importing torch itself;
a backend name torch does not know is a ValueError naming the ones it does, from
torch.distributed.init_process_group once perseus is imported and from the drop-in
perseus.torch.distributed.init_process_group. A plain `python`, a world of one."""
import subprocess
import sys

import pytest

from support.jobs import REPO_ROOT, clean_env

# One process per import order (each pays torch's import once).
SCRIPT = r"""
import sys
ORDER = sys.argv[1]
if ORDER == "torch-first":
    import torch.distributed as dist
    import perseus
else:
    import perseus
    assert "torch" not in sys.modules, "import perseus imported torch"
    import torch.distributed as dist

try:
    dist.init_process_group("perseu")
except ValueError as e:
    text = str(e)
    assert "'perseu'" in text and "did you mean 'perseus'" in text, text
    assert "gloo" in text and "nccl" in text, text
else:
    raise AssertionError("init_process_group('perseu') was accepted")
assert not dist.is_initialized()

dist.init_process_group("perseus")  # registered by `import perseus` alone
assert dist.get_backend() == "perseus" and dist.get_world_size() == 1
dist.destroy_process_group()
print("ok", ORDER)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("order", ["perseus-first", "torch-first"])
def test_import_perseus_registers_the_backend_and_names_a_misspelling(order):
    res = subprocess.run([sys.executable, "-c", SCRIPT, order], cwd=str(REPO_ROOT),
                         env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=110)
    assert res.returncode == 0 and "ok %s" % order in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("backend, suggestion", [
    ("glooo", "gloo"), ("NCCL2", "nccl"), ("perseu", "perseus"), ("cpu:glooo,cuda:nccl", "gloo"),
])
def test_drop_in_refuses_an_unknown_backend(backend, suggestion):
    import perseus.torch.distributed as pdist
    with pytest.raises(ValueError) as e:
        pdist.init_process_group(backend=backend)
    text = str(e.value)
    assert "did you mean '%s'" % suggestion in text, text
    assert "gloo, " in text and "perseus" in text, text  # the names torch knows
    assert not pdist.is_initialized()


@pytest.mark.parametrize("backend", ["gloo", "NCCL", "mpi", "perseus", "cpu:gloo,cuda:nccl",
                                     "cpu:perseus,cuda:perseus"])
def test_backend_names_torch_knows_pass(backend):
    from perseus.torch.ops import backend_names
    backend_names.check(backend, "init_process_group")  # no error
