"""Pushes Perseus requests into MXNet's dependency engine as asynchronous operations.

push() packs the requests (perseus.common.builder.pack: names, shapes) and hands
MXEnginePushAsyncND one operation over the arrays: inputs as read (const) vars,
outputs as written (mutable) vars. MXNet runs it once every earlier writer of an
input has finished; the bridge (csrc/perseus_mx_engine.cc) then enqueues the batch
with the core and returns, and a waiter thread completes the operation when the
core is done. So the calling Python thread never waits, later MXNet operations on
the outputs wait exactly for the collective, and a failed request (e.g. shapes that
differ across ranks) is raised as MXNetError by whatever reads an output
(asnumpy(), wait_to_read(), mx.nd.waitall()).
"""

import atexit
import ctypes
import math
import os
import sys

import mxnet as mx
from mxnet.base import _LIB, check_call

from perseus.common import basics as _basics
from perseus.common import builder as _builder
from perseus.common import requests as _requests
from perseus.mxnet import engine_library

_bridge = engine_library.load()
_bridge.perseus_mx_set_functions(*(ctypes.cast(getattr(_LIB, name), ctypes.c_void_p)
                                   for name in ("MXNDArrayGetData", "MXGetLastError",
                                                "MXShallowCopyNDArray", "MXNDArrayFree")))
_RUN = ctypes.cast(_bridge.perseus_mx_job_run, ctypes.c_void_p)
_DELETE = ctypes.cast(_bridge.perseus_mx_job_delete, ctypes.c_void_p)
# MXNet's NaiveEngine (MXNET_ENGINE_TYPE=NaiveEngine, for debugging) runs every
# operation on the pushing thread at once and drops the errors operations report;
# there push() runs the requests directly and raises their errors itself.
_NAIVE = os.environ.get("MXNET_ENGINE_TYPE") == "NaiveEngine"
_GET_DATA = _LIB.MXNDArrayGetData
# With oneDNN (MKLDNN, on in the pip wheel unless MXNET_MKLDNN_ENABLED=0), an array
# of 2+ dimensions may hold its data in a blocked layout. Its plain-layout address
# is only available after a reorder that MXNet runs as another engine operation,
# which would wait behind ours: a deadlock. So such inputs go through Cast (no
# oneDNN kernel: its output is a plain copy) and in-place results are copied back.
_ONEDNN = (mx.runtime.Features().is_enabled("MKLDNN")
           and os.environ.get("MXNET_MKLDNN_ENABLED", "1") != "0")


class _Context(ctypes.Structure):
    """mxnet::Context as MXEnginePushAsync reads it: device type id, device id."""
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


_PUSH = _LIB.MXEnginePushAsyncND
_PUSH.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                  ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_bool]
_PUSH.restype = ctypes.c_int


def _handles(arrays):
    return (ctypes.c_void_p * len(arrays))(*[a.handle.value for a in arrays])


def push(requests, inputs, outputs, priority=0, op_name=b"Perseus", after=None):
    """Runs `requests` (builder.Request objects whose input/output addresses are
    ignored: the bridge reads them from the arrays when the engine runs it) as one
    MXNet engine operation. inputs[i] and outputs[i] are the NDArrays of
    requests[i]; outputs[i] may be inputs[i] (in place). `after`: an extra NDArray the
    operation counts as written, so operations given the same one run one after
    another (e.g. requests of the same name). Returns at once."""
    if _NAIVE:
        _run_now(requests, inputs, outputs)
        return
    copy_back = []
    if _ONEDNN:
        inputs, outputs = list(inputs), list(outputs)
        for i, array in enumerate(inputs):
            if array.ndim >= 2 and array.size:
                plain = mx.nd.Cast(array, dtype=array.dtype)
                if outputs[i] is array:
                    outputs[i] = plain
                    copy_back.append((plain, array))
                inputs[i] = plain
    buf, n = _builder.pack(requests)
    job = _bridge.perseus_mx_job_new(buf.buffer_info()[0], len(buf), 8 * n, n,
                                     _handles(inputs), _handles(outputs))
    if not job:
        raise RuntimeError("Perseus could not reference the MXNet arrays: %s"
                           % mx.base.py_str(_LIB.MXGetLastError()))
    # An array is listed once, as written if any request writes it, else as read.
    written, read, seen = [], [], set()
    for array in list(outputs) + ([after] if after is not None else []):
        if array.handle.value not in seen:
            seen.add(array.handle.value)
            written.append(array)
    for array in inputs:
        if array.handle.value not in seen:
            seen.add(array.handle.value)
            read.append(array)
    context = inputs[0].context
    ctx = _Context(context.device_typeid, context.device_id)
    # The job belongs to the engine from here: it calls _DELETE when done with it.
    check_call(_PUSH(_RUN, job, _DELETE, ctypes.addressof(ctx), _handles(read), len(read),
                     _handles(written), len(written), None, int(priority), op_name, False))
    for plain, array in copy_back:
        plain.copyto(array)


def _address(array):
    data = ctypes.c_void_p()
    check_call(_GET_DATA(array.handle, ctypes.byref(data)))
    return data.value or 0


def _run_now(requests, inputs, outputs):
    """push() under NaiveEngine: every earlier operation has finished, so the data
    addresses are final; run the requests and wait, raising their errors here."""
    for request, i, o in zip(requests, inputs, outputs):
        if math.prod(request.shape):
            request.input, request.output = _address(i), _address(o)
    _requests.synchronize(_requests.submit(_builder.pack(requests),
                                           lambda state, handles: None, (inputs, outputs),
                                           drive=True))


def shutdown():
    """hvd.shutdown() for MXNet: lets MXNet finish every pushed operation (Perseus'
    among them), then stops Perseus. An operation that failed raises here, after
    Perseus has stopped."""
    try:
        mx.nd.waitall()
    finally:
        _basics.shutdown()


def _finish_at_exit():
    # Runs before perseus.common.basics' exit hook (registered earlier), so
    # operations still in MXNet's engine are not cut off by Perseus' shutdown.
    try:
        mx.nd.waitall()
    except Exception as e:  # nobody read that result; say so instead of a traceback
        sys.stderr.write("perseus.mxnet: an MXNet operation failed before exit: %s\n" % e)


atexit.register(_finish_at_exit)
