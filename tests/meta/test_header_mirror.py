"""What Python mirrors of perseus.h matches the header, so any drift fails here.

Parses csrc/include/perseus/perseus.h and checks the enums and defines against
perseus/common/ops.py (dtypes, op types, reduce ops, CPU_DEVICE,
GLOBAL_PROCESS_SET) and perseus/common/exceptions.py (status codes),
perseus_request_t against library.Request (the ctypes mirror) and
builder.Request (every field but the derived counts), and the header's functions
against library's declarations of them.
"""
import ctypes
import os
import re

import pytest

from perseus.common import exceptions, ops

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "csrc", "include", "perseus", "perseus.h")


def _source():
    with open(HEADER) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # comments may hold "=" and ","
    return re.sub(r"//[^\n]*", "", text)


def _enums():
    """typedef name -> {PERSEUS_NAME: value}, in header order."""
    enums = {}
    for body, name in re.findall(r"typedef\s+enum\s*\{(.*?)\}\s*(\w+)\s*;", _source(), re.S):
        values = {}
        for item in body.split(","):
            if item.strip():
                key, value = (part.strip() for part in item.split("="))
                values[key] = int(value, 0)
        enums[name] = values
    return enums


def _defines():
    return {key: int(value) for key, value in
            re.findall(r"#define\s+(PERSEUS_\w+)\s+\(?\s*(-?\d+)\s*\)?\s*$", _source(), re.M)}


def _unprefixed(values):
    return {key[len("PERSEUS_"):]: value for key, value in values.items()}


def test_header_parses():
    enums = _enums()
    assert set(enums) >= {"perseus_status_t", "perseus_dtype_t", "perseus_op_type_t",
                          "perseus_reduce_op_t"}, sorted(enums)
    assert all(enums.values())


def test_status_codes():
    header = _unprefixed(_enums()["perseus_status_t"])
    python = {name: value for name, value in vars(exceptions).items()
              if name.isupper() and isinstance(value, int)}
    assert python == header
    # Every failure has its exception class, so none becomes "unknown status".
    assert set(exceptions._EXCEPTION_FOR_STATUS) == set(header.values()) - {header["SUCCESS"]}


def test_dtypes():
    header = _unprefixed(_enums()["perseus_dtype_t"])
    for name, value in header.items():
        assert getattr(ops, name) == value, name
    count = header.pop("NUM_DTYPES")
    assert sorted(header.values()) == list(range(count))
    assert len(ops.DTYPE_SIZES) == len(ops.DTYPE_NAMES) == count
    for name, value in header.items():
        assert ops.DTYPE_NAMES[value] == name.lower(), name


def test_dtype_sizes():
    # Sizes follow from the names; the header has no table of them.
    bits = {"bool": 8}
    for code, name in enumerate(ops.DTYPE_NAMES):
        width = bits.get(name) or int(re.search(r"\d+$", name).group())
        assert ops.DTYPE_SIZES[code] * 8 == width, name


def test_op_types():
    header = _unprefixed(_enums()["perseus_op_type_t"])
    assert sorted(header.values()) == list(range(len(header)))
    assert len(ops.OP_TYPE_NAMES) == len(header)
    for name, value in header.items():
        assert getattr(ops, name) == value, name
        assert ops.OP_TYPE_NAMES[value] == name.lower(), name


def test_reduce_ops():
    header = _unprefixed(_enums()["perseus_reduce_op_t"])
    assert len(ops.REDUCE_OP_NAMES) == len(header)
    for name, value in header.items():
        # Horovod's spelling (Sum, Average, ...), torch's for the bitwise ones (BAND, ...)
        python_name = name if name.startswith("B") else name.capitalize()
        assert getattr(ops, python_name) == value, name
        assert ops.REDUCE_OP_NAMES[value] == python_name, name
    # Horovod's values (its ReduceOp enum): a script that passes op=0 averages.
    assert (ops.Average, ops.Sum, ops.Adasum, ops.Min, ops.Max, ops.Product) == tuple(range(6))


def test_defines():
    defines = _defines()
    assert ops.CPU_DEVICE == defines["PERSEUS_CPU_DEVICE"]
    assert ops.GLOBAL_PROCESS_SET == defines["PERSEUS_GLOBAL_PROCESS_SET"]
    library = pytest.importorskip("perseus.common.library")  # needs the built core
    assert library.PERSEUS_MAX_DIMS == defines["PERSEUS_MAX_DIMS"]
    assert len(library.COUNTER_NAMES) == defines["PERSEUS_NUM_COUNTERS"]


def test_every_python_constant_is_in_the_header():
    header = {}
    for values in _enums().values():
        header.update(_unprefixed(values))
    header.update(_unprefixed(_defines()))
    constants = {name: value for name, value in vars(ops).items()
                 if name.isupper() and isinstance(value, int)}
    for name, value in constants.items():
        assert header.get(name) == value, name


def _request_fields():
    """perseus_request_t's (C type, field name) pairs, in order."""
    body = re.search(r"typedef\s+struct\s*\{(.*?)\}\s*perseus_request_t\s*;", _source(), re.S)
    fields = []
    for declaration in body.group(1).split(";"):
        declaration = " ".join(declaration.split())
        if declaration:
            ctype, name = re.match(r"(.*?)\s*\b(\w+)$", declaration).groups()
            fields.append((ctype.replace("const ", "").replace(" ", ""), name))
    return fields


def test_request_struct():
    library = pytest.importorskip("perseus.common.library")
    from perseus.common import builder
    fields = _request_fields()
    assert [name for name, _ in library.Request._fields_] == [name for _, name in fields]
    scalar = {"int32_t": ctypes.c_int32, "double": ctypes.c_double}
    for (name, mirror), (ctype, _) in zip(library.Request._fields_, fields):
        if ctype in scalar:
            assert mirror is scalar[ctype], name
        else:
            assert ctype.endswith("*"), name
            assert ctypes.sizeof(mirror) == ctypes.sizeof(ctypes.c_void_p), name
    # builder.Request has every field; ndim and nsplits follow from shape and splits.
    assert set(builder.Request.__slots__) == {name for _, name in fields} - {"ndim", "nsplits"}


def test_every_function_is_declared_in_header_order():
    library = pytest.importorskip("perseus.common.library")
    functions = re.findall(r"\b(perseus_\w+)\s*\(", _source())
    assert functions and list(library._SIGNATURES) == functions
