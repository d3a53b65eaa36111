"""Serialisation of payloads and the layout of runtime frames: the only module that knows
how a :mod:`regency.core._messages` record looks on the wire (:func:`encode`,
:func:`decode`).

Payloads are pickled with protocol 5. Large ``bytes`` and ``bytearray`` arguments and
replies, NumPy arrays and CPU tensors (anywhere in a payload) travel out of band: after the
pickle, as the sender's own memory, without being copied into it; the receiver copies each once
out of its receive buffer, which the transport reuses, into memory the value owns. Buffers
that other libraries hand out of band are pickled in band: their rebuilders may keep the
buffer they are given, which here would alias the receive buffer.
Classes and functions that cannot be found by name in the receiving process (anything defined
in ``__main__`` or a notebook, lambdas, local functions) go by value through cloudpickle.

A runtime frame is::

    u32 envelope length | envelope (a pickled tuple) | payload pickle | out-of-band buffers

where the envelope is ``(kind, fields..., [payload part lengths])``. Keeping the payload
outside the envelope lets one pickled argument tuple be shared by every destination of a mesh
call, and turns an unpicklable argument at the receiver into an error for that one message.
Four kinds have fixed binary layouts instead, marked by a first u32 no envelope length can
take: calls and replies with a one-part payload (nearly all the traffic of a round trip), and
the delivery session's SESSION and ACK. A compact call carries its route (actor, method, reply
address, labels, sizes: the same for every call of an endpoint from one caller) as a small
pickle of its own that both sides cache, so a call pickles and unpickles no envelope.
"""

from __future__ import annotations

import copyreg
import ctypes
import hashlib
import io
import math
import pickle
import pickletools
import struct
import sys
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any, assert_never

import attrs
import cloudpickle

from . import _messages as M
from ._messages import (
    Ack,
    Attach,
    Call,
    Cast,
    Detach,
    Exited,
    Failed,
    Heartbeat,
    Hello,
    Kill,
    Lapsed,
    Launch,
    Lease,
    Pickled,
    Refused,
    Reply,
    Reserve,
    Session,
    Spawn,
    StopActor,
    StopProc,
    Undecodable,
)

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
        bulk = bulk_reducer(obj)
        if bulk is not None:
            return bulk(obj)
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


class _Thread:
    """One thread's pickling state: which buffers go out of band, and a pickler reused from
    one dump to the next (making one costs more than pickling a small payload).

    :meth:`take` is the pickler's ``buffer_callback``: out of band (False) only for the
    buffers our own reducers made (see the module's docstring). A dump's buffers are the
    ones :attr:`parts` gained during it (a reducer may pickle with :func:`dumps` while a dump
    runs: its parts come and go above the outer dump's)."""

    __slots__ = ("depth", "ours", "out", "parts", "pickler", "storages", "table")

    def __init__(self) -> None:
        #: Dumps in progress on this thread (nested: a reducer calling dumps).
        self.depth = 0
        #: The PickleBuffers our reducers made, by id (kept alive, so no id is reused) until
        #: the outermost dump ends.
        self.ours: dict[int, pickle.PickleBuffer] = {}
        #: The buffers sent out of band, in the pickle's order.
        self.parts: list[pickle.PickleBuffer] = []
        #: One wrapper per torch storage (by address), so that tensors sharing a storage
        #: share it on arrival, as with torch's own pickling.
        self.storages: dict[int, _TorchStorage | _CudaStorage] = {}
        self.out = io.BytesIO()
        self.pickler: _BulkPickler | None = None
        self.table: dict[type, Any] | None = None

    def take(self, buffer: pickle.PickleBuffer) -> bool:
        if id(buffer) in self.ours:
            self.parts.append(buffer)
            return False
        return True


_local = threading.local()


def _thread() -> _Thread:
    try:
        state: _Thread = _local.state
    except AttributeError:
        state = _local.state = _Thread()
    return state


def _ours(data: Any) -> pickle.PickleBuffer:
    """A PickleBuffer over ``data`` that the current :func:`dumps` sends out of band."""
    buffer = pickle.PickleBuffer(data)
    state = _thread()
    if state.depth:
        state.ours[id(buffer)] = buffer
    return buffer


