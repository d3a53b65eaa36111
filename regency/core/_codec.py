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

import hashlib
import io
import pickle
import pickletools
import struct
import types
import weakref
from collections.abc import Sequence
from typing import Any

import cloudpickle

_U32 = 4
_MAIN = b"__main__"
_SCAN_LIMIT = 64 * 1024
_OOB_THRESHOLD = 64 * 1024


class _ByValuePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle with protocol 5, out-of-band buffers and content-derived class ids.

    cloudpickle tags every class it sends by value with a *tracker id* so that a receiver
    unpickles each class once and reuses it. Its ids are random (``uuid4``), and it registers
    the sender's own class under that id, so a receiver in the same process (a simulated
    proc) gets the sender's class back and *overwrites its attributes* with the unpickled
    copies. That made the same program pickle differently in its first and later runs
    (different string sharing) and in every process. Here the id is a hash of the class's
    content (:func:`class_id`): equal in every process and every run, never registered for
    the sender's class, so a receiver builds its own copy, as a separate process would.
    """

    def reducer_override(self, obj: Any) -> Any:
        reduced = super().reducer_override(obj)
        if isinstance(obj, type) and type(reduced) is tuple and len(reduced) > 1:
            position = _TRACKER_POSITION.get(reduced[0])
            if position is not None:
                newargs = list(reduced[1])
                newargs[position] = class_id(obj)
                reduced = (reduced[0], tuple(newargs), *reduced[2:])
        return reduced


#: Where the tracker id sits in the arguments of cloudpickle's class skeleton builders.
_TRACKER_POSITION: dict[Any, int] = {
    cloudpickle.cloudpickle._make_skeleton_class: 4,
    cloudpickle.cloudpickle._make_skeleton_enum: 5,
}
_class_ids: weakref.WeakKeyDictionary[type, str] = weakref.WeakKeyDictionary()
_PLACEHOLDER = "0" * 32


class _IdProbePickler(_ByValuePickler):
    """Pickles one class with a placeholder for its own id, to hash its content."""

    def __init__(self, out: io.BytesIO, target: type) -> None:
        super().__init__(out, protocol=5)
        self._target = target

    def reducer_override(self, obj: Any) -> Any:
        if obj is self._target:
            reduced = cloudpickle.Pickler.reducer_override(self, obj)
            position = _TRACKER_POSITION.get(reduced[0]) if type(reduced) is tuple else None
            if position is not None:
                newargs = list(reduced[1])
                newargs[position] = _PLACEHOLDER
                return (reduced[0], tuple(newargs), *reduced[2:])
            return reduced
        return super().reducer_override(obj)


def class_id(cls: type) -> str:
    """The tracker id a by-value class travels under: a hash of its name and its pickled
    content with shared strings spelled out (:func:`canonical`), so it does not depend on
    which equal strings happen to be one object, on the process, or on earlier runs."""
    found = _class_ids.get(cls)
    if found is None:
        out = io.BytesIO()
        _IdProbePickler(out, cls).dump(cls)
        digest = hashlib.sha256(f"{cls.__module__}.{cls.__qualname__}".encode())
        digest.update(canonical(out.getvalue()))
        found = _class_ids[cls] = digest.hexdigest()[:32]
    return found


_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def canonical(data: bytes) -> bytes:
    """``data`` (a pickle) with every memo reference to a string replaced by the string
    itself, then renumbered (:func:`pickletools.optimize`): the same bytes whether or not
    equal strings were one object when it was pickled (interning is not deterministic)."""
    pieces: list[bytes] = []
    memo: list[bytes | None] = []
    last: tuple[str, bytes] | None = None
    ops = list(pickletools.genops(data))
    for number, (op, arg, pos) in enumerate(ops):
        end = ops[number + 1][2] if number + 1 < len(ops) else len(data)
        raw = data[pos:end]
        if op.name == "MEMOIZE":
            memo.append(last[1] if last is not None and last[0] in _STRING_OPS else None)
        elif op.name in _GET_OPS and isinstance(arg, int) and arg < len(memo):
            string = memo[arg]
            if string is not None:
                raw = string
        elif op.name == "FRAME":
            raw = b""
        last = (op.name, raw)
        pieces.append(raw)
    return pickletools.optimize(b"".join(pieces))


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
