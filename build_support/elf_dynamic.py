"""The dynamic-linking entries of an ELF shared library: its SONAME and the sonames it
NEEDs, read from the file itself (no readelf needed), for setup.py's MPI check."""
import struct

_DT_NULL, _DT_NEEDED, _DT_SONAME = 0, 1, 14
_SHT_DYNAMIC = 6


class NotElf(ValueError):
    pass


def dynamic_entries(path):
    """{"SONAME": str or None, "NEEDED": [str, ...]} of the ELF file at path."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise NotElf("%s is not an ELF file" % path)
    wide = data[4] == 2  # EI_CLASS: 1 = 32-bit, 2 = 64-bit
    end = "<" if data[5] == 1 else ">"  # EI_DATA: 1 = little-endian
    if wide:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        section, entry = end + "IIQQQQIIQQ", end + "qQ"
    else:
        shoff, = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        section, entry = end + "IIIIIIIIII", end + "iI"
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    found = {"SONAME": None, "NEEDED": []}
    for _, kind, _, _, offset, size, link, _, _, _ in sections:
        if kind != _SHT_DYNAMIC:
            continue
        strings = sections[link][4]  # the string table's file offset

        def string(at):
            return data[strings + at:data.index(b"\0", strings + at)].decode("utf-8", "replace")

        for at in range(offset, offset + size, struct.calcsize(entry)):
            tag, value = struct.unpack_from(entry, data, at)
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                found["NEEDED"].append(string(value))
            elif tag == _DT_SONAME:
                found["SONAME"] = string(value)
    return found
