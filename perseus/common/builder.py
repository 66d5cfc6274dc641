"""The request builder: what turns a collective call into requests.

A front end converts its tensors to (dtype code, shape, addresses, device, stream)
and asks this module for everything else: the process set's id and this rank's
place in it, the broadcast root as a set rank, names, compression. The rules on
dtypes, reduce ops and dim 0 (bool, Adasum, alltoall splits, reducescatter rows) are
the core's: this module asks it (check_code, check_rows). It builds Request
objects, which pack() lays out as perseus_request_t records for perseus_enqueue.

A request field is added to the header, to library.Request and here to Request and
the packers, nowhere else.

This is the hot path of every collective: Request is a plain __slots__ class (no
validation), and pack() does little per request (struct packing, cached layouts).
"""

import array
import ctypes
import itertools
import struct

from perseus.common import library as _lib
from perseus.common import process_sets as _process_sets
from perseus.common.compression import NoneCompressor
from perseus.common.exceptions import CollectiveTypeError, exception_for
from perseus.common.ops import (ALLREDUCE, ALLTOALL, CPU_DEVICE, DTYPE_NAMES, FLOAT32,
                                GLOBAL_PROCESS_SET, NUM_DTYPES, OP_TYPE_NAMES, REDUCE_OP_NAMES,
                                REDUCESCATTER, integer)


class Request:
    """One request, as perseus_request_t has it (ndim and nsplits follow from shape
    and splits). Fields:

    op_type       ops.ALLREDUCE, ...
    process_set   process set id (set_id()), 0 = global
    dtype         ops.FLOAT32, ...
    shape         input shape, a tuple of ints (a torch.Size works: it is a tuple)
    input         address of the input buffer (0 when empty)
    output        address of the output buffer; 0: the core allocates it
    name          wire name (names()), or None: pack() numbers it, anonymous
    reduce_op     ops.Sum, ... (allreduce, reducescatter)
    prescale, postscale
    root_rank     broadcast root, rank within the set (root_in_set())
    splits        alltoall rows per rank (alltoall_splits()), None = even
    device        ops.CPU_DEVICE or a GPU ordinal
    stream        the framework's GPU stream as an int handle, 0 on CPU
    anonymous     1 when the front end generated the name (forced for name None)
    group_size    grouped calls: the number of requests of the group (group()), else 0
    """

    __slots__ = ("op_type", "process_set", "dtype", "shape", "input", "output", "name",
                 "reduce_op", "prescale", "postscale", "root_rank", "splits", "device",
                 "stream", "anonymous", "group_size")

    def __init__(self, op_type, process_set, dtype, shape, input=0, output=0, name=None,
                 reduce_op=0, prescale=1.0, postscale=1.0, root_rank=0, splits=None,
                 device=CPU_DEVICE, stream=0, anonymous=0, group_size=0):
        self.op_type = op_type
        self.process_set = process_set
        self.dtype = dtype
        self.shape = shape
        self.input = input
        self.output = output
        self.name = name
        self.reduce_op = reduce_op
        self.prescale = prescale
        self.postscale = postscale
        self.root_rank = root_rank
        self.splits = splits
        self.device = device
        self.stream = stream
        self.anonymous = anonymous
        self.group_size = group_size

    def __repr__(self):
        return "Request(%s)" % ", ".join("%s=%r" % (f, getattr(self, f)) for f in self.__slots__)


# ---- process sets ---------------------------------------------------------------

def set_id(process_set):
    """The id requests carry for `process_set`; ValueError when it is not registered
    (no id, or an id that names no registered set of these ranks, e.g. one set by
    hand), before anything is sent, on every front end, as Horovod. Membership is the
    core's rule (member_rank() asks it here)."""
    sid = process_set.process_set_id
    if sid is None:
        raise ValueError("%r is not registered: call hvd.add_process_set() on every rank first"
                         % (process_set,))
    registered = _process_sets.registered(sid)
    if registered is not process_set and (registered is None or registered.ranks != process_set.ranks):
        raise ValueError("%r is not registered: no process set with id %s and these ranks is "
                         "(call hvd.add_process_set() on every rank first)" % (process_set, sid))
    return sid


def member_rank(process_set):
    """This process's rank within the (registered) set; ValueError when not a member,
    the core's (perseus_check_rows checks membership first). For front ends that
    need it before the core sees the request."""
    check_rows(ALLREDUCE, process_set, None)
    return process_set.rank()


