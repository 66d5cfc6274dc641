"""Helpers for the MXNet scripts that mpirun runs on every rank (with .venv-mx's
python, see tests/frameworks/test_mxnet.py).

Inputs come from `make_array(tag, rank, shape, dtype)`, a pure function of its
arguments, so every rank rebuilds every other rank's input and computes the
expected result with numpy. Values are small integers, exact in every dtype, so
reductions are compared exactly.

A script calls `main(body)`: any exception prints a traceback tagged with the rank
and ends the process with exit code 1 at once (MPICH then tears the job down).
"""
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.rank_script import launcher_rank_size, log, main, rank_tag  # noqa: E402,F401 - shared by scripts

import mxnet as mx  # noqa: E402

import perseus.mxnet as hvd  # noqa: E402

INT_DTYPES = [np.uint8, np.int8, np.int32, np.int64]
FLOAT_DTYPES = [np.float16, np.float32, np.float64]
DTYPES = INT_DTYPES + FLOAT_DTYPES

# Value ranges no reference result overflows with up to 4 ranks.
_RANGES = {"sum": {np.uint8: (0, 60), np.int8: (-30, 30)},
           "product": {np.uint8: (0, 3), np.int8: (-2, 2), np.float16: (-3, 3)}}


def make_array(tag, rank, shape, dtype, kind="sum"):
    """Deterministic small-integer numpy array for (tag, rank)."""
    low, high = _RANGES.get(kind, {}).get(dtype, (-20, 20) if kind == "sum" else (-3, 3))
    if np.dtype(dtype).kind == "u":
        low = max(low, 0)
    rng = np.random.default_rng(zlib.crc32(("%s/%d" % (tag, rank)).encode()))
    return rng.integers(low, high + 1, size=shape).astype(dtype)


def nd(array):
    return mx.nd.array(array, dtype=array.dtype)


def assert_equal(actual, expected, what):
    actual = actual.asnumpy() if isinstance(actual, mx.nd.NDArray) else np.asarray(actual)
    if actual.dtype != expected.dtype or actual.shape != expected.shape or \
            not np.array_equal(actual, expected):
        raise AssertionError("%s: got %s %s %r, expected %s %s %r" % (
            what, actual.dtype, actual.shape, actual, expected.dtype, expected.shape, expected))


def assert_close(actual, expected, what, rtol=1e-6, atol=1e-7):
    actual = actual.asnumpy() if isinstance(actual, mx.nd.NDArray) else np.asarray(actual)
    if actual.shape != expected.shape or not np.allclose(actual, expected, rtol=rtol, atol=atol):
        raise AssertionError("%s: max |diff| %s\ngot %r\nexpected %r" % (
            what, np.max(np.abs(actual - expected)) if actual.shape == expected.shape else "-",
            actual, expected))
