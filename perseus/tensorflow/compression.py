"""Gradient compressors with Horovod's interface (hvd.Compression.none / .fp16 / .bf16).

compress(tensor) -> (wire_tensor, ctx); decompress(wire_tensor, ctx) -> tensor.
Floating-point tensors travel as the wire dtype and come back in their own.
"""

import tensorflow as tf

from perseus.common.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401


class _CastCompressor(CastCompressor):
    """CastCompressor for TensorFlow tensors."""

    @staticmethod
    def is_float(tensor):
        return tensor.dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16."""
    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16."""
    wire_dtype = tf.bfloat16


class Compression:
    """The compressors by Horovod's names (bf16 is Perseus's addition)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