def root_in_set(process_set, root_rank):
    """A broadcast root given as a global rank (as in Horovod) as the core wants it:
    the rank within the set. ValueError when it is not a member of the set, TypeError
    (ops.integer) when it is not an integer."""
    root_rank = integer(root_rank, "broadcast root_rank")
    if set_id(process_set) != GLOBAL_PROCESS_SET:
        try:
            return process_set.ranks.index(root_rank)
        except ValueError:
            raise ValueError("broadcast root_rank %s is not a member of %r"
                             % (root_rank, process_set)) from None
    size = process_set.size()
    if not 0 <= root_rank < size:
        raise ValueError("broadcast root_rank %s is out of range for a process set of %d ranks"
                         % (root_rank, size))
    return root_rank


# ---- names ----------------------------------------------------------------------
# Unnamed requests are numbered per (op type, process set): every rank that makes
# the same calls on a set counts the same way, independent of its traffic on other
# sets. Numbers are drawn in pack(), after the front end has validated its tensors,
# so a call rejected in Python does not shift later names on one rank only.
# itertools.count's next() is atomic under the GIL, so threads are safe.
_counters = {}  # (op_type, set id) -> (name format as bytes, counter)


def _new_counter(op_type, sid):
    """(format of "<op>[.set<id>].noname.<k>" as bytes, counter) of (op type, set)."""
    prefix = OP_TYPE_NAMES[op_type] + (".set%d" % sid if sid else "")
    fmt = ("%s.noname.%%d" % prefix).encode()
    return _counters.setdefault((op_type, sid), (fmt, itertools.count()))


def unnamed(op_type, sid):
    """The next generated name: "<op>.noname.<k>", "<op>.set<id>.noname.<k>" off the
    global set."""
    entry = _counters.get((op_type, sid)) or _new_counter(op_type, sid)
    return entry[0] % next(entry[1])


def wire_name(op_type, name):
    """The wire name of a user-named request: "<op>.<name>", as Horovod."""
    return wire_name_raw("%s.%s" % (OP_TYPE_NAMES[op_type], name))


def wire_name_raw(text):
    try:
        wire = text.encode()
    except UnicodeEncodeError as e:  # a lone surrogate, e.g. from os.fsdecode() of bytes
        raise ValueError("request name %r (from the name argument) is not valid Unicode "
                         "text: %s at index %d; names travel as UTF-8"
                         % (text, e.reason, e.start)) from None
    if b"\0" in wire:
        raise ValueError("request name %r contains a NUL character" % (text,))
    return wire


_NO_NAMES = {n: (None,) * n for n in range(1, 9)}


def names(op_type, name, count=1, grouped=False):
    """Per request of a call: its wire name, or None when the user gave none (pack()
    numbers it). A group's members are "<op>.<name>.<i>"."""
    if name is None:
        return _NO_NAMES.get(count) or (None,) * count
    if grouped:
        return [wire_name(op_type, "%s.%d" % (name, i)) for i in range(count)]
    return (wire_name(op_type, name),)


def names_now(op_type, name, count, sid, grouped=False, graph_name=None):
    """(wire names, anonymous) for a front end that passes names on itself (the
    TensorFlow ops): unnamed requests are numbered now, or, for an op built into a
    graph, named after its place in the graph (`graph_name`, e.g. TensorFlow's
    "<function>/<scope>/<op>"): "<op>[.set<id>].graph.<graph_name>[.<i>]". That
    depends only on the graph, which every rank builds alike, not on how often or
    in what order a rank traced (a retrace for a shape seen on one rank only);
    such names are cached by the core."""
    if name is not None:
        return list(names(op_type, name, count, grouped)), False
    if graph_name is not None:
        prefix = "%s%s.graph.%s" % (OP_TYPE_NAMES[op_type], ".set%d" % sid if sid else "",
                                    graph_name)
        if count == 1:
            return [wire_name_raw(prefix)], False
        return [wire_name_raw("%s.%d" % (prefix, i)) for i in range(count)], False
    return [unnamed(op_type, sid) for _ in range(count)], True