class _OutOfBand:
    """Wraps a large bytes-like argument so it travels after the pickle, not inside it, and
    arrives as ``bytes`` (one copy out of the receive buffer instead of three)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (type(self.data), (_ours(self.data),))


def out_of_band(value: Any) -> Any:
    """``value``, wrapped for out-of-band transfer when it is a large bytes or bytearray."""
    if type(value) in (bytes, bytearray) and len(value) >= _OOB_THRESHOLD:
        return _OutOfBand(value)
    return value


def _reduce_ndarray(array: Any) -> Any:
    """NumPy arrays of plain data go out of band (any size: the frame joins small parts)."""
    if array.dtype.hasobject or not (array.flags.c_contiguous or array.flags.f_contiguous):
        return array.__reduce_ex__(5)  # numpy's own (its buffers stay in band)
    order = "C" if array.flags.c_contiguous else "F"
    return (_rebuild_ndarray, (_ours(array), array.dtype, array.shape, order))


def _rebuild_ndarray(buffer: Any, dtype: Any, shape: tuple[int, ...], order: str) -> Any:
    import numpy

    flat: Any = numpy.frombuffer(buffer, dtype=dtype)
    return flat.reshape(shape, order=order).copy(order=order)  # owned: the buffer is reused


class _TorchStorage:
    """A CPU tensor's storage, sent out of band once per dump however many tensors view it."""

    __slots__ = ("storage",)

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: Any) -> Any:
        # The storage's bytes as a buffer without a torch op (a dispatch mode, such as the
        # tensor engine's, may be active); the buffer keeps the storage alive for as long as
        # the frame holds it.
        size = self.storage.nbytes()
        raw = (ctypes.c_ubyte * size).from_address(self.storage.data_ptr())
        raw.keep = self.storage
        return (_rebuild_storage, (_ours(raw),))


class _CudaStorage:
    """A CUDA tensor's storage: copied to host memory and sent out of band once per dump,
    rebuilt on the same device index by the receiver (torch's own pickling would put the
    bytes inside the pickle through ``torch.save``: about 10x slower)."""

    __slots__ = ("storage",)

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # a dispatch mode (the tensor engine's) may be active
            host = self.storage.cpu()
        raw = (ctypes.c_ubyte * host.nbytes()).from_address(host.data_ptr())
        raw.keep = host
        return (_rebuild_cuda_storage, (_ours(raw), self.storage.device.index or 0))


def _rebuild_cuda_storage(buffer: Any, index: int) -> Any:
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"a CUDA tensor (of cuda:{index}) arrived in a process that sees no CUDA device; "
            "send t.cpu() instead"
        )
    with _disable_current_modes():
        # One host-to-device copy straight out of the transport's buffer (synchronous, so
        # the buffer may be reused afterwards); a read-only buffer is copied first (torch
        # wraps only writable memory without a warning).
        if memoryview(buffer).readonly:
            host = torch.UntypedStorage.from_buffer(buffer, byte_order="native", dtype=torch.uint8)
            return host.cuda(index)
        return torch.frombuffer(buffer, dtype=torch.uint8).to(f"cuda:{index}").untyped_storage()


def _reduce_tensor(tensor: Any) -> Any:
    """Plain CPU and CUDA tensors (not requiring grad) go out of band, their storage shared
    between the tensors of one payload that view it (a CUDA storage through a host copy,
    rebuilt on the same device index); anything else pickles as torch pickles it."""
    state = _thread()
    device = tensor.device.type
    if (
        not state.depth
        or tensor.requires_grad
        or (device != "cpu" and device != "cuda")
        or tensor.layout is not sys.modules["torch"].strided
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
        or tensor.__dict__  # attributes set on it: torch's pickling keeps them
    ):
        return tensor.__reduce_ex__(5)
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return tensor.__reduce_ex__(5)
    key = storage.data_ptr()
    wrapper = state.storages.get(key)
    if wrapper is None or wrapper.storage.nbytes() != storage.nbytes():
        kind = _TorchStorage if device == "cpu" else _CudaStorage
        wrapper = state.storages[key] = kind(storage)
    return (
        _rebuild_tensor,
        (wrapper, tensor.dtype, tensor.storage_offset(), tuple(tensor.shape), tensor.stride()),
    )


def _rebuild_storage(buffer: Any) -> Any:
    import torch

    # A copy: the storage owns its memory (the buffer is the transport's, reused).
    return torch.UntypedStorage.from_buffer(buffer, byte_order="native", dtype=torch.uint8)


def _rebuild_tensor(
    storage: Any, dtype: Any, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]
) -> Any:
    import collections

    import torch
    import torch._utils

    # What torch's own unpickling does with a storage (no factory op either).
    typed = torch.storage.TypedStorage(  # type: ignore[no-untyped-call]
        wrap_storage=storage, dtype=dtype, _internal=True
    )
    return torch._utils._rebuild_tensor_v2(  # type: ignore[no-untyped-call]
        typed, offset, shape, stride, False, collections.OrderedDict()
    )


#: (numpy imported, torch imported, copyreg's size) -> (our reducers, the dispatch table).
_bulk_tables: dict[tuple[bool, bool, int], tuple[dict[type, Any], dict[type, Any]]] = {}


def bulk_reducer(obj: Any) -> Any:
    """The reducer for ``obj`` when it is of a bulk type (None otherwise): for picklers
    that cannot take a dispatch table (cloudpickle's has its own)."""
    own, _ = _bulk_table()
    return None if own is None else own.get(type(obj))


