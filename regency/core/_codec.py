"""Serialisation of payloads and the layout of runtime frames.

Payloads are pickled with protocol 5; buffers that support out-of-band pickling (NumPy
arrays, ``pickle.PickleBuffer``) travel after the pickle without being copied into it.
Classes and functions that cannot be found by name in the receiving process (anything defined
in ``__main__`` or a notebook, lambdas, local functions) go by value through cloudpickle.

A runtime frame is::

    u32 envelope length | envelope (a pickled tuple) | payload pickle | out-of-band buffers

where the envelope's last element lists the byte lengths of the payload parts. Keeping the
payload outside the envelope lets one pickled argument tuple be shared by every destination
of a mesh call, and lets the receiver route a message without unpickling its arguments.
"""

from __future__ import annotations

import io
import pickle
import struct
import types
from collections.abc import Sequence
from typing import Any

import cloudpickle

_U32 = 4
_MAIN = b"__main__"
_SCAN_LIMIT = 64 * 1024
_OOB_THRESHOLD = 64 * 1024


class _ByValuePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle with protocol 5 and out-of-band buffers."""


class _NeedsByValue(Exception):
    pass


class _CheckingPickler(pickle.Pickler):
    """Plain pickle that gives up on anything only findable in ``__main__``.

    ``reducer_override`` is only consulted for objects that are not plain data, so payloads
    of bytes, numbers and containers pay nothing for the check.
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            raise _NeedsByValue
        return NotImplemented


