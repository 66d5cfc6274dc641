"""The engine's scheduling policy (csrc/src/engine/schedule.h):

- each rule against values worked out by hand (tests/cpp/schedule_policy_test.cc, run by
  tests/unit/test_cpp.py);
- DistributedOptimizer's gathering (optimizer_mixin._core_holds, which repeats the
  hold rule so as not to call the core per gradient) against the core's rule, over a
  grid of holds, pending bytes and ages around every boundary: they must agree.

How the engine acts on the policy end to end: test_multiprocess.py (test_what_ends_a_hold,
test_engine_settings), test_training_api.py (test_optimizer_gathers_while_the_core_holds).
"""
import itertools
import subprocess

import pytest


def hold_cases():
    """(limit, ms, bytes, age_us): both sides of every boundary of the rule."""
    for limit, ms in itertools.product([0, 1, 300, 65536], [0.0, 0.5, 1.0, 200.0, 20000.0]):
        edge = int(ms * 1000)
        for pending, age in itertools.product(
                sorted({0, 1, limit - 1, limit, limit + 1, 1 << 30} - {-1}),
                sorted({0, 1, edge - 1, edge, edge + 1, 10 ** 9} - {-1})):
            yield limit, ms, pending, age


def test_optimizer_gathers_exactly_while_the_core_holds(cpp_test):
    mixin = pytest.importorskip("perseus.torch.optimizer_mixin")
    cases = list(hold_cases())
    table = "".join("%d %r %d %d\n" % case for case in cases)
    result = subprocess.run([str(cpp_test("schedule_policy_test")), "hold-table"], input=table, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    core = [line == "1" for line in result.stdout.split()]
    assert len(core) == len(cases)
    since = 1000.0  # a perf_counter() reading
    python = [mixin._core_holds((since, limit, ms), pending, since + age / 1e6)
              for limit, ms, pending, age in cases]
    disagree = [(case, c) for case, c, p in zip(cases, core, python) if c != p]
    assert not disagree, "(limit, ms, bytes, age_us), core holds: %s" % disagree[:10]
    assert any(core) and not all(core)  # the grid reaches both answers
