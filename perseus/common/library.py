"""Loads libperseus and declares its C ABI (csrc/include/perseus/perseus.h).

This is the only module that touches the shared library. It
  * loads perseus/lib/libperseus.so with ctypes.CDLL: CDLL (unlike PyDLL) releases
    the GIL for the duration of every call, which perseus_wait() relies on so that
    waiting never blocks other Python threads or the engine's callbacks;
  * declares argtypes/restype for every function of the header, so a wrong call
    fails in Python instead of corrupting the stack;
  * mirrors perseus_request_t as a ctypes Structure (the layout authority) and
    derives from it the struct.Struct that builder.py packs on the hot path;
  * owns check(status): the one place a non-zero perseus_status_t becomes an
    exception (the class comes from exceptions.exception_for).

Importing it without a built library raises ImportError saying how to build.
"""

import ctypes
import os
import struct

from perseus.common import exceptions

PERSEUS_MAX_DIMS = 16  # perseus.h: PERSEUS_MAX_DIMS
# perseus_counters' values, in order (perseus.h: PERSEUS_NUM_COUNTERS of them).
COUNTER_NAMES = ("negotiation_rounds", "negotiation_gathers", "payload_rounds",
                 "ridden_requests", "data_collectives")

LIBRARY_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib", "libperseus.so")


