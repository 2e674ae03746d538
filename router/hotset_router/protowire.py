"""The little of the protobuf wire format the router reads and writes itself.

The router passes inference messages on as bytes (grpc_upstream.py); of a
request it needs only the model's name and version, fields 1 and 2 of
ModelInferRequest, ModelReadyRequest and ModelMetadataRequest alike, and it
answers the server-level calls (live, ready, metadata) with messages of one
to three fields. Reading the two strings from the wire skips every other
field by its length, so a 64 MiB tensor costs no copy and no decode, and the
router needs no protobuf runtime or generated stubs (it installs light).
"""
from __future__ import annotations

from hotset_common import errors

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if offset >= len(data) or shift > 63:
            raise errors.BadInput("the request is not a valid protobuf message (a varint runs past its end)")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7


def _fields(data: bytes):
    """(number, wire type, value) of each top-level field: an int for varints, a memoryview slice
    for length-delimited fields, None for fixed ones (skipped); 400 for bytes that are not a message."""
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        key, offset = _varint(data, offset)
        number, kind = key >> 3, key & 7
        if kind == VARINT:
            value, offset = _varint(data, offset)
            yield number, kind, value
        elif kind in (FIXED64, FIXED32):
            offset += 8 if kind == FIXED64 else 4
            yield number, kind, None
        elif kind == LENGTH:
            length, offset = _varint(data, offset)
            if offset + length > len(data):
                raise errors.BadInput("the request is not a valid protobuf message (a field runs past its end)")
            yield number, kind, view[offset:offset + length]
            offset += length
        else:
            raise errors.BadInput(f"the request is not a valid protobuf message (wire type {kind})")
        if offset > len(data):
            raise errors.BadInput("the request is not a valid protobuf message (a field runs past its end)")


def strings(data: bytes, numbers: tuple[int, ...]) -> dict[int, str]:
    """The string fields `numbers` of a top-level message (the last occurrence wins, as in protobuf);
    400 for bytes that are not a protobuf message or a field that is not UTF-8."""
    found: dict[int, str] = {}
    for number, kind, value in _fields(data):
        if kind == LENGTH and number in numbers:
            try:
                found[number] = bytes(value).decode()
            except UnicodeDecodeError:
                raise errors.BadInput(f"field {number} of the request is not UTF-8 text") from None
    return found


def flag(data: bytes, number: int) -> bool:
    """The bool field `number` of a top-level message (false when absent, as in protobuf)."""
    found = False
    for field, kind, value in _fields(data):
        if field == number and kind == VARINT:
            found = bool(value)
    return found


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def boolean(number: int, value: bool) -> bytes:
    """One bool field (nothing for false, protobuf's default)."""
    return _encode_varint(number << 3 | VARINT) + b"\x01" if value else b""


def string(number: int, value: str) -> bytes:
    """One string field (nothing for the empty string, protobuf's default)."""
    raw = value.encode()
    return _encode_varint(number << 3 | LENGTH) + _encode_varint(len(raw)) + raw if raw else b""


def message(number: int, raw: bytes) -> bytes:
    """One embedded message field (`raw`: the message's bytes), present even when empty."""
    return _encode_varint(number << 3 | LENGTH) + _encode_varint(len(raw)) + raw
