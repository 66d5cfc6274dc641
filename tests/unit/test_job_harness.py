"""The tests' bounded jobs (tests/support/jobs.py): a job that outlives its timeout is
killed, and the report names what was still alive with each process's C stack, so a
hang below Python (where the ranks' faulthandler dumps stop) still shows its place;
gdb is never started so near the test's own timeout that pytest-timeout would end the
whole session."""
import shutil
import sys
import time

import pytest

from support import jobs


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_a_hung_job_is_killed_and_reported_with_its_c_stacks():
    code = "import ctypes; print('waiting', flush=True); ctypes.CDLL(None).pause()"
    returncode, out, _, seconds, killed = jobs.bounded_job([sys.executable, "-c", code], jobs.clean_env(), 3)
    assert killed is not None and returncode != 0 and "waiting" in out
    if "Operation not permitted" in killed:  # a machine that forbids ptrace: the report says so
        pytest.skip("gdb may not attach here: %s" % killed)
    assert "state S" in killed and "C stacks:" in killed, killed
    assert "pause" in killed, killed  # the C function the process waited in
    assert seconds < 3 + jobs.C_STACKS_S + 5, seconds


def test_each_test_tells_the_jobs_its_deadline(request):
    assert request.node.get_closest_marker("timeout") is None  # pytest.ini's applies
    left = jobs.test_deadline - time.monotonic()
    assert 0 < left <= float(request.config.getini("timeout")), left


def test_no_c_stacks_near_the_tests_own_timeout(monkeypatch):
    monkeypatch.setattr(jobs, "test_deadline", time.monotonic() + jobs.C_STACKS_MARGIN_S)
    started = time.monotonic()
    report = jobs.c_stacks([1])
    assert "no time left" in report and time.monotonic() - started < 1, report