def _load():
    if not os.path.exists(LIBRARY_PATH):
        raise ImportError(
            "Perseus core library not found at %s. Build and install Perseus with "
            "`pip install .` from the repository root (or `pip install -e .` for a "
            "development checkout)." % LIBRARY_PATH)
    try:
        # RTLD_GLOBAL: the MPI library libperseus links may dlopen plugins that
        # expect MPI's symbols to be globally visible.
        return ctypes.CDLL(LIBRARY_PATH, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise ImportError(
            "Could not load the Perseus core library %s: %s. Rebuild and reinstall "
            "Perseus with `pip install .`." % (LIBRARY_PATH, e)) from e


class Request(ctypes.Structure):
    """perseus_request_t, field for field, in header order."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("op_type", ctypes.c_int32),
        ("reduce_op", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("input", ctypes.c_void_p),
        ("output", ctypes.c_void_p),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("root_rank", ctypes.c_int32),
        ("process_set", ctypes.c_int32),
        ("splits", ctypes.POINTER(ctypes.c_int64)),
        ("nsplits", ctypes.c_int32),
        ("anonymous", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("group_size", ctypes.c_int32),
    ]


def _request_struct():
    """The struct.Struct with Request's exact layout.

    Packing a request with one Struct.pack_into call costs a fraction of setting 17
    ctypes attributes, so the hot path packs bytes. The format is derived from the
    Structure above and every field offset is checked against it, so the two cannot
    drift apart.
    """
    codes = [{ctypes.c_int32: "i", ctypes.c_double: "d"}.get(ctype, "P")
             for _, ctype in Request._fields_]
    for i, (field, _) in enumerate(Request._fields_):
        # '@' aligns like the C compiler: the offset of field i is the size of the
        # prefix ending with it, minus its own size.
        offset = struct.calcsize("@" + "".join(codes[:i + 1])) - struct.calcsize(codes[i])
        if offset != getattr(Request, field).offset:
            raise ImportError("perseus_request_t layout mismatch at field %r" % field)
    packed = struct.Struct("@" + "".join(codes))
    # struct adds no trailing padding; records are laid out with REQUEST_SIZE stride.
    if packed.size > ctypes.sizeof(Request):
        raise ImportError("perseus_request_t layout mismatch: struct %d bytes, ctypes %d"
                          % (packed.size, ctypes.sizeof(Request)))
    return packed


REQUEST_STRUCT = _request_struct()
REQUEST_SIZE = ctypes.sizeof(Request)  # stride of a perseus_request_t array

_lib = _load()

_status = ctypes.c_int  # perseus_status_t is a C enum: int-sized
_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)

# perseus_callback_t (perseus_on_complete); keep the object alive until it has run.
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)

class P2P(ctypes.Structure):
    """perseus_p2p_t: one point-to-point message."""
    _fields_ = [("recv", ctypes.c_int32), ("data", ctypes.c_void_p), ("bytes", ctypes.c_int64),
                ("peer", ctypes.c_int32), ("tag", ctypes.c_int32),
                ("process_set", ctypes.c_int32), ("device", ctypes.c_int32),
                ("stream", ctypes.c_void_p)]


# name -> (restype, argtypes). Every function of perseus.h, in header order.
_SIGNATURES = {
    # lifecycle
    "perseus_init": (_status, [ctypes.c_int64]),
    "perseus_check_mpi_library": (_status, []),
    "perseus_mpi_header_version": (ctypes.c_char_p, []),
    "perseus_shutdown": (_status, []),
    "perseus_shutdown_within": (_status, [ctypes.c_double]),
    "perseus_leave": (_status, [ctypes.c_char_p, ctypes.c_double]),
    "perseus_is_initialized": (ctypes.c_int, []),
    "perseus_world_failed": (ctypes.c_int, []),
    "perseus_grow": (_status, [ctypes.c_int32, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
                               ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]),
    "perseus_joined_job": (ctypes.c_int, []),
    "perseus_keep_in_job": (_status, [ctypes.c_int32]),
    "perseus_fault_tolerance": (ctypes.c_char_p, [_i32p, _i32p]),
    "perseus_last_error": (ctypes.c_char_p, []),
    "perseus_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    # topology
    "perseus_rank": (_status, [_i32p]),
    "perseus_size": (_status, [_i32p]),
    "perseus_local_rank": (_status, [_i32p]),
    "perseus_local_size": (_status, [_i32p]),
    "perseus_cross_rank": (_status, [_i32p]),
    "perseus_cross_size": (_status, [_i32p]),
    "perseus_rank_nodes": (_status, [_i32p, ctypes.c_int32]),
    "perseus_is_homogeneous": (_status, [_i32p]),
    "perseus_mpi_threads_supported": (_status, [_i32p]),
    "perseus_lane_count": (_status, [_i32p]),
    "perseus_meeting_seconds": (_status, [ctypes.POINTER(ctypes.c_double)]),
    "perseus_config_string": (ctypes.c_char_p, []),
    "perseus_counters": (_status, [_i64p, ctypes.c_int32]),
    # timeline
    "perseus_start_timeline": (_status, [ctypes.c_char_p, ctypes.c_int32]),
    "perseus_stop_timeline": (_status, []),
    # process sets
    "perseus_add_process_set": (_status, [_i32p, ctypes.c_int32, _i32p]),
    "perseus_remove_process_set": (_status, [ctypes.c_int32]),
    "perseus_process_set_rank": (_status, [ctypes.c_int32, _i32p]),
    "perseus_process_set_size": (_status, [ctypes.c_int32, _i32p]),
    "perseus_process_set_hold": (_status, [ctypes.c_int32, ctypes.c_int32, _i64p,
                                           ctypes.POINTER(ctypes.c_double)]),
    "perseus_process_set_ranks": (_status, [ctypes.c_int32, _i32p, ctypes.c_int32, _i32p]),
    # request rules; perseus_check_rows's splits is declared c_void_p, as perseus_enqueue's
    # pointers are (below), for the address of an array of int64s.
    "perseus_check_reduction": (_status, [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]),
    "perseus_check_rows": (_status, [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                     ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32, _i64p]),
    # requests. perseus_enqueue's pointers are declared c_void_p (same ABI as
    # const perseus_request_t* / int64_t*) so requests.py can pass the plain integer
    # addresses of its packed buffer without building ctypes objects per call.
    "perseus_enqueue": (_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    "perseus_enqueue_and_drive": (_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                            ctypes.c_double]),
    "perseus_enqueue_deferred": (_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    "perseus_run": (_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_double]),
    "perseus_poll": (_status, [ctypes.c_int64, _i32p]),
    "perseus_wait": (_status, [ctypes.c_int64, ctypes.c_double]),
    "perseus_wait_all": (_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_double, _i32p]),
    "perseus_on_complete": (_status, [_i64p, ctypes.c_int32, CALLBACK, ctypes.c_void_p]),
    "perseus_handle_output": (_status, [ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p), _i64p,
                                        _i32p, ctypes.POINTER(_i64p), _i32p]),
    "perseus_withdraw": (_status, [ctypes.c_int64, ctypes.c_char_p]),
    "perseus_process_set_probe": (_status, [ctypes.c_int32, ctypes.c_double]),
    "perseus_point_to_point": (_status, [ctypes.POINTER(P2P), _i64p]),
    "perseus_release": (_status, [ctypes.c_int64]),
    "perseus_free_buffer": (None, [ctypes.c_void_p]),
    # GPU tensors (work before init)
    "perseus_set_gpu_library_dirs": (_status, [ctypes.c_char_p]),
    "perseus_gpu_load": (_status, [_i32p, _i32p]),
    "perseus_gpu_describe": (ctypes.c_char_p, []),
    "perseus_stream_wait": (_status, [ctypes.c_int64, ctypes.c_void_p]),
    "perseus_stream_wait_all": (_status, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    "perseus_free_device_buffer": (_status, [ctypes.c_void_p, ctypes.c_void_p]),
}


def _bind(name):
    try:
        fn = getattr(_lib, name)
    except AttributeError:
        raise ImportError(
            "%s does not export %s: it is older or newer than this Python package. "
            "Rebuild and reinstall Perseus with `pip install .`." % (LIBRARY_PATH, name)) from None
    fn.restype, fn.argtypes = _SIGNATURES[name]
    return fn


perseus_init = _bind("perseus_init")
perseus_check_mpi_library = _bind("perseus_check_mpi_library")
perseus_mpi_header_version = _bind("perseus_mpi_header_version")
perseus_shutdown = _bind("perseus_shutdown")
perseus_shutdown_within = _bind("perseus_shutdown_within")
perseus_leave = _bind("perseus_leave")
perseus_is_initialized = _bind("perseus_is_initialized")
perseus_world_failed = _bind("perseus_world_failed")
perseus_grow = _bind("perseus_grow")
perseus_joined_job = _bind("perseus_joined_job")
perseus_keep_in_job = _bind("perseus_keep_in_job")
perseus_fault_tolerance = _bind("perseus_fault_tolerance")
perseus_last_error = _bind("perseus_last_error")
perseus_status_string = _bind("perseus_status_string")
perseus_rank = _bind("perseus_rank")
perseus_size = _bind("perseus_size")
perseus_local_rank = _bind("perseus_local_rank")
perseus_local_size = _bind("perseus_local_size")
perseus_cross_rank = _bind("perseus_cross_rank")
perseus_cross_size = _bind("perseus_cross_size")
perseus_rank_nodes = _bind("perseus_rank_nodes")
perseus_is_homogeneous = _bind("perseus_is_homogeneous")
perseus_mpi_threads_supported = _bind("perseus_mpi_threads_supported")
perseus_lane_count = _bind("perseus_lane_count")
perseus_meeting_seconds = _bind("perseus_meeting_seconds")
perseus_config_string = _bind("perseus_config_string")
perseus_counters = _bind("perseus_counters")
perseus_start_timeline = _bind("perseus_start_timeline")
perseus_stop_timeline = _bind("perseus_stop_timeline")
perseus_add_process_set = _bind("perseus_add_process_set")
perseus_remove_process_set = _bind("perseus_remove_process_set")
perseus_process_set_rank = _bind("perseus_process_set_rank")
perseus_process_set_size = _bind("perseus_process_set_size")
perseus_process_set_hold = _bind("perseus_process_set_hold")
perseus_process_set_ranks = _bind("perseus_process_set_ranks")
perseus_check_reduction = _bind("perseus_check_reduction")
perseus_check_rows = _bind("perseus_check_rows")
perseus_enqueue = _bind("perseus_enqueue")
perseus_enqueue_and_drive = _bind("perseus_enqueue_and_drive")
perseus_enqueue_deferred = _bind("perseus_enqueue_deferred")
perseus_run = _bind("perseus_run")
perseus_poll = _bind("perseus_poll")
perseus_wait = _bind("perseus_wait")
perseus_wait_all = _bind("perseus_wait_all")
perseus_on_complete = _bind("perseus_on_complete")
perseus_handle_output = _bind("perseus_handle_output")
perseus_withdraw = _bind("perseus_withdraw")
perseus_process_set_probe = _bind("perseus_process_set_probe")
perseus_point_to_point = _bind("perseus_point_to_point")
perseus_release = _bind("perseus_release")
perseus_free_buffer = _bind("perseus_free_buffer")
perseus_set_gpu_library_dirs = _bind("perseus_set_gpu_library_dirs")
perseus_gpu_load = _bind("perseus_gpu_load")
perseus_gpu_describe = _bind("perseus_gpu_describe")
perseus_stream_wait = _bind("perseus_stream_wait")
perseus_stream_wait_all = _bind("perseus_stream_wait_all")
perseus_free_device_buffer = _bind("perseus_free_device_buffer")


def error(status):
    """The exception for a non-zero status, with this thread's perseus_last_error().

    Must be called right after the failing call, on the same thread: the core keeps
    the message per thread.
    """
    raw = perseus_last_error()
    message = raw.decode("utf-8", "replace") if raw else ""
    if not message:
        raw = perseus_status_string(status)
        message = raw.decode("utf-8", "replace") if raw else "status %d" % status
    return exceptions.exception_for(status, message)


def check(status):
    """Raises the matching exception when a core call returned a non-zero status."""
    if status:
        raise error(status)


def check_mpi_library():
    """Raises HorovodInternalError when the MPI library loaded in this process is not
    the kind whose mpi.h libperseus was compiled with (a mixed build, in which init()
    would hang or crash); the message names both and how to rebuild. Returns None when
    they agree. Callable before init(); touches no MPI state. init() runs the same
    check first."""
    check(perseus_check_mpi_library())


def mpi_header_version():
    """The MPI whose mpi.h libperseus was compiled with, e.g. "MPICH 4.3.0"."""
    return perseus_mpi_header_version().decode("utf-8", "replace")


def mpi_library_version():
    """MPI_Get_library_version() of the MPI libperseus is linked with (callable before
    MPI_Init), first line only; None when the symbol cannot be found. Here because
    this module is the one place that reaches into the loaded libraries."""
    try:
        fn = ctypes.CDLL(None).MPI_Get_library_version  # global: libperseus is RTLD_GLOBAL
    except (AttributeError, OSError):
        return None
    buf = ctypes.create_string_buffer(8192)  # >= MPI_MAX_LIBRARY_VERSION_STRING of MPICH / Open MPI
    length = ctypes.c_int(0)
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    if fn(buf, ctypes.byref(length)) != 0:
        return None
    text = buf.value.decode("utf-8", "replace").strip()
    return " ".join(text.splitlines()[0].split()) if text else None
