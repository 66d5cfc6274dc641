"""Gradient compressors with Horovod's interface, shared by the front ends.

A compressor turns a tensor into what goes over the wire and back:
compress(tensor) -> (wire_tensor, ctx); decompress(wire_tensor, ctx) -> tensor.
A front end subclasses CastCompressor with its framework's float test and cast.
"""


class Compressor:
    """Interface: subclasses override both methods."""

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


class CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype`, restoring their dtype afterwards.
    ctx is the tensor's own dtype, whatever it is, as Horovod's.

    Subclasses set wire_dtype and provide is_float(tensor) and cast(tensor, dtype)."""

    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        if cls.is_float(tensor) and tensor.dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None or tensor.dtype == ctx else cls.cast(tensor, ctx)
