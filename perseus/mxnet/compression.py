"""Gradient compressors with Horovod's interface (hvd.Compression.none / .fp16) for
MXNet arrays; the logic is perseus.common.compression's."""

import numpy as np

from perseus.common.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401


class _CastCompressor(CastCompressor):
    """CastCompressor for NDArrays."""

    @staticmethod
    def is_float(tensor):
        return np.issubdtype(np.dtype(tensor.dtype), np.floating)

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


class FP16Compressor(_CastCompressor):
    """Sends floating-point arrays as float16."""

    wire_dtype = np.float16


class Compression:
    """Horovod's names for the compressors."""

    none = NoneCompressor
    fp16 = FP16Compressor
