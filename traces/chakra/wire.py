"""A small protobuf wire-format codec (varints, length-delimited fields) driven by schema tables.

Only what Chakra's ``et_def.proto`` needs: wire types 0 (varint), 1 (64-bit), 2 (length-delimited) and
5 (32-bit); packed and unpacked repeated scalars; nested messages. A message decodes to a plain dict; fields
not in the schema are kept under ``"_unknown"`` as field numbers (reported by the reader, never dropped
silently). Malformed bytes raise ``WireError`` with the byte offset.
Reference: https://protobuf.dev/programming-guides/encoding/
"""
from __future__ import annotations

import struct

from simulator.errors import TraceError

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# scalar type -> wire type
_WIRE = {
    "uint64": VARINT, "uint32": VARINT, "int64": VARINT, "int32": VARINT, "sint32": VARINT, "sint64": VARINT,
    "bool": VARINT, "enum": VARINT, "double": I64, "fixed64": I64, "sfixed64": I64,
    "float": I32, "fixed32": I32, "sfixed32": I32, "string": LEN, "bytes": LEN,
}
ONEOF_MESSAGES = {"AttributeProto"}     # messages whose scalar fields form a oneof (presence matters)
_STRUCT = {"double": "<d", "fixed64": "<Q", "sfixed64": "<q", "float": "<f", "fixed32": "<I", "sfixed32": "<i"}


