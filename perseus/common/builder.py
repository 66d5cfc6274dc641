"""The one request builder: every rule that turns a collective call into requests.

A front end converts its tensors to (dtype code, shape, addresses, device, stream)
and asks this module for everything else: the process set's id and this rank's
place in it, the broadcast root as a set rank, names, alltoall splits,
reducescatter rows, dtype rules, compression. It builds Request objects, which
pack() lays out as perseus_request_t records for perseus_enqueue.

A request field is added to the header, to library.Request (which gives the packers
their field order) and here to Request (or to _COMPUTED_FIELDS, where packing
computes it), nowhere else.

This is the hot path of every collective: Request is a plain __slots__ class (no
validation), and pack() does little per request (struct packing, cached layouts).
"""

import array
import itertools
import linecache
import struct

from perseus.common import library as _lib
from perseus.common import process_sets as _process_sets
from perseus.common.compression import NoneCompressor
from perseus.common.exceptions import CollectiveArgumentError, CollectiveTypeError
from perseus.common.ops import (ALLREDUCE, BOOL, CPU_DEVICE, DTYPE_NAMES, GLOBAL_PROCESS_SET,
                                OP_TYPE_NAMES, REDUCESCATTER, Adasum, check_adasum, integer)


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
    core's check at enqueue (member_rank() checks it here)."""
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
    """This process's rank within the (registered) set; ValueError when not a member.
    For front ends that need it before the core sees the request."""
    set_id(process_set)
    rank = process_set.rank()
    if rank < 0:
        raise ValueError("this process is not a member of %r" % (process_set,))
    return rank


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


# ---- shapes and dtypes ----------------------------------------------------------

def check_op(op_type, reduce_op):
    """NotImplementedError for a reduce op the collective does not have (Adasum is
    an allreduce only); checked at the call, before the tensors."""
    if reduce_op == Adasum and op_type != ALLREDUCE:
        check_adasum(op_type)


def check_dtype(op_type, reduce_op, dtype_name, what="tensors"):
    """The dtype rules a rank can check alone before anything is sent: Adasum is an
    allreduce of floats, reductions refuse bool. dtype_name: ops.DTYPE_NAMES'
    spelling (TensorFlow's and numpy's too)."""
    if reduce_op == Adasum:
        check_adasum(op_type, dtype_name)
    if dtype_name == "bool" and (op_type == ALLREDUCE or op_type == REDUCESCATTER):
        raise ValueError("%s does not support bool %s" % (OP_TYPE_NAMES[op_type], what))


def check_code(op_type, reduce_op, code, what="tensors"):
    """check_dtype() for a dtype code; cheap for the common case."""
    if code == BOOL or reduce_op == Adasum:
        check_dtype(op_type, reduce_op, DTYPE_NAMES[code], what)


def alltoall_splits(splits, process_set, rows):
    """alltoall's splits as a tuple of ints (None stays None: an even split),
    checked against the set's size and the input's `rows` (None: unknown)."""
    if splits is None:
        return None
    if hasattr(splits, "tolist"):
        # Integer arrays only (numpy, torch, TensorFlow dtypes all spell "int"), as
        # Horovod refuses float splits rather than truncating them.
        if "int" not in str(getattr(splits, "dtype", "int")):
            raise CollectiveTypeError("alltoall splits must be integers, got dtype %s"
                                      % splits.dtype)
        splits = splits.tolist()
    splits = tuple([integer(s, "an alltoall split") for s in splits])
    size = process_set.size()
    if len(splits) != size:
        raise CollectiveArgumentError("alltoall splits has %d entries; it needs one per rank "
                                      "of the process set (%d)" % (len(splits), size))
    if min(splits) < 0:
        raise CollectiveArgumentError("alltoall splits must be non-negative, got %s" % (splits,))
    if rows is not None and sum(splits) != rows:
        raise CollectiveArgumentError("alltoall splits sum to %d but the tensor's first "
                                      "dimension is %d" % (sum(splits), rows))
    return splits


def check_rows(op_type, shape, what="tensor"):
    """Ops that split dim 0 (alltoall, reducescatter) need one."""
    if not len(shape):
        raise CollectiveArgumentError("%s needs a %s with at least one dimension"
                                      % (OP_TYPE_NAMES[op_type], what))


