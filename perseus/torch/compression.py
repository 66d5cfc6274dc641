"""Gradient compressors with Horovod's interface (hvd.Compression.none / .fp16 / .bf16).

A compressor turns a tensor into what goes over the wire and back:
compress(tensor) -> (wire_tensor, ctx); decompress(wire_tensor, ctx) -> tensor.
"""

import torch


class Compressor:
    """Interface: subclasses override both static methods."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors unchanged."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype`, restoring their dtype afterwards."""

    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


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
