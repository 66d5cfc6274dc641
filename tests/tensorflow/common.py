"""Helpers for the TensorFlow scripts that mpirun runs on every rank (with .venv-tf's
python, see tests/frameworks/test_tensorflow.py).

Inputs come from `make_array(tag, rank, shape, dtype)`, a pure function of its
arguments, so every rank rebuilds every other rank's input and computes the
expected result with numpy. Values are small integers, exact in every dtype
(float16 and bfloat16 included), so reductions are compared exactly.

A script calls `main(body)`: any exception prints a traceback tagged with the rank
and ends the process with exit code 1 at once (MPICH then tears the job down).
"""
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.rank_script import launcher_rank_size, log, main, rank_tag  # noqa: E402,F401 - shared by scripts

import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing notices of the many small tf.functions

import perseus.tensorflow.horovod as hvd  # noqa: E402

INT_DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64]
FLOAT_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
DTYPES = INT_DTYPES + FLOAT_DTYPES


def make_array(tag, rank, shape, dtype, low=-3, high=4):
    """Small integers as a float64 numpy array (cast with tf.cast(..., dtype))."""
    if dtype == tf.uint8:
        low = 0
    rng = np.random.default_rng(zlib.crc32(("%s|%d" % (tag, rank)).encode()))
    return rng.integers(low, high, size=shape).astype(np.float64)


def reduce_ref(arrays, op, dtype):
    xs = np.stack(arrays)
    if op == hvd.Sum:
        return xs.sum(0)
    if op == hvd.Average:
        mean = xs.sum(0) / len(arrays)
        return np.trunc(mean) if dtype.is_integer else mean
    if op == hvd.Min:
        return xs.min(0)
    if op == hvd.Max:
        return xs.max(0)
    if op == hvd.Product:
        return xs.prod(0)
    raise AssertionError(op)


def assert_equal(got, expected, dtype, what):
    got = tf.convert_to_tensor(got)
    assert got.dtype == dtype, "%s: dtype %s, expected %s" % (what, got.dtype, dtype)
    got = tf.cast(got, tf.float64).numpy()
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, "%s: shape %s, expected %s" % (what, got.shape,
                                                                        expected.shape)
    if not np.array_equal(got, expected):
        raise AssertionError("%s: values differ\n got %s\n expected %s"
                             % (what, got.ravel()[:8], expected.ravel()[:8]))
