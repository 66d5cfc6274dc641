"""Gradient compressors with Horovod's interface (hvd.Compression.none / .fp16 / .bf16).

A compressor turns a tensor into what goes over the wire and back:
compress(tensor) -> (wire_tensor, ctx); decompress(wire_tensor, ctx) -> tensor.
"""

import torch

from perseus.common.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401
from perseus.torch import ops as _tops


class _CastCompressor(CastCompressor):
    """CastCompressor for torch tensors."""

    @staticmethod
    def is_float(tensor):
        try:  # the first look at a compressed input
            return tensor.dtype.is_floating_point
        except AttributeError:
            _tops.refuse_non_tensors("compression", (tensor,))
            raise

    @staticmethod
    def cast(tensor, dtype):
        return tensor.to(dtype)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (float32's range, fewer mantissa bits)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The compressors by Horovod's names (bf16 is Perseus's addition)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