class WireError(TraceError):
    """Bytes that are not a valid protobuf message of the expected schema."""


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, new position) of the varint at ``pos``; at most 10 bytes."""
    if pos < len(buf) and buf[pos] < 0x80:      # fast path: one byte
        return buf[pos], pos + 1
    result = shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise WireError(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"varint longer than 10 bytes at byte {pos}")


def write_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # two's complement, as protobuf encodes negative int32/int64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _from_varint(kind: str, v: int):
    if kind in ("int64", "int32"):
        v &= (1 << 64) - 1
        if v >= 1 << 63:
            v -= 1 << 64
        return v
    if kind in ("sint32", "sint64"):
        return (v >> 1) ^ -(v & 1)
    if kind == "bool":
        return v != 0
    if kind == "uint32":
        return v & 0xFFFFFFFF
    return v


def _to_varint(kind: str, v) -> int:
    if kind in ("sint32", "sint64"):
        return (v << 1) ^ (v >> 63)
    if kind == "bool":
        return 1 if v else 0
    return int(v)


def decode(buf: bytes, schema: dict, name: str, start: int = 0, end: int | None = None,
           skip: frozenset = frozenset()) -> dict:
    """Decode message ``name`` of ``schema`` from ``buf[start:end]`` into a dict. Fields named in ``skip``
    are framed (so corruption is still caught) but not decoded; they map to None."""
    fields = schema[name]
    end = len(buf) if end is None else end
    out: dict = {}
    pos = start
    while pos < end:
        key, pos = read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise WireError(f"field number 0 at byte {pos} in {name}")
        spec = fields.get(num)
        if wt == VARINT:
            v, pos = read_varint(buf, pos)
            raw = ("varint", v)
        elif wt == I64:
            if pos + 8 > end:
                raise WireError(f"truncated 64-bit field {num} of {name} at byte {pos}")
            raw = ("i64", buf[pos:pos + 8])
            pos += 8
        elif wt == I32:
            if pos + 4 > end:
                raise WireError(f"truncated 32-bit field {num} of {name} at byte {pos}")
            raw = ("i32", buf[pos:pos + 4])
            pos += 4
        elif wt == LEN:
            n, pos = read_varint(buf, pos)
            if pos + n > end:
                raise WireError(f"field {num} of {name} claims {n} bytes at byte {pos} but only {end - pos} remain")
            raw = ("len", pos, pos + n)
            pos += n
        else:
            raise WireError(f"unsupported wire type {wt} (field {num} of {name}) at byte {pos}")
        if spec is None:
            out.setdefault("_unknown", []).append(num)
            continue
        fname, kind, repeated = spec
        if fname in skip:
            out[fname] = None
            continue
        values = _values(buf, schema, kind, raw, fname, name)
        if repeated:
            out.setdefault(fname, []).extend(values)
        elif values:
            if kind in schema and fname in out:   # a repeated singular message merges (protobuf rule)
                out[fname].update(values[-1])
            else:
                out[fname] = values[-1]
    return out


def _values(buf, schema, kind, raw, fname, mname) -> list:
    tag = raw[0]
    if kind in schema:
        if tag != "len":
            raise WireError(f"field {fname} of {mname} should be a message")
        return [decode(buf, schema, kind, raw[1], raw[2])]
    wt = _WIRE[kind]
    if tag == "len" and wt != LEN:            # packed repeated scalars
        vals, p, e = [], raw[1], raw[2]
        while p < e:
            if wt == VARINT:
                v, p = read_varint(buf, p)
                vals.append(_from_varint(kind, v))
            else:
                size = 8 if wt == I64 else 4
                if p + size > e:
                    raise WireError(f"truncated packed field {fname} of {mname}")
                vals.append(struct.unpack(_STRUCT[kind], buf[p:p + size])[0])
                p += size
        return vals
    if tag == "len":
        data = bytes(buf[raw[1]:raw[2]])
        if kind == "string":
            try:
                return [data.decode("utf-8")]
            except UnicodeDecodeError:
                raise WireError(f"field {fname} of {mname} is not valid UTF-8") from None
        return [data]
    expected = {"varint": VARINT, "i64": I64, "i32": I32}[tag]
    if expected != wt:
        raise WireError(f"field {fname} of {mname} has wire type {expected}, expected {wt}")
    if tag == "varint":
        return [_from_varint(kind, raw[1])]
    return [struct.unpack(_STRUCT[kind], raw[1])[0]]


def encode(msg: dict, schema: dict, name: str) -> bytes:
    """Encode dict ``msg`` as message ``name`` (proto3: default scalars omitted, repeated scalars packed)."""
    out = bytearray()
    index = _by_name(schema, name)
    for fname in sorted(msg, key=lambda f: index[f][0] if f in index else -1):
        spec = index.get(fname)
        val = msg[fname]
        if spec is None or val is None:
            continue
        num, kind, repeated = spec
        if kind in schema:
            for v in (val if repeated else [val]):
                body = encode(v, schema, kind)
                out += write_varint(num << 3 | LEN) + write_varint(len(body)) + body
            continue
        wt = _WIRE[kind]
        if repeated and wt != LEN:
            if not val:
                continue
            body = b"".join(_scalar(kind, v) for v in val)
            out += write_varint(num << 3 | LEN) + write_varint(len(body)) + body
            continue
        for v in (val if repeated else [val]):
            if not repeated and not v and name not in ONEOF_MESSAGES:
                continue            # proto3 omits defaults, except a set oneof member
            out += write_varint(num << 3 | wt)
            if wt == LEN:
                data = v.encode("utf-8") if kind == "string" else bytes(v)
                out += write_varint(len(data)) + data
            else:
                out += _scalar(kind, v)
    return bytes(out)


_INDEX: dict = {}


def _by_name(schema: dict, name: str) -> dict:
    """field name -> (number, type, repeated) of message ``name`` (cached per schema)."""
    key = (id(schema), name)
    idx = _INDEX.get(key)
    if idx is None:
        idx = _INDEX[key] = {f: (num, k, rep) for num, (f, k, rep) in schema[name].items()}
    return idx


def _scalar(kind: str, v) -> bytes:
    if kind in _STRUCT:
        return struct.pack(_STRUCT[kind], v)
    return write_varint(_to_varint(kind, v))


def iter_delimited(buf: bytes):
    """Yield (start, end) of each varint-length-prefixed message in ``buf``."""
    pos, end = 0, len(buf)
    while pos < end:
        n, p = read_varint(buf, pos)
        if p + n > end:
            raise WireError(f"message at byte {pos} claims {n} bytes but the file ends after {end - p}")
        yield p, p + n
        pos = p + n


def delimited(body: bytes) -> bytes:
    return write_varint(len(body)) + body