def _bulk_table() -> tuple[dict[type, Any], dict[type, Any]] | tuple[None, None]:
    """Our reducers for the bulk types of the modules imported so far, and a pickler's
    dispatch table with them and copyreg's (a plain dict: a ChainMap made small dumps 4x
    slower); (None, None) when neither numpy nor torch is imported, so no value can be one."""
    numpy, torch = "numpy" in sys.modules, "torch" in sys.modules
    if not (numpy or torch):
        return None, None
    key = (numpy, torch, len(copyreg.dispatch_table))
    found = _bulk_tables.get(key)
    if found is None:
        own: dict[type, Any] = {}
        if numpy:
            own[sys.modules["numpy"].ndarray] = _reduce_ndarray
        if torch:
            own[sys.modules["torch"].Tensor] = _reduce_tensor
        found = _bulk_tables[key] = (own, {**copyreg.dispatch_table, **own})
    return found


class _BulkPickler(pickle.Pickler):
    """Plain pickle with the bulk types' reducers (see :func:`_bulk_table`)."""


#: Values whose pickle cannot hold a buffer or a reference to ``__main__``.
_PLAIN = frozenset({type(None), bool, int, float, str})
_NONE_PICKLE = pickle.dumps(None, protocol=5)


def dumps(obj: Any) -> list[bytes | memoryview]:
    """Pickle ``obj``; return the pickle followed by its out-of-band buffers.

    Raises whatever pickling raises (``TypeError``, ``pickle.PicklingError``, ...).
    """
    if type(obj) in _PLAIN:
        return [pickle.dumps(obj, protocol=5)]
    state = _thread()
    mark = len(state.parts)
    state.depth += 1
    try:
        data = _dumps(obj, state, mark)
        if len(state.parts) == mark:
            return [data]
        return [data, *(b.raw() for b in state.parts[mark:])]
    finally:
        if len(state.parts) != mark:
            del state.parts[mark:]
        state.depth -= 1
        if not state.depth and (state.ours or state.storages):
            state.ours.clear()  # keep no reference to the values sent
            state.storages.clear()


def _dumps(obj: Any, state: _Thread, mark: int) -> bytes:
    modules = sys.modules
    table = None if "torch" not in modules and "numpy" not in modules else _bulk_table()[1]
    data: bytes | None
    try:
        if table is None:
            data = pickle.dumps(obj, protocol=5, buffer_callback=state.take)
        elif state.depth > 1:  # a reducer pickling during a dump: the pickler is in use
            out = io.BytesIO()
            pickler = _BulkPickler(out, protocol=5, buffer_callback=state.take)
            pickler.dispatch_table = table
            pickler.dump(obj)
            data = out.getvalue()
        else:
            if state.pickler is None or state.table is not table:
                state.pickler = _BulkPickler(state.out, protocol=5, buffer_callback=state.take)
                state.pickler.dispatch_table = table
                state.table = table
            try:
                state.pickler.dump(obj)
                data = state.out.getvalue()
            finally:
                state.pickler.clear_memo()
                state.out.seek(0)
                state.out.truncate()
    except (pickle.PicklingError, AttributeError, TypeError):
        data = None
    # A by-reference pickle naming __main__ would not resolve in another process. Small
    # pickles are searched for the name (a false positive only costs the slower pickler);
    # large ones are re-checked precisely, since a substring search would cost more.
    if data is not None and data.find(_MAIN, 0, _SCAN_LIMIT) >= 0:
        data = None
    elif data is not None and len(data) > _SCAN_LIMIT:
        try:
            del state.parts[mark:]
            out = io.BytesIO()
            checking = _CheckingPickler(out, protocol=5, buffer_callback=state.take)
            if table is not None:
                checking.dispatch_table = table
            checking.dump(obj)
            data = out.getvalue()
        except _NeedsByValue:
            data = None
    if data is None:
        del state.parts[mark:]
        out = io.BytesIO()
        _ByValuePickler(out, protocol=5, buffer_callback=state.take).dump(obj)
        data = out.getvalue()
    return data


def loads(parts: Sequence[bytes | memoryview]) -> Any:
    """Inverse of :func:`dumps`."""
    if len(parts) == 1:
        return pickle.loads(parts[0])
    return pickle.loads(parts[0], buffers=parts[1:])


Frame = bytes | list[bytes | memoryview]

# Envelope kinds (the first field of an envelope).
_CALL = 0
_SPAWN = 2
_STOP_ACTOR = 3
_STOP_PROC = 4
_HELLO = 5
_FAILED = 6
_HEARTBEAT = 7
_CAST = 8
_REPLY = 1  # a reply with out-of-band parts (the binary layout takes one part only)
_ATTACH = 20
_RESERVE = 21
_LAUNCH = 22
_EXITED = 23
_KILL = 24
_LEASE = 25
_DETACH = 26
_REFUSED = 27
_LAPSED = 28