def default_name(base, process_set):
    """A name fixed per process set (object collectives), so ranks agree whatever
    object they pass: "<base>", "<base>.set<id>" off the global set."""
    sid = process_set.process_set_id
    return base if sid in (None, GLOBAL_PROCESS_SET) else "%s.set%d" % (base, sid)


def group(requests, grouped):
    """Marks the requests of a grouped call (one perseus_enqueue) with their number,
    which ranks must agree on: a rank with fewer tensors fails instead of finishing
    while the others wait for the rest. An unnamed group draws one number for all
    its members ("<op>.noname.<k>.<i>"), so that a group of another size on some rank
    does not shift the names of every later unnamed request. Returns requests."""
    if grouped:
        base = None
        for i, r in enumerate(requests):
            r.group_size = len(requests)
            if r.name is None:
                base = base or unnamed(r.op_type, r.process_set)
                r.name = b"%s.%d" % (base, i)
                r.anonymous = 1
    return requests


# ---- the core's rules ------------------------------------------------------------
# The rules on reduce ops, dtypes and dim 0 are the core's (csrc/src/common/
# request_rules.cc), applied to every request at perseus_enqueue. A front end asks the
# core for them before it sends anything (perseus_check_reduction, perseus_check_rows),
# so the call is refused at once and reads as perseus_enqueue's refusal would.

def _reduction_refusals():
    """(op type, reduce op, dtype code) -> (status, message) of the core's refusal, for
    every combination perseus_check_reduction refuses. Asked once, at import (it
    needs no init), so that the check at each call is one dict lookup."""
    refusals = {}
    for key in itertools.product(range(len(OP_TYPE_NAMES)), range(len(REDUCE_OP_NAMES)),
                                 range(NUM_DTYPES)):
        status = _lib.perseus_check_reduction(*key)
        if status:
            refusals[key] = (status, _lib.error(status).args[0])
    return refusals


_REDUCTION_REFUSALS = _reduction_refusals()
_DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES)}


def check_code(op_type, reduce_op, code):
    """The core's rules for reductions (bool tensors, Adasum) for a tensor of dtype
    code `code`: raises what perseus_enqueue would (ValueError, NotImplementedError)."""
    refusal = _REDUCTION_REFUSALS.get((op_type, reduce_op, code))
    if refusal is not None:
        raise exception_for(*refusal)


def check_dtype(op_type, reduce_op, dtype_name):
    """check_code() for a dtype named as in ops.DTYPE_NAMES (TensorFlow's and numpy's
    spelling); a dtype the core has no code for is the framework's to refuse."""
    code = _DTYPE_CODES.get(dtype_name)
    if code is not None:
        check_code(op_type, reduce_op, code)


def check_op(op_type, reduce_op):
    """The rules on the reduce op alone (Adasum is an allreduce only), at the call,
    before the tensors: a float32 tensor meets every dtype rule, so what the core
    refuses here is the operation."""
    check_code(op_type, reduce_op, FLOAT32)


def check_rows(op_type, process_set, shape, splits=None):
    """The core's rules on dim 0 (perseus_check_rows) for a tensor of `shape` (None:
    not known yet) in the registered `process_set`: allgather, alltoall and
    reducescatter need a dim 0; alltoall's splits (a tuple of ints, or None: even)
    must fit the set and the tensor. Returns this rank's rows of a reducescatter's
    output, else -1."""
    ndim, rows = (1, -1) if shape is None else (len(shape), shape[0] if len(shape) else 0)
    ints = array.array("q", splits or ())
    out = ctypes.c_int64()
    status = _lib.perseus_check_rows(op_type, set_id(process_set), ndim, rows,
                                     ints.buffer_info()[0] if splits else None, len(ints),
                                     ctypes.byref(out))
    if status:
        raise _lib.error(status)
    return out.value


def alltoall_splits(splits, process_set, shape):
    """alltoall's splits as a tuple of ints (None stays None: an even split), checked
    by the core against the set and the input's `shape` (None: not known yet)."""
    if splits is not None:
        if hasattr(splits, "tolist"):
            # Integer arrays only (numpy, torch, TensorFlow dtypes all spell "int"), as
            # Horovod refuses float splits rather than truncating them.
            if "int" not in str(getattr(splits, "dtype", "int")):
                raise CollectiveTypeError("alltoall splits must be integers, got dtype %s"
                                          % splits.dtype)
            splits = splits.tolist()
        splits = tuple([integer(s, "an alltoall split") for s in splits])
    check_rows(ALLTOALL, process_set, shape, splits)
    return splits