def scatter_rows(rows, process_set):
    """Rows of this rank's reducescatter output for an input of `rows` rows: dim 0
    split evenly, the first (rows % size) ranks of the set one more."""
    rank = member_rank(process_set)
    base, extra = divmod(rows, process_set.size())
    return base + (rank < extra)


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
_STRIDE = _lib.REQUEST_SIZE
_RECORD = _lib.REQUEST_STRUCT.format.lstrip("@")
_RECORD_PAD = _STRIDE - _lib.REQUEST_STRUCT.size
_pack_request = _lib.REQUEST_STRUCT.pack_into
_int64_structs = {}
_single_layouts = {}  # (ndim, nsplits, name length) -> struct of a one-request batch


def int64s(count):
    """A cached struct.Struct for `count` int64s (formatting one per call is slow)."""
    packer = _int64_structs.get(count)
    if packer is None:
        packer = _int64_structs[count] = struct.Struct("%dq" % count)
    return packer


# The fields of a perseus_request_t record that the packers compute rather than take
# from the Request attribute of the same name: addresses inside the packed buffer,
# counts, and the anonymous flag (forced for the requests pack() names).
_COMPUTED_FIELDS = {
    "name": "name_at",
    "ndim": "ndim",
    "shape": "shape_at",
    "splits": "splits_at",
    "nsplits": "nsplits",
    "anonymous": "1 if r.name is None else r.anonymous",
}


def _record_arguments():
    """Request `r`'s record as struct arguments, in library.Request's field order (the
    header's, checked by tests/test_header_mirror.py), as source text reading r and
    the packer's locals name_at, ndim, shape_at, splits_at and nsplits: the one place
    that lays a Request onto perseus_request_t."""
    fields = [field for field, _ in _lib.Request._fields_]
    missing = [f for f in fields if f not in _COMPUTED_FIELDS and f not in Request.__slots__]
    if missing:
        raise ImportError("perseus_request_t fields %s are not builder.Request attributes"
                          % missing)
    return ", ".join(_COMPUTED_FIELDS.get(f, "r." + f) for f in fields)


def _compile_packers(source):
    """Defines the functions of `source` in this module with {RECORD} replaced by
    _record_arguments(), as collections.namedtuple compiles its methods: each record
    is then one struct call with its fields in order, as cheap as written out by hand
    (a helper function per record would add a Python call to every request). Their
    lines are registered with linecache, where the traceback module (pytest, logging)
    finds them."""
    source = source.replace("{RECORD}", _record_arguments())
    filename = "<perseus.common.builder packers>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), globals())