#: Replies skip the pickled envelope:
#: ``u32 0xFFFFFFFF | u64 port_id | u32 index | u8 status | payload pickle``.
_PORT_HEAD = struct.Struct("<IQIB")
_PORT_BODY = _PORT_HEAD.size
_HEAD = struct.Struct("<I")
_PORT_MARK = 0xFFFFFFFF
#: ``u32 0xFFFFFFFE | u64 first | session id (utf-8)``
_SESSION_HEAD = 0xFFFFFFFE
SESSION_MARK = _SESSION_HEAD.to_bytes(4, "little")
#: ``u32 0xFFFFFFFD | u64 count``
_ACK_HEAD = 0xFFFFFFFD
_ACK_MARK = _ACK_HEAD.to_bytes(4, "little")
_U64 = struct.Struct("<Q")
#: Calls with a one-part payload skip the pickled envelope:
#: ``u32 0xFFFFFFFC | u32 route length | u64 port_id | u32 rank | route | payload pickle``,
#: the route a pickled ``(actor, method, reply address or None, labels, sizes)``.
_CALL_MARK = 0xFFFFFFFC
CALL_MARK_BYTES = _CALL_MARK.to_bytes(4, "little")
#: The first u32 of every fixed binary layout (no envelope is this long).
_BINARY_HEADS = frozenset((_PORT_MARK, _SESSION_HEAD, _ACK_HEAD, _CALL_MARK))
#: The first u32 of a compact call, of a compact reply, and of every fixed binary layout
#: (any other frame is in the envelope layout): how a reader tells a frame's kind.
CALL_HEAD, REPLY_HEAD, BINARY_HEADS = _CALL_MARK, _PORT_MARK, _BINARY_HEADS
_CALL_HEAD = struct.Struct("<IIQI")
_CALL_BODY = _CALL_HEAD.size
#: Routes pickled (by their fields) and unpickled (by their bytes), each bounded: the same few
#: endpoints are called over and over, and caching both turns a pickle into a dict lookup.
_routes_out: dict[tuple[Any, ...], bytes] = {}
_routes_in: dict[bytes, tuple[Any, ...]] = {}
_ROUTES_MAX = 1024


def _parts(payload: Any) -> Sequence[bytes | memoryview]:
    if type(payload) is Pickled:
        return payload.parts
    return dumps(out_of_band(payload))


def load_pickled(payload: M.Unpickled) -> Any:
    """Unpickle a :class:`~regency.core._messages.Unpickled` payload (an ``Undecodable`` when
    that fails)."""
    return _load([memoryview(p) for p in payload.parts])


def _load(parts: list[memoryview]) -> Any:
    """Unpickle a pickle and its out-of-band buffers; an ``Undecodable`` when that fails."""
    if len(parts) == 1:
        return _load_one(parts[0])
    try:
        return pickle.loads(parts[0], buffers=parts[1:])
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a value's __reduce__ runs arbitrary code: SystemExit too
        return undecodable(exc)


def _load_one(data: memoryview) -> Any:
    """Unpickle one in-band pickle (the compact layouts); an ``Undecodable`` when that fails."""
    try:
        return pickle.loads(data)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a value's __reduce__ runs arbitrary code: SystemExit too
        return undecodable(exc)


def undecodable(exc: BaseException) -> Undecodable:
    """What unpickling raised, as data. An ``Exception`` is kept as it is; anything else
    (``SystemExit``, ``GeneratorExit``: a value's ``__reduce__`` runs arbitrary code) becomes
    a ``DecodeError`` (a ``ValueError``) saying so, so that nothing out of a peer's pickle
    can stop a runtime or an actor."""
    if isinstance(exc, Exception):
        return Undecodable(exc)
    from ._errors import DecodeError

    error = DecodeError(f"unpickling raised {type(exc).__name__}: {exc}")
    error.__cause__ = exc.with_traceback(None)
    return Undecodable(error)


def _pack(envelope: tuple[Any, ...], payload: Sequence[bytes | memoryview] = ()) -> Frame:
    """One frame from an envelope tuple and payload parts (from :func:`dumps`). Small frames
    come back joined; large ones as a list of parts, which a transport sends without copying
    them together (see :data:`regency.transports.Frame`)."""
    lengths = [len(p) for p in payload]
    env = pickle.dumps((*envelope, lengths), protocol=5)
    if not payload:
        return len(env).to_bytes(_U32, "little") + env
    if sum(lengths) >= _SCAN_LIMIT:
        return [len(env).to_bytes(_U32, "little") + env, *payload]
    return b"".join((len(env).to_bytes(_U32, "little"), env, *payload))


