"""The protobuf wire format, read by hand: what the XSpace (xplane.py) and HloProto (hlo.py) readers decode their
messages with. Why by hand: the protos' Python classes are not shipped with JAX, and the wire format is four cases
(varint, 64-bit, length-delimited, 32-bit), so no dependency is needed."""

from __future__ import annotations

I64 = 1 << 64


def varint(b: bytes, i: int) -> tuple[int, int]:
    """(the varint at byte i of b, the index after it)."""
    result = shift = 0
    while True:
        x = b[i]
        i += 1
        result |= (x & 0x7F) << shift
        if x < 0x80:
            return result, i
        shift += 7


def fields(b: bytes):
    """(field number, wire type, value) of one message: ints for varint / fixed, bytes for length-delimited."""
    i, n = 0, len(b)
    while i < n:
        key, i = varint(b, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            ln, i = varint(b, i)
            v = b[i:i + ln]
            i += ln
        elif wt == 1:
            v = b[i:i + 8]
            i += 8
        elif wt == 5:
            v = b[i:i + 4]
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield field, wt, v


def packed_varints(v, wt: int) -> list[int]:
    """The ints of a repeated varint field's one entry: a single value (wire type 0) or a packed run (type 2)."""
    if wt == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i)
        out.append(x)
    return out


def int64(v: int) -> int:
    """A varint read as a two's-complement int64."""
    return v - I64 if v >= 1 << 63 else v


def map_entry(b: bytes) -> tuple[int, bytes]:
    """(key, value bytes) of a map<int64, message> entry."""
    key, val = 0, b""
    for f, _, v in fields(b):
        if f == 1:
            key = int64(v)
        elif f == 2:
            val = v
    return key, val