class _OutOfBand:
    """Wraps a large bytes-like argument so it travels after the pickle, not inside it, and
    arrives as ``bytes`` (one copy out of the receive buffer instead of three)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (type(self.data), (pickle.PickleBuffer(self.data),))


def out_of_band(value: Any) -> Any:
    """``value``, wrapped for out-of-band transfer when it is a large bytes or bytearray."""
    if type(value) in (bytes, bytearray) and len(value) >= _OOB_THRESHOLD:
        return _OutOfBand(value)
    return value


def dumps(obj: Any) -> list[bytes | memoryview]:
    """Pickle ``obj``; return the pickle followed by its out-of-band buffers.

    Raises whatever pickling raises (``TypeError``, ``pickle.PicklingError``, ...).
    """
    buffers: list[pickle.PickleBuffer] = []
    data: bytes | None
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except (pickle.PicklingError, AttributeError, TypeError):
        data = None
    # A by-reference pickle naming __main__ would not resolve in another process. Small
    # pickles are searched for the name (a false positive only costs the slower pickler);
    # large ones are re-checked precisely, since a substring search would cost more.
    if data is not None and data.find(_MAIN, 0, _SCAN_LIMIT) >= 0:
        data = None
    elif data is not None and len(data) > _SCAN_LIMIT:
        try:
            out = io.BytesIO()
            buffers = []
            _CheckingPickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
            data = out.getvalue()
        except _NeedsByValue:
            data = None
    if data is None:
        buffers = []
        out = io.BytesIO()
        _ByValuePickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
        data = out.getvalue()
    if not buffers:
        return [data]
    return [data, *(b.raw() for b in buffers)]


def loads(parts: Sequence[bytes | memoryview]) -> Any:
    """Inverse of :func:`dumps`."""
    if len(parts) == 1:
        return pickle.loads(parts[0])
    return pickle.loads(parts[0], buffers=parts[1:])


def loads_for(parts: Sequence[bytes | memoryview], what: str) -> Any:
    """:func:`loads`, where anything unpickling raises (``SystemExit`` and other
    ``BaseException`` included: a value's ``__reduce__`` runs arbitrary code) becomes a
    ``DecodeError`` naming ``what`` was being decoded. ``KeyboardInterrupt`` passes."""
    try:
        return loads(parts)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        from ._errors import DecodeError

        raise DecodeError(
            f"cannot unpickle {what}: unpickling raised {type(exc).__name__}: {exc}"
        ) from exc


def pack(
    envelope: tuple[Any, ...], payload: Sequence[bytes | memoryview] = ()
) -> bytes | list[bytes | memoryview]:
    """Build one frame from an envelope tuple and payload parts (from :func:`dumps`).

    Small frames come back joined; large ones as a list of parts, which a transport sends
    without copying them together (see :data:`regency.transports.Frame`).
    """
    lengths = [len(p) for p in payload]
    env = pickle.dumps((*envelope, lengths), protocol=5)
    if not payload:
        return len(env).to_bytes(_U32, "little") + env
    if sum(lengths) >= _SCAN_LIMIT:
        return [len(env).to_bytes(_U32, "little") + env, *payload]
    return b"".join((len(env).to_bytes(_U32, "little"), env, *payload))


#: Replies (PORT frames) are most of the traffic back to a caller, so they skip the pickled
#: envelope: ``u32 0xFFFFFFFF | u64 port_id | u32 index | u8 status | payload pickle``.
#: A pickled envelope can never be that long, so the marker is unambiguous.
_PORT_HEAD = struct.Struct("<IQIB")
_PORT_MARK = 0xFFFFFFFF
PORT_MARK_BYTES = _PORT_MARK.to_bytes(4, "little")


def pack_port(
    port_id: int, index: int, status: int, payload: Sequence[bytes | memoryview]
) -> bytes | list[bytes | memoryview] | None:
    """A compact reply frame, or None when the payload has out-of-band parts."""
    if len(payload) != 1:
        return None
    head = _PORT_HEAD.pack(_PORT_MARK, port_id, index, status)
    body = payload[0]
    if len(body) >= _SCAN_LIMIT:
        return [head, body]
    return head + body


def unpack_port(frame: memoryview) -> tuple[int, int, int, list[memoryview]]:
    """(port_id, index, status, [payload]) of a compact reply frame."""
    if len(frame) < _PORT_HEAD.size:
        raise ValueError(f"reply frame of {len(frame)} bytes is too short")
    _, port_id, index, status = _PORT_HEAD.unpack_from(frame)
    return port_id, index, status, [frame[_PORT_HEAD.size :]]


# Session control frames (regency.core._runtime.Outbox): a marker the other layouts never
# start with, then the fields.
SESSION_MARK = _SESSION_MARK = (0xFFFFFFFE).to_bytes(4, "little")
_ACK_MARK = (0xFFFFFFFD).to_bytes(4, "little")
_U64 = struct.Struct("<Q")


def pack_session(session: str, first: int) -> bytes:
    return _SESSION_MARK + _U64.pack(first) + session.encode()


def unpack_session(frame: memoryview) -> tuple[str, int] | None:
    if frame[:4] != _SESSION_MARK:
        return None
    (first,) = _U64.unpack_from(frame, 4)
    return bytes(frame[12:]).decode(), first


def pack_ack(count: int) -> bytes:
    return _ACK_MARK + _U64.pack(count)


def unpack_ack(frame: memoryview) -> int | None:
    if frame[:4] != _ACK_MARK or len(frame) != 12:
        return None
    count: int = _U64.unpack_from(frame, 4)[0]
    return count


def unpack(frame: memoryview) -> tuple[tuple[Any, ...], list[memoryview]]:
    """Split a frame into its envelope (without the length list) and payload part views.

    The views alias ``frame``: unpickle or copy them before the frame goes away.
    Raises ``ValueError`` when the frame is malformed.
    """
    if len(frame) < _U32:
        raise ValueError(f"frame of {len(frame)} bytes is too short for a header")
    env_len = int.from_bytes(frame[:_U32], "little")
    if env_len > len(frame) - _U32:
        raise ValueError(f"frame envelope length {env_len} exceeds the frame ({len(frame)} bytes)")
    envelope = pickle.loads(frame[_U32 : _U32 + env_len])
    if type(envelope) is not tuple or not envelope or type(envelope[-1]) is not list:
        raise ValueError("frame envelope is not a Regency envelope")
    offset = _U32 + env_len
    sizes = envelope[-1]
    if len(sizes) == 1 and type(sizes[0]) is int and offset + sizes[0] == len(frame):
        return envelope[:-1], [frame[offset:]]  # the common case: one payload part
    parts: list[memoryview] = []
    for size in sizes:
        if type(size) is not int or size < 0 or offset + size > len(frame):
            raise ValueError("frame payload lengths do not match the frame")
        parts.append(frame[offset : offset + size])
        offset += size
    if offset != len(frame):
        raise ValueError(f"frame has {len(frame) - offset} trailing bytes")
    return envelope[:-1], parts