def encode_call(
    actor: str,
    method: str,
    port: M.PortRef | None,
    rank: int,
    labels: Sequence[str],
    sizes: Sequence[int],
    payload: Sequence[bytes | memoryview],
) -> Frame:
    """``encode(Call(...))`` without building the record, for the hottest path (a mesh call
    sends one per rank); ``payload`` is already pickled (:func:`dumps`). The compact layout
    unless the payload has out-of-band parts."""
    if len(payload) != 1:
        return _pack((_CALL, actor, method, port, rank, labels, sizes), payload)
    if port is None:
        address, port_id = None, 0
    else:
        address, port_id = port
    route = _call_route((actor, method, address, labels, sizes))
    try:
        head = _CALL_HEAD.pack(_CALL_MARK, len(route), port_id, rank) + route
    except struct.error:  # a rank or port id beyond the fixed fields: the envelope holds any
        return _pack((_CALL, actor, method, port, rank, labels, sizes), payload)
    body = payload[0]
    if len(body) >= _SCAN_LIMIT:
        return [head, body]
    return head + body


def _call_route(key: tuple[Any, ...]) -> bytes:
    """The pickled route of a compact call (actor, method, reply address, labels, sizes),
    cached: a caller sends the same few over and over."""
    try:
        route = _routes_out.get(key)
    except TypeError:  # labels or sizes in a list: not cached
        return pickle.dumps(key, protocol=5)
    if route is None:
        route = pickle.dumps(key, protocol=5)
        if len(_routes_out) >= _ROUTES_MAX:
            _routes_out.clear()
        _routes_out[key] = route
    return route


def encode_calls(
    actor: str,
    method: str,
    port: M.PortRef | None,
    ranks: Sequence[int],
    labels: Sequence[str],
    sizes: Sequence[int],
    payload: Sequence[bytes | memoryview],
) -> list[Frame]:
    """``[encode_call(..., rank, ...) for rank in ranks]`` (the same frames), for a call to
    several ranks: the route is looked up once, and only each frame's fixed header (its
    rank) is packed per rank."""
    if len(payload) != 1 or len(payload[0]) >= _SCAN_LIMIT:
        return [encode_call(actor, method, port, r, labels, sizes, payload) for r in ranks]
    if port is None:
        address, port_id = None, 0
    else:
        address, port_id = port
    route = _call_route((actor, method, address, labels, sizes))
    tail = route + payload[0]
    pack, n = _CALL_HEAD.pack, len(route)
    try:
        return [pack(_CALL_MARK, n, port_id, r) + tail for r in ranks]
    except struct.error:  # a rank or port id beyond the fixed fields: the envelope holds any
        return [encode_call(actor, method, port, r, labels, sizes, payload) for r in ranks]


def encode_reply(port_id: int, index: int, status: int, value: Any) -> Frame:
    """``encode(Reply(...))`` without building the record: the binary layout unless the
    payload has out-of-band parts. Raises what pickling ``value`` raises."""
    if value is None:  # the commonest reply: its pickle is a constant
        return _PORT_HEAD.pack(_PORT_MARK, port_id, index, status) + _NONE_PICKLE
    if type(value) in _PLAIN:  # a number, a string (most other replies): one part
        body: bytes | memoryview = pickle.dumps(value, protocol=5)
    else:
        parts = _parts(value)
        if len(parts) != 1:
            return _pack((_REPLY, port_id, index, status), parts)
        body = parts[0]
    head = _PORT_HEAD.pack(_PORT_MARK, port_id, index, status)
    if len(body) >= _SCAN_LIMIT:
        return [head, body]
    return head + body


def encode(msg: M.Wire) -> Frame:
    """The wire form of ``msg``. Raises what pickling its payload raises."""
    match msg:
        case Call():
            return encode_call(
                msg.actor, msg.method, msg.port, msg.rank, msg.labels, msg.sizes,
                _parts(msg.payload),
            )
        case Reply():
            return encode_reply(msg.port_id, msg.index, msg.status, msg.payload)
        case Cast():
            return _pack(
                (_CAST, msg.cast_id, msg.actor, msg.method, msg.port, msg.up, msg.offset,
                 msg.gather, msg.labels, msg.sizes, msg.dests, msg.fanout),
                _parts(msg.payload),
            )
        case Spawn():
            return _pack(
                (_SPAWN, msg.actor, msg.name, msg.rank, msg.labels, msg.sizes, msg.port,
                 msg.owner),
                _parts(msg.payload),
            )
        case StopActor():
            return _pack((_STOP_ACTOR, msg.actor, msg.port))
        case StopProc():
            return _pack((_STOP_PROC, msg.port))
        case Hello():
            if msg.error is None:  # the frame as it was before hellos carried errors
                return _pack((_HELLO, msg.proc_id, msg.address))
            return _pack((_HELLO, msg.proc_id, msg.address, msg.error))
        case Failed():
            return _pack((_FAILED, msg.mesh, msg.rank), _parts(msg.payload))
        case Heartbeat():
            return _pack((_HEARTBEAT, msg.address))
        case Session():
            return SESSION_MARK + _U64.pack(msg.first) + msg.session.encode()
        case Ack():
            return _ACK_MARK + _U64.pack(msg.count)
        case Attach():
            return _pack((_ATTACH, msg.controller, msg.lease, msg.port))
        case Reserve():
            return _pack((_RESERVE, msg.controller, msg.count, msg.port))
        case Launch():
            return _pack((_LAUNCH, msg.controller), _parts(msg.payload))
        case Exited():
            if not msg.tail:  # the frame as it was before exits carried tails
                return _pack((_EXITED, msg.address, msg.code))
            return _pack((_EXITED, msg.address, msg.code, msg.tail))
        case Kill():
            return _pack((_KILL, msg.controller, msg.address))
        case Lease():
            return _pack((_LEASE, msg.controller))
        case Detach():
            return _pack((_DETACH, msg.controller, msg.shutdown))
        case Refused():
            return _pack((_REFUSED, msg.address, msg.reason))
        case Lapsed():
            return _pack((_LAPSED, msg.worker, msg.reason))
        case _:
            assert_never(msg)