def scatter_rows(shape, process_set):
    """Rows of this rank's reducescatter output for an input of `shape`, as the core
    splits dim 0 (ValueError for a scalar, or when this rank is not a member)."""
    return check_rows(REDUCESCATTER, process_set, shape)


# ---- compression ----------------------------------------------------------------

def compressed(compression, tensors, reduce):
    """reduce(tensors) -> results, with `compression` around it: each tensor is
    compressed, the wire tensors reduced, the results decompressed."""
    if compression is None or compression is NoneCompressor:
        return reduce(tensors)
    wires = [compression.compress(t) for t in tensors]
    results = reduce([wire for wire, _ in wires])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, wires)]


# ---- layout for perseus_enqueue -------------------------------------------------
# A record is one struct call with its fields in library.Request's order (the
# header's, tests/meta/test_header_mirror.py), written out in the packers below;
# tests/unit/test_request_packing.py reads every field back through library.Request, so
# a field written in another's place fails there. A field added to the header is
# added to library.Request, to Request above and to the packers, nowhere else.
_STRIDE = _lib.REQUEST_SIZE
_RECORD = _lib.REQUEST_STRUCT.format.lstrip("@")
_RECORD_PAD = _STRIDE - _lib.REQUEST_STRUCT.size
_pack_record = _lib.REQUEST_STRUCT.pack_into
_int64_structs = {}
_single_layouts = {}  # (ndim, nsplits, name length) -> struct of a one-request batch


def int64s(count):
    """A cached struct.Struct for `count` int64s (formatting one per call is slow)."""
    packer = _int64_structs.get(count)
    if packer is None:
        packer = _int64_structs[count] = struct.Struct("%dq" % count)
    return packer


def pack(requests):
    """Lays a batch out for perseus_enqueue, drawing names for unnamed requests.

    Returns (buf, n): buf is an array.array of bytes holding, 8-byte aligned,
    [n int64 handles_out][n perseus_request_t at byte 8*n][int64 shapes+splits]
    [names]; the records' name/shape/splits pointers point into buf. A front end
    that enqueues later (perseus.mxnet's engine ops) copies buf and moves them.
    """
    try:
        if len(requests) == 1:
            return _pack_one(requests[0]), 1
        return _pack_many(requests), len(requests)
    except struct.error as e:
        # A field out of its C type's range (e.g. a root rank > 2**31).
        raise ValueError("invalid request field: %s" % e) from None


def _one_layout(key):
    """The struct of [handle][record][shape, splits][name] for a one-request batch."""
    if len(_single_layouts) > 4096:  # bound it against endless distinct names
        _single_layouts.clear()
    ndim, nsplits, name_length = key
    layout = _single_layouts[key] = struct.Struct(
        "@q%s%dx%dq%ds" % (_RECORD, _RECORD_PAD, ndim + nsplits, name_length + 1))
    return layout


def _pack_one(r):
    """pack() of one request, the common case: one struct call, with the layout
    cached per (ndim, nsplits, name length)."""
    wire = r.name or unnamed(r.op_type, r.process_set)
    shape = r.shape
    splits = r.splits or ()
    ndim = len(shape)
    nsplits = len(splits)
    key = (ndim, nsplits, len(wire))
    layout = _single_layouts.get(key) or _one_layout(key)
    buf = array.array("B", bytes(layout.size))
    shape_at = buf.buffer_info()[0] + 8 + _STRIDE
    splits_at = shape_at + 8 * ndim if nsplits else 0
    layout.pack_into(buf, 0, 0, shape_at + 8 * (ndim + nsplits), r.op_type, r.reduce_op,
                     r.dtype, r.device, ndim, shape_at, r.input, r.output, r.prescale,
                     r.postscale, r.root_rank, r.process_set, splits_at, nsplits,
                     1 if r.name is None else r.anonymous, r.stream, r.group_size,
                     *shape, *splits, wire)
    return buf


