"""The test side of the fake CUDA runtime and NCCL (tests/gpu_fakes): its counters, its
streams, and what a framework's kernels would do on them, for the ordering checker.

Only meaningful where FAKE_GPU_LIB names the fake that the core loaded (ctypes gives
back that same copy); elsewhere lib() is None and every call here does nothing.
"""
import ctypes
import os
import subprocess

_lib = None
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SOURCES = ["fake_gpu.c", "fake_nccl.c", "fake_device.c", "fake_order.c", "fake_kernel.c"]
# The pack kernel's table (its layout is shared with the core and the kernel).
TABLE_DIR = os.path.join(os.path.dirname(HERE), "csrc", "src", "cuda", "memory", "kernels")


def build(mpicc, folder, flags=("-O1", "-Wall", "-Werror"), kernels=True):
    """Builds the fake into folder/libfakegpu.so, linked there as libcudart.so.12 and
    libnccl.so.2 (point PERSEUS_CUDA_LIB and PERSEUS_NCCL_LIB at the folder); returns
    the library's path. kernels=False leaves out fake_kernel.c: a runtime without
    cudaLibraryLoadData, cudaLaunchKernel and cudaMemcpyBatchAsync, as before CUDA 12."""
    library = os.path.join(str(folder), "libfakegpu.so")
    sources = SOURCES if kernels else [s for s in SOURCES if s != "fake_kernel.c"]
    subprocess.run([mpicc, "-shared", "-fPIC"] + list(flags) + ["-I" + TABLE_DIR, "-o", library]
                   + [os.path.join(HERE, "gpu_fakes", name) for name in sources], check=True)
    for name in ("libcudart.so.12", "libnccl.so.2"):
        os.symlink("libfakegpu.so", os.path.join(str(folder), name))
    return library


def build_other_nccl(compiler, folder):
    """A second NCCL (fake_other_nccl.c: reports 2.28.9, refuses every call) as
    folder/libnccl.so.2, as torch's own NCCL is beside the one Perseus loads; returns
    its path."""
    library = os.path.join(str(folder), "libnccl.so.2")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnccl.so.2",
                    "-o", library, os.path.join(HERE, "gpu_fakes", "fake_other_nccl.c")], check=True)
    return library


STAT_KEYS = ["device_buffers", "pinned_buffers", "streams", "events", "comms", "misuses",
             "comms_created", "nccl_calls"]


def lib():
    global _lib
    path = os.environ.get("FAKE_GPU_LIB")
    if _lib is None and path:
        _lib = ctypes.CDLL(path)
        _lib.fake_gpu_last_misuse.restype = ctypes.c_char_p
        _lib.fake_gpu_kernel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.c_void_p, ctypes.c_size_t]
        _lib.fake_gpu_host_access.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _lib.fake_gpu_name_stream.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        _lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        _lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
    return _lib


def stats():
    out = (ctypes.c_long * len(STAT_KEYS))()
    lib().fake_gpu_stats(out)
    result = dict(zip(STAT_KEYS, out))
    result["last_misuse"] = lib().fake_gpu_last_misuse().decode()
    return result


CALL_KEYS = ["event_records", "stream_waits", "copies", "launches", "nccl", "set_device"]


def calls():
    """The fake's count of the calls that cost host time on a real GPU, by kind."""
    out = (ctypes.c_long * len(CALL_KEYS))()
    lib().fake_gpu_calls(out)
    return dict(zip(CALL_KEYS, out))


def libraries():
    """Kernel libraries loaded (cudaLibraryLoadData) and not unloaded (0 where the fake
    was built without them)."""
    if not hasattr(lib(), "fake_gpu_libraries"):
        return 0
    lib().fake_gpu_libraries.restype = ctypes.c_long
    return lib().fake_gpu_libraries()


def kernel_entries():
    """(entries, narrow): pack kernel table entries run, and copies among them whose
    source and destination differ modulo 16 (no 16-byte vectors for those)."""
    if not hasattr(lib(), "fake_gpu_kernel_entries"):
        return 0, 0
    out = (ctypes.c_long * 2)()
    lib().fake_gpu_kernel_entries(out)
    return out[0], out[1]


def check_no_misuse(what):
    """Raises naming the fake's last misuse (a race, say) if there was any."""
    fake = lib()
    if fake is None:
        return
    found = stats()
    if found["misuses"]:
        raise AssertionError("%s: the fake GPU saw %d misuse(s); the last: %s"
                             % (what, found["misuses"], found["last_misuse"]))


class on_device:
    """Makes `device` current on this thread for the block (the fake checks that
    stream work is issued on the stream's device, as CUDA requires)."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self.before = ctypes.c_int(0)
        lib().cudaGetDevice(ctypes.byref(self.before))
        lib().cudaSetDevice(self.device)

    def __exit__(self, *exc):
        lib().cudaSetDevice(self.before.value)


def new_stream(device, label):
    """A non-blocking stream of the fake on `device`, named in race reports."""
    stream = ctypes.c_void_p()
    with on_device(device):
        assert lib().cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0
    lib().fake_gpu_name_stream(stream, label.encode())
    return stream.value


def destroy_stream(device, stream):
    with on_device(device):
        assert lib().cudaStreamDestroy(stream) == 0


def kernel(device, stream, read=(0, 0), write=(0, 0)):
    """A framework kernel on `stream` reading and writing (address, bytes) ranges."""
    if lib() is None:
        return
    with on_device(device):
        rc = lib().fake_gpu_kernel(stream, read[0] or None, read[1], write[0] or None, write[1])
    assert rc == 0, "fake_gpu_kernel failed (%d)" % rc


def host_sync(device, stream):
    """cudaStreamSynchronize(stream): the host learns its work is done."""
    if lib() is None:
        return
    with on_device(device):
        assert lib().cudaStreamSynchronize(stream) == 0


def host_read(address, nbytes):
    if lib() is not None and nbytes:
        lib().fake_gpu_host_access(address, nbytes, 0)
