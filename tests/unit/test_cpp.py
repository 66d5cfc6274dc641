"""The C++ unit tests: every tests/cpp/*_test.cc, linked against the core's objects
(tests/support/cpp_build.py), runs and prints "ok". Collected from the folder, so none
is left out; a test says in its first comment lines how it is built."""
import subprocess

import pytest

from support import cpp_build


@pytest.mark.parametrize("test", cpp_build.cpp_tests())
def test_cpp(cpp_test, test):
    result = subprocess.run([str(cpp_test(test))], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_every_cpp_file_is_a_test_or_included_by_one():
    """A .cc in tests/cpp/ that is not named *_test.cc would never run: only headers may
    sit beside the tests."""
    strays = [p.name for p in cpp_build.CPP_TESTS.iterdir()
              if p.suffix != ".h" and not p.name.endswith("_test.cc")]
    assert not strays, "rename to <name>_test.cc or make a header: %s" % strays
    assert len(cpp_build.cpp_tests()) >= 5
