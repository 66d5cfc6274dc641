"""builder's packers against the ctypes mirror of perseus_request_t.

builder.pack() and builder.pack_prebuilt() write records with struct, their fields
written out in library.Request's order; here each packed record is read back through
library.Request (the layout test_header_mirror.py checks against the header) and
every field compared with what the Request asked for, so a field packed into
another's place, a wrong address or a lost flag fails. Needs the built core (for
library), not MPI.
"""
import ctypes

import pytest

library = pytest.importorskip("perseus.common.library")
from perseus.common import builder, ops  # noqa: E402  (after the skip)


def _request(name=b"allreduce.packed", shape=(4, 3), splits=None, **fields):
    """A Request whose fields all differ from their defaults and from one another."""
    values = dict(op_type=ops.ALLTOALL, process_set=7, dtype=ops.FLOAT64, shape=shape,
                  input=0x1000, output=0x2000, name=name, reduce_op=ops.Max, prescale=0.25,
                  postscale=4.0, root_rank=5, splits=splits, device=2, stream=0x3000,
                  anonymous=0, group_size=11)
    values.update(fields)
    return builder.Request(**values)


def _records(buf, n):
    """The n records of a packed batch, and its handle slots."""
    handles = [ctypes.c_int64.from_buffer(buf, 8 * i).value for i in range(n)]
    return [library.Request.from_buffer(buf, 8 * n + library.REQUEST_SIZE * i)
            for i in range(n)], handles


def _ints(pointer, count):
    return [pointer[i] for i in range(count)] if count else []


def _assert_record(record, request, wire, anonymous):
    assert record.name == wire
    assert record.op_type == request.op_type
    assert record.reduce_op == request.reduce_op
    assert record.dtype == request.dtype
    assert record.device == request.device
    assert record.ndim == len(request.shape)
    assert _ints(record.shape, record.ndim) == list(request.shape)
    assert (record.input or 0) == request.input
    assert (record.output or 0) == request.output
    assert record.prescale == request.prescale
    assert record.postscale == request.postscale
    assert record.root_rank == request.root_rank
    assert record.process_set == request.process_set
    if request.splits is None:
        assert not record.splits and record.nsplits == 0
    else:
        assert record.nsplits == len(request.splits)
        assert _ints(record.splits, record.nsplits) == list(request.splits)
    assert record.anonymous == anonymous
    assert (record.stream or 0) == request.stream
    assert record.group_size == request.group_size


@pytest.mark.parametrize("splits", [None, (1, 0, 3)])
def test_one_request(splits):
    request = _request(splits=splits)
    buf, n = builder.pack([request])
    assert n == 1
    (record,), handles = _records(buf, 1)
    assert handles == [0]
    _assert_record(record, request, b"allreduce.packed", anonymous=0)


def test_unnamed_request_is_numbered_and_anonymous():
    builder.reset()
    request = _request(name=None, op_type=ops.ALLREDUCE, process_set=0)
    buf, _ = builder.pack([request])
    (record,), _ = _records(buf, 1)
    _assert_record(record, request, b"allreduce.noname.0", anonymous=1)


def test_many_requests():
    requests = [_request(b"allreduce.a", (2, 5), None),
                _request(b"alltoall.bb", (6,), (2, 4), anonymous=1, root_rank=1),
                _request(None, (), None, op_type=ops.BROADCAST, process_set=3, prescale=1.0),
                _request(b"allreduce.dddd", (1, 2, 3), (3,), input=0, output=0, stream=0)]
    builder.reset()
    buf, n = builder.pack(requests)
    assert n == len(requests)
    records, handles = _records(buf, n)
    assert handles == [0] * n
    wires = [b"allreduce.a", b"alltoall.bb", b"broadcast.set3.noname.0", b"allreduce.dddd"]
    for record, request, wire in zip(records, requests, wires):
        _assert_record(record, request, wire, anonymous=1 if request.name is None
                       else request.anonymous)


def test_prebuilt_requests():
    """Requests kept from a packed batch (builder.Prebuilt), packed again with other
    addresses and streams: every other field as first packed, the stream of the
    first packing not kept (a stream of 0 stays 0)."""
    requests = [_request(b"allreduce.p%d" % i, (i + 1, 2), (i, 1) if i == 1 else None)
                for i in range(3)]
    first, n = builder.pack(requests)
    prebuilts = [builder.Prebuilt(first, n, i) for i in range(n)]
    assert [p.device for p in prebuilts] == [r.device for r in requests]
    addresses = [(0x10000 * (i + 1), 0x10000 * (i + 1) + 8, 0x7000 + i if i else 0)
                 for i in range(3)]
    buf, n = builder.pack_prebuilt([(p, *a) for p, a in zip(prebuilts, addresses)])
    assert n == 3
    records, handles = _records(buf, n)
    assert handles == [0] * n
    for record, request, (input, output, stream) in zip(records, requests, addresses):
        request.input, request.output, request.stream = input, output, stream
        _assert_record(record, request, request.name, anonymous=0)


def test_out_of_range_field_is_a_value_error():
    for requests in ([_request(root_rank=2 ** 31)], [_request(), _request(root_rank=2 ** 31)]):
        with pytest.raises(ValueError, match="invalid request field"):
            builder.pack(requests)