_PORT_MARK_BYTES = _PORT_MARK.to_bytes(4, "little")
#: The first four bytes of a reply in the compact layout (:func:`decode_reply`).
REPLY_MARK = _PORT_MARK_BYTES


def is_compact_reply(frame: memoryview) -> bool:
    """Whether ``frame`` is a reply in the compact layout (what a thread that reads its own
    reply handles; see ``core/_leader.py``), told without unpickling anything."""
    return frame[:4] == _PORT_MARK_BYTES


def compact_reply_port(frame: memoryview) -> int | None:
    """The port id of a reply in the compact layout, None for any other frame (nothing is
    unpickled)."""
    if frame[:4] != _PORT_MARK_BYTES or len(frame) < _PORT_BODY:
        return None
    return int(_U64.unpack_from(frame, 4)[0])


def bulk_reply_port(frame: memoryview) -> int | None:
    """The port id of a reply in the envelope layout (one with out-of-band parts: a big
    ``bytes``, an array, a tensor), read from its envelope alone; None for any other frame.
    Raises ``ValueError`` for a malformed frame."""
    try:
        (head,) = _HEAD.unpack_from(frame)
    except struct.error:
        raise ValueError(f"frame of {len(frame)} bytes is too short for a header") from None
    if head in _BINARY_HEADS:
        return None
    env, _ = _unpack(frame, head)
    if env[0] != _REPLY or len(env) != 5 or type(env[1]) is not int:
        return None
    return int(env[1])


def decode(frame: memoryview) -> M.Wire:
    """The record a frame carries, its payload unpickled (an :class:`Undecodable` when that
    fails). Raises ``ValueError`` for a malformed frame (the connection is then closed)."""
    try:
        (head,) = _HEAD.unpack_from(frame)
    except struct.error:
        raise ValueError(f"frame of {len(frame)} bytes is too short for a header") from None
    if head == _CALL_MARK:
        call = decode_compact_call(frame, None)
        assert call is not None  # None only where a ``wanted`` test declines the actor
        return call
    if head == _PORT_MARK:
        return Reply(*decode_reply(frame))
    if head == _SESSION_HEAD:
        if len(frame) < 12:
            raise ValueError(f"session frame of {len(frame)} bytes is too short")
        (first,) = _U64.unpack_from(frame, 4)
        return Session(bytes(frame[12:]).decode(), first)
    if head == _ACK_HEAD:
        if len(frame) != 12:
            raise ValueError(f"acknowledgement frame of {len(frame)} bytes (expected 12)")
        return Ack(_U64.unpack_from(frame, 4)[0])
    env, parts = _unpack(frame, head)
    try:
        if env[0] == _CALL:  # the common case first
            return _call(env, parts)
        return _from_envelope(env, parts)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed frame envelope {env[:1]!r}: {exc}") from exc


def decode_reply(frame: memoryview) -> tuple[int, int, int, Any]:
    """``decode`` of a reply in the compact layout (:func:`is_compact_reply`) without
    building the :class:`Reply` record, for the hottest receive path (as
    :func:`encode_reply` is for the send): its ``(port_id, index, status, value)``, the
    value an :class:`Undecodable` when it cannot be unpickled. Raises ``ValueError`` for a
    frame too short for the layout."""
    try:
        _, port_id, index, status = _PORT_HEAD.unpack_from(frame)
    except struct.error:
        raise ValueError(f"reply frame of {len(frame)} bytes is too short") from None
    return port_id, index, status, reply_value(frame)


#: The fixed fields of a compact reply, which every frame at least this long (any kind)
#: unpacks into: ``(first u32, port_id, index, status)``, the first telling the kind (a thread
#: that reads tells it so, one unpack for the kind and a reply's fields: ``_inbound.py``).
REPLY_FIELDS = _PORT_HEAD.unpack_from
REPLY_FIELDS_BYTES = _PORT_BODY
#: The whole length of a compact reply of None (the commonest reply: :func:`encode_reply`
#: writes its pickle as a constant).
_NONE_REPLY_BYTES = _PORT_BODY + len(_NONE_PICKLE)
_NONE_WORD = _HEAD.unpack(_NONE_PICKLE)[0]  # (4 bytes: b"\x80\x05N.")