# The packers, compiled by _compile_packers() below. A record is packed from r and
# the locals that _COMPUTED_FIELDS names.
_PACKERS = r'''
def pack(requests):
    """Lays a batch out for perseus_enqueue, drawing names for unnamed requests.

    Returns (buf, n): buf is an array.array of bytes holding, 8-byte aligned,
    [n int64 handles_out][n perseus_request_t at byte 8*n][int64 shapes+splits]
    [names]; the records' name/shape/splits pointers point into buf. A front end
    that enqueues later (perseus.mxnet's engine ops) copies buf and moves them.
    """
    if len(requests) != 1:
        return _pack_many(requests)
    # One request, the common case: one struct call, with the layout of
    # [handle][record][shape, splits][name] cached per (ndim, nsplits, name length).
    r = requests[0]
    wire = r.name or unnamed(r.op_type, r.process_set)
    shape = r.shape
    splits = r.splits
    ndim = len(shape)
    nsplits = 0 if splits is None else len(splits)
    key = (ndim, nsplits, len(wire))
    layout = _single_layouts.get(key)
    if layout is None:
        if len(_single_layouts) > 4096:  # bound it against endless distinct names
            _single_layouts.clear()
        layout = _single_layouts[key] = struct.Struct(
            "@q%s%dx%dq%ds" % (_RECORD, _RECORD_PAD, ndim + nsplits, len(wire) + 1))
    buf = array.array("B", bytes(layout.size))
    shape_at = buf.buffer_info()[0] + 8 + _STRIDE
    try:
        if splits is None:
            splits_at = 0
            name_at = shape_at + 8 * ndim
            layout.pack_into(buf, 0, 0, {RECORD}, *shape, wire)
        else:
            splits_at = shape_at + 8 * ndim
            name_at = splits_at + 8 * nsplits
            layout.pack_into(buf, 0, 0, {RECORD}, *shape, *splits, wire)
    except struct.error as e:
        # A field out of its C type's range (e.g. a root rank > 2**31).
        raise ValueError("invalid request field: %s" % e) from None
    return buf, 1


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
        if r.splits is not None:
            ints += r.splits
        wires.append(r.name or unnamed(r.op_type, r.process_set))
    names = b"\0".join(wires) + b"\0"
    req_at = 8 * n
    ints_at = req_at + _STRIDE * n
    chars_at = ints_at + 8 * len(ints)
    buf = array.array("B", bytes(chars_at + len(names)))
    base = buf.buffer_info()[0]
    memoryview(buf)[chars_at:] = names
    try:
        if ints:
            int64s(len(ints)).pack_into(buf, ints_at, *ints)
        rec = req_at
        ip = base + ints_at   # address of this request's shape, then its splits
        name_at = base + chars_at  # address of this request's name
        for r, wire in zip(requests, wires):
            ndim = len(r.shape)
            shape_at = ip
            ip += 8 * ndim
            splits = r.splits
            if splits is None:
                splits_at = nsplits = 0
            else:
                nsplits = len(splits)
                splits_at = ip
                ip += 8 * nsplits
            _pack_request(buf, rec, {RECORD})
            name_at += len(wire) + 1
            rec += _STRIDE
    except struct.error as e:
        # A field out of its C type's range (e.g. a root rank > 2**31).
        raise ValueError("invalid request field: %s" % e) from None
    return buf, n
'''
_compile_packers(_PACKERS)


# Where pack_prebuilt() patches a packed one-request batch: the record's shape,
# input and output pointers (adjacent in perseus_request_t), and its stream.
_ADDRESSES_AT = 8 + _lib.Request.shape.offset
_pack_addresses = struct.Struct("@PPP").pack_into
_STREAM_AT = 8 + _lib.Request.stream.offset
_pack_stream = struct.Struct("@P").pack_into
if not (_lib.Request.input.offset == _lib.Request.shape.offset + 8
        and _lib.Request.output.offset == _lib.Request.input.offset + 8):
    raise ImportError("perseus_request_t: shape, input and output are not adjacent")


class Prebuilt:
    """A named request packed once, for a front end that submits the same request
    again and again with only its buffers changing (an optimizer's in-place allreduce
    of a gradient, every step). Its name and shape stay in the Prebuilt's own
    buffer; pack_prebuilt() copies only the record and fills in the addresses,
    skipping names, struct layouts and checks. Keep the Prebuilt alive until the
    requests packed from it complete. `device` is the request's (ops.CPU_DEVICE or a
    GPU ordinal)."""

    __slots__ = ("_buf", "_record", "_shape_address", "device")

    def __init__(self, request):
        if request.name is None:
            raise ValueError("Prebuilt needs a named request (unnamed ones are numbered "
                             "per call)")
        self._buf, _ = pack([request])
        self._record = self._buf[8:8 + _STRIDE].tobytes()
        self._shape_address = struct.unpack_from("@P", self._buf, _ADDRESSES_AT)[0]
        self.device = request.device


def pack_prebuilt(items):
    """(buf, n) as pack() returns it, for a batch of (Prebuilt, input address, output
    address, stream): one perseus_enqueue for many gradients. stream: the GPU stream
    that produced the input (0 on CPU, or for the legacy default stream)."""
    n = len(items)
    buf = array.array("B", bytes(8 * n))
    buf.frombytes(b"".join([item[0]._record for item in items]))
    at = _ADDRESSES_AT + (n - 1) * 8  # the first record's shape pointer
    stream_at = _STREAM_AT + (n - 1) * 8
    for prebuilt, input, output, stream in items:
        _pack_addresses(buf, at, prebuilt._shape_address, input, output)
        if stream:
            _pack_stream(buf, stream_at, stream)
        at += _STRIDE
        stream_at += _STRIDE
    return buf, n


def reset():
    """Forgets the numbering of unnamed requests; called by init(), so every rank
    restarts its counters together."""
    _counters.clear()