def _pack_many(requests):
    """pack() of 0 or 2+ requests."""
    n = len(requests)
    if n == 0:
        raise ValueError("enqueue() needs at least one request")
    # Shapes and splits of all requests, in order, as one int64 array; names as one
    # NUL-separated string.
    ints = []
    wires = []
    for r in requests:
        ints += r.shape
        if r.splits:
            ints += r.splits
        wires.append(r.name or unnamed(r.op_type, r.process_set))
    names = b"\0".join(wires) + b"\0"
    ints_at = (8 + _STRIDE) * n
    chars_at = ints_at + 8 * len(ints)
    buf = array.array("B", bytes(chars_at + len(names)))
    base = buf.buffer_info()[0]
    memoryview(buf)[chars_at:] = names
    if ints:
        int64s(len(ints)).pack_into(buf, ints_at, *ints)
    at = 8 * n  # this request's record
    shape_at = base + ints_at  # its shape, then its splits
    name_at = base + chars_at  # its name
    for r, wire in zip(requests, wires):
        ndim = len(r.shape)
        splits_at = shape_at + 8 * ndim
        nsplits = len(r.splits) if r.splits else 0
        _pack_record(buf, at, name_at, r.op_type, r.reduce_op, r.dtype, r.device, ndim,
                     shape_at, r.input, r.output, r.prescale, r.postscale, r.root_rank,
                     r.process_set, splits_at if nsplits else 0, nsplits,
                     1 if r.name is None else r.anonymous, r.stream, r.group_size)
        shape_at = splits_at + 8 * nsplits
        name_at += len(wire) + 1
        at += _STRIDE
    return buf


# Where pack_prebuilt() patches a record: its shape, input and output pointers
# (adjacent in perseus_request_t), and its stream.
_ADDRESSES_AT = _lib.Request.shape.offset
_pack_addresses = struct.Struct("@PPP").pack_into
_STREAM_AT = _lib.Request.stream.offset
_pack_stream = struct.Struct("@P").pack_into
_DEVICE_AT = _lib.Request.device.offset
if not (_lib.Request.input.offset == _lib.Request.shape.offset + 8
        and _lib.Request.output.offset == _lib.Request.input.offset + 8):
    raise ImportError("perseus_request_t: shape, input and output are not adjacent")


class Prebuilt:
    """Request i of a batch that pack() laid out in `buf`, kept for a front end that
    submits the same named request again and again with only its buffers changing
    (an optimizer's in-place allreduce of a gradient, every step): pack_prebuilt()
    copies its record and fills in the addresses, skipping names, struct layouts and
    checks. Its name and shape stay in `buf`, which it keeps alive; keep the Prebuilt
    alive until the requests packed from it complete. `device` is the request's
    (ops.CPU_DEVICE or a GPU ordinal)."""

    __slots__ = ("_buf", "_record", "_alone", "_shape_address", "device")

    def __init__(self, buf, n, i):
        at = 8 * n + _STRIDE * i
        record = bytearray(buf[at:at + _STRIDE])
        _pack_stream(record, _STREAM_AT, 0)  # pack_prebuilt() writes a stream, if any
        self._buf = buf
        self._record = bytes(record)
        self._alone = bytes(8) + self._record  # a batch of this request alone
        self._shape_address = struct.unpack_from("@P", record, _ADDRESSES_AT)[0]
        self.device = struct.unpack_from("@i", record, _DEVICE_AT)[0]

    def pack_alone(self, input_at, output_at):
        """pack_prebuilt([(self, input_at, output_at, 0)]): this CPU request alone."""
        buf = array.array("B", self._alone)
        _pack_addresses(buf, 8 + _ADDRESSES_AT, self._shape_address, input_at, output_at)
        return buf, 1


def pack_prebuilt(items):
    """(buf, n) as pack() returns it, for a batch of items that start (Prebuilt, input
    address, output address, stream), the rest of each item unread: one
    perseus_enqueue for many gradients. stream: the GPU stream that produced the
    input (0 on CPU, or for the legacy default stream)."""
    n = len(items)
    buf = array.array("B", bytes(8 * n))
    buf.frombytes(b"".join([item[0]._record for item in items]))
    at = 8 * n  # the first record
    for item in items:
        _pack_addresses(buf, at + _ADDRESSES_AT, item[0]._shape_address, item[1], item[2])
        if item[3]:
            _pack_stream(buf, at + _STREAM_AT, item[3])
        at += _STRIDE
    return buf, n


def reset():
    """Forgets the numbering of unnamed requests; called by init(), so every rank
    restarts its counters together."""
    _counters.clear()