def reply_value(frame: memoryview) -> Any:
    """The value of a compact reply (the pickle after its fixed fields), an
    :class:`Undecodable` when it cannot be unpickled. A reply of None is told by its bytes,
    not unpickled (about 1,000 instructions less a reply: an unpickler is built per
    ``pickle.loads``)."""
    # (its 4 bytes read as a number: no view sliced, no bytes compared)
    if len(frame) == _NONE_REPLY_BYTES and _HEAD.unpack_from(frame, _PORT_BODY)[0] == _NONE_WORD:
        return None
    return _load_one(frame[_PORT_BODY:])


def decode_call_to(frame: memoryview, wanted: Callable[[str], bool]) -> Call | None:
    """The :class:`Call` ``frame`` carries when it is a call to an actor for which
    ``wanted(actor)`` holds; None for any other frame, read no further than its envelope (its
    payload is neither unpickled nor copied: the loop decodes it when it handles the frame).
    Raises ``ValueError`` for a malformed frame."""
    try:
        (head,) = _HEAD.unpack_from(frame)
    except struct.error:
        raise ValueError(f"frame of {len(frame)} bytes is too short for a header") from None
    if head == _CALL_MARK:
        return decode_compact_call(frame, wanted)
    if head in _BINARY_HEADS:
        return None
    return decode_envelope_call(frame, head, wanted)


def decode_envelope_call(
    frame: memoryview, env_len: int, wanted: Callable[[str], bool]
) -> Call | None:
    """:func:`decode_call_to` of a frame in the envelope layout (its first u32,
    ``env_len``, told already)."""
    env, parts = _unpack(frame, env_len)
    if env[0] != _CALL or len(env) != 8:
        return None
    if type(env[1]) is not str:  # (else wanted() may raise TypeError on a list)
        raise ValueError(f"malformed frame envelope: actor key {env[1]!r} is not a str")
    if not wanted(env[1]):
        return None
    try:
        return _call(env, parts)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed frame envelope {env[:1]!r}: {exc}") from exc


def decode_compact_call(
    frame: memoryview, wanted: Callable[[str], bool] | None
) -> Call | None:
    """A call in the compact layout (a frame whose first u32 is its mark, told already);
    None when ``wanted`` (if given) does not want its actor (then its payload is not
    unpickled). Raises ``ValueError`` for a malformed frame."""
    try:
        _, route_len, port_id, rank = _CALL_HEAD.unpack_from(frame)
    except struct.error:
        raise ValueError(f"call frame of {len(frame)} bytes is too short") from None
    end = _CALL_BODY + route_len
    if end > len(frame):
        raise ValueError(f"call route length {route_len} exceeds the frame ({len(frame)} bytes)")
    raw = frame[_CALL_BODY:end].tobytes()
    route = _routes_in.get(raw)
    if route is None:
        route = _load_route(raw)
    actor, method, address, labels, sizes = route
    if wanted is not None and not wanted(actor):
        return None
    # The record built without its ``__init__``, slot by slot (``_CALL_FIELDS`` checks
    # the names against the class once, at import; every slot is set).
    call = _new(Call)
    call.actor = actor
    call.method = method
    call.port = None if address is None else (address, port_id)
    call.rank = rank
    call.labels = labels
    call.sizes = sizes
    call.queued_at = _NEVER
    call.cast = None
    payload = frame[end:]
    if len(payload) == _NO_ARGUMENTS_BYTES and payload.tobytes() == _NO_ARGUMENTS:
        # A call without arguments (the senders' pickle of them is this constant): built,
        # not unpickled (about 1,500 instructions less a call: an unpickler per loads).
        call.payload = ((), {})
    else:
        call.payload = _load_one(payload)
    return call


_new = object.__new__
_NEVER = -math.inf  # Call.queued_at until the call is queued
#: The pickle of ``((), {})``: a call's arguments when it has none. Senders send exactly
#: this (``_adverbs`` uses ``NO_ARGUMENTS``), so the decoder can tell it by its bytes.
_NO_ARGUMENTS = pickle.dumps(((), {}), protocol=5)
_NO_ARGUMENTS_BYTES = len(_NO_ARGUMENTS)
#: The payload parts of a call without arguments (what :func:`dumps` makes of ``((), {})``).
NO_ARGUMENTS: list[bytes | memoryview] = [_NO_ARGUMENTS]
_CALL_FIELDS = (
    "actor", "method", "port", "rank", "labels", "sizes", "payload", "queued_at", "cast",
)
if tuple(f.name for f in attrs.fields(Call)) != _CALL_FIELDS:  # pragma: no cover
    raise AssertionError(f"decode_compact_call builds a Call of fields {_CALL_FIELDS}")


