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


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16, restoring their dtype afterwards."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class BF16Compressor(Compressor):
    """Sends floating-point tensors as bfloat16 (float32's range, fewer mantissa bits),
    restoring their dtype afterwards."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.bfloat16:
            return tensor.to(torch.bfloat16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors by Horovod's names (bf16 is Perseus's addition)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
