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
from collections.abc import Sequence
from typing import Any

import cloudpickle

_U32 = 4
_MAIN = b"__main__"


class _ByValuePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle with protocol 5 and out-of-band buffers."""


def dumps(obj: Any) -> list[bytes | memoryview]:
    """Pickle ``obj``; return the pickle followed by its out-of-band buffers.

    Raises whatever pickling raises (``TypeError``, ``pickle.PicklingError``, ...).
    """
    buffers: list[pickle.PickleBuffer] = []
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except (pickle.PicklingError, AttributeError, TypeError):
        data = None
    # A by-reference pickle naming __main__ would not resolve in another process. A false
    # positive (the data merely contains the string) only costs the slower pickler.
    if data is None or _MAIN in data:
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


def pack(envelope: tuple[Any, ...], payload: Sequence[bytes | memoryview] = ()) -> bytes:
    """Build one frame from an envelope tuple and payload parts (from :func:`dumps`)."""
    env = pickle.dumps((*envelope, [len(p) for p in payload]), protocol=5)
    if not payload:
        return len(env).to_bytes(_U32, "little") + env
    return b"".join((len(env).to_bytes(_U32, "little"), env, *payload))


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