def _load_route(raw: bytes) -> tuple[Any, ...]:
    """A compact call's route from its bytes, checked, and cached when immutable."""
    try:
        route = pickle.loads(raw)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise ValueError(f"call route does not unpickle: {exc!r}") from exc
    if (
        type(route) is not tuple
        or len(route) != 5
        or type(route[0]) is not str
        or type(route[1]) is not str
        or not (route[2] is None or type(route[2]) is str)
    ):
        raise ValueError(
            "call route is not (actor, method, address, labels, sizes) "
            f"(got {type(route).__name__} {route!r:.80})"
        )
    if type(route[3]) is tuple and type(route[4]) is tuple:  # lists could be changed: not kept
        if len(_routes_in) >= _ROUTES_MAX:
            _routes_in.clear()
        _routes_in[raw] = route
    return route


def _call(env: tuple[Any, ...], parts: list[memoryview]) -> Call:
    _, actor, method, port, rank, labels, sizes, _ = env
    return Call(actor, method, port, rank, labels, sizes, _load(parts))


def _from_envelope(env: tuple[Any, ...], parts: list[memoryview]) -> M.Wire:
    kind = env[0]
    if kind == _SPAWN:
        _, actor, name, rank, labels, sizes, port, owner, _ = env
        pickled = M.Unpickled(tuple(bytes(p) for p in parts))  # the receive buffer is reused
        return Spawn(actor, name, rank, labels, sizes, port, owner, pickled)
    if kind == _CAST:
        _, cast_id, actor, method, port, up, offset, gather, labels, sizes, dests, fanout, _ = env
        pickled = M.Unpickled(tuple(bytes(p) for p in parts))  # forwarded as it came
        return Cast(
            cast_id, actor, method, port, up, offset, gather, labels, sizes, dests, fanout,
            pickled,
        )
    if kind == _REPLY:
        _, port_id, index, status, _ = env
        return Reply(port_id, index, status, _load(parts))
    if kind == _STOP_ACTOR:
        _, actor, port, _ = env
        return StopActor(actor, port)
    if kind == _STOP_PROC:
        _, port, _ = env
        return StopProc(port)
    if kind == _HELLO:
        _, proc_id, address, *error, _ = env
        if not error:
            return Hello(proc_id, address)
        type_name, message, traceback = error[0]
        return Hello(proc_id, address, (str(type_name), str(message), str(traceback)))
    if kind == _FAILED:
        _, mesh, rank, _ = env
        return Failed(mesh, rank, _load(parts))
    if kind == _HEARTBEAT:
        _, address, _ = env
        return Heartbeat(address)
    if kind == _ATTACH:
        _, controller, lease, port, _ = env
        return Attach(controller, lease, port)
    if kind == _RESERVE:
        _, controller, count, port, _ = env
        return Reserve(controller, count, port)
    if kind == _LAUNCH:
        _, controller, _ = env
        return Launch(controller, _load(parts))
    if kind == _EXITED:
        _, address, code, *tail, _ = env
        lines = tail[0] if tail else ()
        return Exited(address, code, tuple((str(s), str(line)) for s, line in lines))
    if kind == _KILL:
        _, controller, address, _ = env
        return Kill(controller, address)
    if kind == _LEASE:
        _, controller, _ = env
        return Lease(controller)
    if kind == _DETACH:
        _, controller, shutdown, _ = env
        return Detach(controller, bool(shutdown))
    if kind == _REFUSED:
        _, address, reason, _ = env
        return Refused(address, reason)
    if kind == _LAPSED:
        _, worker, reason, _ = env
        return Lapsed(worker, reason)
    raise ValueError(f"unknown frame kind {kind!r}")


def _unpack(frame: memoryview, env_len: int) -> tuple[tuple[Any, ...], list[memoryview]]:
    """Split a frame whose envelope is ``env_len`` bytes long into its envelope (the length
    list still last) and payload part views.

    The views alias ``frame``: unpickle or copy them before the frame goes away.
    Raises ``ValueError`` when the frame is malformed.
    """
    if env_len > len(frame) - _U32:
        raise ValueError(f"frame envelope length {env_len} exceeds the frame ({len(frame)} bytes)")
    try:
        envelope = pickle.loads(frame[_U32 : _U32 + env_len])
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise ValueError(f"frame envelope does not unpickle: {exc!r}") from exc
    if type(envelope) is not tuple or len(envelope) < 2 or type(envelope[-1]) is not list:
        raise ValueError("frame envelope is not a Regency envelope")
    offset = _U32 + env_len
    sizes = envelope[-1]
    if len(sizes) == 1 and type(sizes[0]) is int and offset + sizes[0] == len(frame):
        return envelope, [frame[offset:]]  # the common case: one payload part
    parts: list[memoryview] = []
    for size in sizes:
        if type(size) is not int or size < 0 or offset + size > len(frame):
            raise ValueError("frame payload lengths do not match the frame")
        parts.append(frame[offset : offset + size])
        offset += size
    if offset != len(frame):
        raise ValueError(f"frame has {len(frame) - offset} trailing bytes")
    return envelope, parts
