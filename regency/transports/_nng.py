"""nng through pynng: ``nng+tcp://HOST:PORT``, ``nng+ipc:///PATH``, ``nng+tls+tcp://HOST:PORT``.

Not the default: nng hands every message through its own threads, so a round trip costs several
times what the trio-socket backend's does (DESIGN.md, "Transports, measured"). It is here for
TLS and for reaching peers through nng's transports.

Wire use. A listener is one polyamorous ``Pair1`` socket, a dialer a plain ``Pair1`` socket that
accepts exactly one pipe, and one nng pipe is one :class:`Connection`. Every pipe starts with
the job-secret handshake of :mod:`._auth`, one nng message per step; until it completes,
whatever a pipe carries is handshake input and never reaches a sink. After it, every message is
``u32le acks`` followed by any number of ``u32le length + frame``: queued frames share one
message, because nng's cost is per message.

Flow control. A polyamorous socket *drops* a message when the pipe's two-slot send queue is full
instead of waiting, which loses frames whenever a listener outruns its peer. So the listener
keeps at most ``_WINDOW`` (2) messages per pipe unacknowledged, the server's handshake proof
included: whenever it hands nng another message, at most one other can be queued. The dialer
acknowledges each message it receives in the ``acks`` field of its next message (one without
frames if it has nothing to send). Dialer-to-listener needs no window: a plain ``Pair1`` socket
applies back pressure rather than dropping, and the listener's receive path waits too.

Threads. :meth:`NngConnection.send_nowait` hands messages to nng with non-blocking sends under a
per-connection lock, from whichever thread calls it; what nng cannot take yet is queued and
flushed by one writer task per socket that waits on nng's ``send_fd``. One reader task per
socket waits on ``recv_fd`` and drains with non-blocking receives. nng reports pipes coming and
going on its own threads; those callbacks only post the event to the trio thread, which
handles a removal only after draining the messages that preceded it.

Speed. The per-message path calls nng's C API through pynng's own cffi bindings, not pynng's
``Message`` objects (which take locks and look pipes up on every message, and report an empty
queue by raising), and the reader waits on ``recv_fd`` with nothing else around it: timeouts
and TLS liveness checks live in a housekeeping task of their own.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import pynng
import trio

from . import _auth, _protect
from ._base import (
    NNG_NETWORK,
    AuthenticationError,
    Connection,
    ConnectionBroken,
    ConnectionClosed,
    ConnectionRefused,
    Frame,
    FrameSink,
    IncompatiblePeer,
    Listener,
    SinkFactory,
    Transport,
    TransportError,
    frame_size,
)
from ._sockets import _check_private_dir

log = logging.getLogger("regency.transports")

ENV_CERT: Final = "REGENCY_TLS_CERT"
ENV_KEY: Final = "REGENCY_TLS_KEY"
ENV_CA: Final = "REGENCY_TLS_CA"

_U32 = struct.Struct("<I")
#: Unacknowledged messages a listener may have on one pipe (nng's per-pipe queue holds 2).
_WINDOW = 2
#: Frames are packed into one message up to this many bytes; a larger frame is cut across
#: several messages.
_BATCH_BYTES = 256 * 1024
#: The largest message nng accepts on any pipe, authenticated or not: a full batch with its
#: ack header and one frame header, sealed (at most two records of _protect's overhead).
_RECV_MAX = _BATCH_BYTES + 2 * 4 + 2 * (_protect.HEADER_BYTES + _protect.TAG_BYTES)
#: The polyamorous socket's shared send queue: deep enough that non-blocking sends rarely fail,
#: since the window already bounds what each pipe can have outstanding.
_LISTENER_SEND_BUFFER = 1024
_DIALER_SEND_BUFFER = 8
_RECV_BUFFER = 64
#: Seconds to establish the nng pipe (TCP connect and TLS) before giving up.
_DIAL_TIMEOUT = 5.0
#: A dialer never redials: its connection ends with its pipe.
_NO_REDIAL_MS = 3_600_000
#: Messages the reader handles between checkpoints, so a flood cannot starve other tasks.
_DRAIN_BATCH = 64
#: Seconds between checks that TLS pipes still have a connection (see _Endpoint._housekeeping).
_TLS_LIVENESS_INTERVAL = 1.0


@attrs.frozen
class TlsSettings:
    """Where the PEM files for ``nng+tls+tcp`` live.

    A listener presents ``cert_file`` and ``key_file``; a dialer verifies the listener's
    certificate against ``ca_file`` and the host name it dialed. Dialers present no certificate:
    the job-secret handshake already authenticates them.
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsSettings:
        """Read ``REGENCY_TLS_CERT``, ``REGENCY_TLS_KEY`` and ``REGENCY_TLS_CA``."""
        env = os.environ if environ is None else environ
        return cls(
            cert_file=env.get(ENV_CERT) or None,
            key_file=env.get(ENV_KEY) or None,
            ca_file=env.get(ENV_CA) or None,
        )


def _parse(address: str) -> tuple[str, str, str]:
    """Split an address into (scheme, nng URL, host); host is empty for ipc."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in NngTransport.schemes:
        raise ValueError(f"address scheme must be one of {NngTransport.schemes} (got {address!r})")
    url = address.removeprefix("nng+")
    if scheme == "nng+ipc":
        if not rest:
            raise ValueError(f"nng+ipc address must look like nng+ipc:///PATH (got {address!r})")
        return scheme, url, ""
    host, colon, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"{scheme} address must look like {scheme}://HOST:PORT (got {address!r})")
    return scheme, url, host


def _broken(what: str, exc: pynng.NNGException) -> ConnectionBroken:
    """The one place nng errors become transport errors: a refused dial (nothing listens)
    is :class:`ConnectionRefused`, a TLS peer that fails verification an
    :class:`AuthenticationError` (retrying cannot help), anything else :class:`ConnectionBroken`."""
    kind: type[ConnectionBroken] = ConnectionBroken
    if isinstance(exc, pynng.ConnectionRefused):
        kind = ConnectionRefused
    elif isinstance(exc, (pynng.exceptions.AuthenticationError, pynng.exceptions.CryptoError)):
        kind = AuthenticationError
    return kind(f"{what}: {exc} (nng error {exc.errno})")


# nng's C API through pynng's own bindings. The per-message path calls it directly: pynng's
# Message objects take locks and look pipes up on every message, and report an empty queue by
# raising (building the exception's text), which costs more than the call itself.
_lib: Any = pynng.lib
_ffi: Any = pynng.ffi
_NONBLOCK: Final[int] = _lib.NNG_FLAG_NONBLOCK
_EAGAIN: Final[int] = _lib.NNG_EAGAIN


def _nng_error(rv: int) -> pynng.NNGException:
    """pynng's exception for nng error code ``rv``."""
    try:
        pynng.exceptions.check_err(rv)
    except pynng.NNGException as exc:
        return exc
    raise AssertionError(f"nng error code must be non-zero (got {rv})")  # pragma: no cover


def _send_now(sock: Any, pipe: Any, data: bytes) -> int:
    """Hand ``data`` to nng as one message for ``pipe`` without waiting. Returns 0, or nng's
    error code (``_EAGAIN``: its queue is full), in which case nothing was sent."""
    msg_p = _ffi.new("nng_msg **")
    rv: int = _lib.nng_msg_alloc(msg_p, len(data))
    if rv:
        return rv
    msg = msg_p[0]
    _ffi.memmove(_lib.nng_msg_body(msg), data, len(data))
    _lib.nng_msg_set_pipe(msg, pipe)
    rv = _lib.nng_sendmsg(sock, msg, _NONBLOCK)
    if rv:
        _lib.nng_msg_free(msg)  # nng takes the message only when it accepts it
    return rv


def _has_peer(pipe: Any) -> bool:
    """Whether nng still knows the pipe's peer address (see _Endpoint._housekeeping)."""
    try:
        pipe.remote_address  # noqa: B018 - the query is the check
    except pynng.NNGException:
        return False
    return True


def _close_pipe(pipe: Any) -> None:
    try:
        pipe.close()
    except pynng.NNGException:
        pass  # already gone


def _take(pieces: deque[memoryview], room: int, out: list[bytes | bytearray | memoryview]) -> int:
    """Move up to ``room`` bytes from the front of ``pieces`` to ``out``; return how many."""
    taken = 0
    while pieces and taken < room:
        piece = pieces[0]
        if len(piece) <= room - taken:
            out.append(pieces.popleft())
            taken += len(piece)
        else:
            cut = room - taken
            out.append(piece[:cut])
            pieces[0] = piece[cut:]
            taken += cut
    return taken


class _Flush(enum.Enum):
    DONE = "done"  # nothing left that may be sent now
    BLOCKED = "blocked"  # nng's queue is full: wait for send_fd
    FAILED = "failed"  # the connection broke; it is marked closed


class NngConnection(Connection):
    """One authenticated nng pipe."""

    #: nng's own threads receive every message: there is no descriptor a thread could
    #: read frames from in order with the loop, so only the loop reads.
    readable_by_threads = False

    def __init__(
        self,
        endpoint: _Endpoint,
        pipe: Any,
        peer: str,
        *,
        credit: int | None,
        acks_owed: int = 0,
        protection: tuple[_protect.Sealer, _protect.Opener] | None = None,
    ) -> None:
        self.peer = peer
        # Seals what this side sends (under _lock, so records go out in sequence order) and
        # checks what it receives; None where the link needs no sealing (see NngTransport).
        self._sealer: _protect.Sealer | None = None
        self._opener: _protect.Opener | None = None
        if protection is not None:
            self._sealer, self._opener = protection
        self.sink: FrameSink | None = None
        self._endpoint = endpoint
        self._pipe = pipe
        self._trio_thread = threading.get_ident()
        self._lock = threading.Lock()
        # Everything below up to _lost_notified is guarded by _lock.
        # Frames accepted by send_nowait and not yet in a message, oldest first, with sizes.
        self._pending: deque[tuple[int, Frame]] = deque()
        # A built message nng refused (queue full); it goes before anything in _pending.
        self._stalled: bytes | None = None
        # What is left of a frame too large for one message, which the next message continues.
        self._spill: deque[memoryview] = deque()
        # Messages the peer may still be sent unacknowledged; None on a dialer (no window).
        self._credit = credit
        # Messages received from the peer and not yet acknowledged; only dialers owe acks.
        self._acks_owed = acks_owed
        # True while the writer task owns flushing; always True while _stalled is set.
        self._scheduled = False
        self._closed = False
        self._error: BaseException | None = None
        # Trio thread only.
        self._lost_notified = False
        # A frame spanning several messages, as received so far, and how many bytes it lacks.
        self._partial: bytearray | None = None
        self._partial_need = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def send_nowait(self, frame: Frame, answer: bool = False) -> None:
        size = len(frame) if isinstance(frame, bytes) else frame_size(frame)
        if size > self._endpoint.max_frame:
            raise ValueError(
                f"frame of {size} bytes exceeds max_frame_bytes={self._endpoint.max_frame}"
            )
        with self._lock:
            self._check_open_locked()
            self._pending.append((size, frame))
            if self._scheduled or self._credit == 0:
                return  # the writer, or the reader when acks return, sends it in order
            status = self._flush_locked()
            if status is _Flush.BLOCKED:
                self._scheduled = True
        if status is _Flush.BLOCKED:
            self._call_on_trio(self._endpoint.mark_dirty, self)
        elif status is _Flush.FAILED:
            # Reported later even on the trio thread: connection_lost must not run inside a
            # caller's send_nowait.
            try:
                self._endpoint.token.run_sync_soon(self._report_failure)
            except trio.RunFinishedError:
                pass
            with self._lock:
                self._check_open_locked()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pending.clear()
            self._spill.clear()
            self._stalled = None
        self._endpoint.release(self)
        self._notify_lost(None)

    def _check_open_locked(self) -> None:
        if self._closed:
            if self._error is not None:
                raise ConnectionBroken(f"connection to {self.peer} is broken: {self._error}")
            raise ConnectionClosed(f"connection to {self.peer} is closed")

    def _flush_locked(self) -> _Flush:
        """Hand nng every message the window allows. Caller holds ``_lock``."""
        while True:
            if self._stalled is None:
                idle = not self._pending and not self._spill and not self._acks_owed
                if idle or self._credit == 0:
                    return _Flush.DONE
                built = self._build_locked()
                self._stalled = built if self._sealer is None else bytes(self._sealer.seal(built))
                if self._credit is not None:
                    self._credit -= 1
            rv = _send_now(self._endpoint.sock.socket, self._pipe.pipe, self._stalled)
            if rv == _EAGAIN:
                return _Flush.BLOCKED
            if rv:
                self._closed = True
                self._error = _broken(f"sending to {self.peer} failed", _nng_error(rv))
                self._pending.clear()
                self._spill.clear()
                self._stalled = None
                return _Flush.FAILED
            self._stalled = None

    def _build_locked(self) -> bytes:
        """The next message: the acks owed, then the rest of a frame in progress, then whole
        frames, filled up to ``_BATCH_BYTES``. A frame that does not fit in what is left of
        the message waits for the next one, unless no message could carry it whole: then
        it starts here and its remainder continues the next messages (so no message exceeds
        the receive cap)."""
        parts: list[bytes | bytearray | memoryview] = [_U32.pack(self._acks_owed)]
        self._acks_owed = 0
        room = _BATCH_BYTES
        if self._spill:
            room -= _take(self._spill, room, parts)
        pending = self._pending
        while pending and not self._spill:
            n, frame = pending[0]
            if _U32.size + n > room and (
                _U32.size + n <= _BATCH_BYTES or room < _BATCH_BYTES // 4
            ):
                break  # it travels whole in the next message, or starts in a roomier one
            pending.popleft()
            parts.append(_U32.pack(n))
            room -= _U32.size
            pieces = frame if isinstance(frame, list) else [frame]
            if n <= room:
                parts.extend(pieces)
                room -= n
            else:
                self._spill.extend(memoryview(piece).cast("B") for piece in pieces)
                room -= _take(self._spill, room, parts)
        return b"".join(parts)

    def _flush_scheduled(self) -> _Flush:
        """The writer task's turn. Trio thread."""
        with self._lock:
            if self._closed:
                self._scheduled = False
                return _Flush.DONE
            status = self._flush_locked()
            self._scheduled = status is _Flush.BLOCKED
        if status is _Flush.FAILED:
            self._report_failure()
        return status

    def _schedule_acks(self) -> None:
        """Have the writer send the acks that no outgoing frame carried. Trio thread."""
        with self._lock:
            if self._closed or self._scheduled or not self._acks_owed:
                return
            self._scheduled = True
        self._endpoint.mark_dirty(self)

    def _received(self, data: bytes | bytearray | memoryview) -> None:
        """Deliver one post-handshake message. Trio thread (the reader)."""
        if self._closed:
            return
        if self._opener is not None:
            try:
                data = self._open(data)
            except _protect.ProtectionError as exc:
                log.error("closing connection to %s: %s", self.peer, exc)
                self._fail(ConnectionBroken(f"connection to {self.peer}: {exc}"))
                return
        view = memoryview(data)
        end = len(view)
        if end < _U32.size:
            self._fail(ConnectionBroken(f"malformed message from {self.peer} (no header)"))
            return
        (acks,) = _U32.unpack_from(view, 0)
        if acks and not self._credit_returned(acks):
            return
        if self._credit is None:
            with self._lock:
                self._acks_owed += 1
        max_frame = self._endpoint.max_frame
        offset = _U32.size
        if self._partial is not None:
            # The rest of a frame that began in an earlier message.
            take = min(self._partial_need, end - offset)
            self._partial += view[offset : offset + take]
            self._partial_need -= take
            offset += take
            if not self._partial_need:  # else the frame took the whole message
                frame, self._partial = self._partial, None
                if not self._deliver(memoryview(frame)):
                    return
        while offset < end:
            if end - offset < _U32.size:
                self._fail(ConnectionBroken(f"malformed message from {self.peer} (torn header)"))
                return
            (n,) = _U32.unpack_from(view, offset)
            offset += _U32.size
            if n > max_frame:
                self._fail(
                    ConnectionBroken(f"frame of {n} bytes exceeds max_frame_bytes={max_frame}")
                )
                return
            if end - offset < n:
                if _U32.size + n <= _BATCH_BYTES:  # would have travelled whole
                    self._fail(
                        ConnectionBroken(f"malformed message from {self.peer} (torn frame)")
                    )
                    return
                # A large frame continues in the next messages: grow its buffer as the bytes
                # arrive, never by what the header claims.
                self._partial = bytearray(view[offset:end])
                self._partial_need = n - (end - offset)
                break
            if not self._deliver(view[offset : offset + n]):
                return
            offset += n
        if self._credit is None and self._acks_owed >= _WINDOW:
            self._schedule_acks()

    def _open(self, data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
        """Check and open the sealed records of one message: together they are exactly one
        message's worth of plaintext. Raises ProtectionError."""
        assert self._opener is not None
        view, offset, header_bytes = memoryview(data), 0, _protect.HEADER_BYTES
        while offset + header_bytes <= len(view):
            header = view[offset : offset + header_bytes]
            body = self._opener.body_length(header)
            offset += header_bytes
            if offset + body > len(view):
                break
            plain = self._opener.open(header, view[offset : offset + body])
            offset += body
            if plain is not None:
                if offset != len(view):
                    raise _protect.ProtectionError(
                        f"{len(view) - offset} bytes follow the records of a message"
                    )
                return plain
        raise _protect.ProtectionError("a message ended inside a record")

    def _deliver(self, frame: memoryview) -> bool:
        """Hand one frame to the sink; False when the connection is closed after it."""
        assert self.sink is not None
        try:
            self.sink.frame_received(self, frame)
        except Exception as exc:
            log.error("closing connection to %s after bad frame: %r", self.peer, exc)
            self._fail(exc)
            return False
        return not self._closed

    def _credit_returned(self, acks: int) -> bool:
        """Apply the peer's acknowledgements; False if they were invalid (connection failed)."""
        with self._lock:
            if self._credit is None or self._credit + acks > _WINDOW:
                invalid = True
                status = _Flush.DONE
            else:
                invalid = False
                self._credit += acks
                status = _Flush.DONE if self._scheduled else self._flush_locked()
                if status is _Flush.BLOCKED:
                    self._scheduled = True
        if invalid:
            self._fail(ConnectionBroken(f"{self.peer} acknowledged messages it was never sent"))
            return False
        if status is _Flush.BLOCKED:
            self._endpoint.mark_dirty(self)
        elif status is _Flush.FAILED:
            self._report_failure()
            return False
        return True

    def _fail(self, exc: BaseException) -> None:
        """Something outside broke the connection. Trio thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._error = exc
                self._pending.clear()
                self._spill.clear()
                self._stalled = None
            exc = self._error if self._error is not None else exc
        self._endpoint.release(self)
        self._notify_lost(exc)

    def _report_failure(self) -> None:
        """Finish a failure ``_flush_locked`` recorded. Trio thread."""
        assert self._error is not None
        self._fail(self._error)

    def _notify_lost(self, exc: BaseException | None) -> None:
        if self._lost_notified:
            return
        self._lost_notified = True
        if self.sink is not None:
            try:
                self.sink.connection_lost(self, exc)
            except Exception:
                log.exception("connection_lost handler for %s failed", self.peer)

    def _call_on_trio(self, fn: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._trio_thread:
            fn(*args)
            return
        try:
            self._endpoint.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass


class _Endpoint:
    """One nng socket and the reader and writer tasks that drive it.

    :meth:`run` lives in the transport's nursery; the socket is closed when it ends, however it
    ends (:meth:`close`, or the nursery being cancelled).
    """

    def __init__(
        self, sock: Any, scheme: str, secret: bytes, max_frame: int, protect: bool
    ) -> None:
        self.sock = sock
        #: Seal frames on this socket's connections (plain nng+tcp; see NngTransport).
        self.protect = protect
        self.scheme = scheme
        self.max_frame = max_frame
        self.token = trio.lowlevel.current_trio_token()
        #: Keeps the TLS configuration alive as long as the socket that points at it.
        self.tls: Any = None
        self._secret = secret
        self.conns: dict[int, NngConnection] = {}
        self._dirty: set[NngConnection] = set()
        self._writer_wakeup = trio.Event()
        self._housekeeping_wakeup = trio.Event()
        self._scope = trio.CancelScope()
        self._closed = False
        self._next_liveness_check = math.inf if scheme != "nng+tls+tcp" else 0.0
        # Pipes by id, for messages from a pipe that has no connection yet (the handshake).
        # Written from nng threads; entries leave when the removal reaches the trio thread.
        self._pipes: dict[int, Any] = {}
        # The receive path's out-parameter, reused (trio thread only).
        self._msg_p = _ffi.new("nng_msg **")
        sock.add_pre_pipe_connect_cb(self._remember_pipe)
        sock.add_post_pipe_connect_cb(functools.partial(self._post_event, True))
        sock.add_post_pipe_remove_cb(functools.partial(self._post_event, False))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        recv_fd: int = self.sock.recv_fd
        send_fd: int = self.sock.send_fd
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_loop, recv_fd)
                    nursery.start_soon(self._write_loop, send_fd)
                    nursery.start_soon(self._housekeeping_loop)
                    task_status.started()
        finally:
            self._closed = True
            self._ended()
            trio.lowlevel.notify_closing(recv_fd)
            trio.lowlevel.notify_closing(send_fd)
            self.sock.close()

    def close(self) -> None:
        """End the tasks; the socket closes as they finish."""
        self._scope.cancel()

    def mark_dirty(self, conn: NngConnection) -> None:
        """Have the writer flush ``conn``. Trio thread."""
        if self._closed:
            return
        self._dirty.add(conn)
        self._writer_wakeup.set()

    def release(self, conn: NngConnection) -> None:
        """``conn`` is closed: forget it and let go of its pipe."""
        raise NotImplementedError

    # nng threads ----------------------------------------------------------------------------

    def _remember_pipe(self, pipe: Any) -> None:
        self._pipes[pipe.id] = pipe

    def _post_event(self, added: bool, pipe: Any) -> None:
        try:
            self.token.run_sync_soon(self._event_arrived, added, pipe)
        except trio.RunFinishedError:
            pass

    # trio thread ----------------------------------------------------------------------------

    def _event_arrived(self, added: bool, pipe: Any) -> None:
        """A pipe came or went. A removal is handled after every message the pipe sent
        before it went (they are already queued in nng): drained here, first."""
        if self._closed:
            return
        try:
            if added:
                self._pipe_added(pipe)
                self._housekeeping_wakeup.set()
                return
            while self._receive_one():
                pass
            self._pipes.pop(pipe.id, None)
            self._pipe_removed(pipe)
        except pynng.NNGException as exc:
            self._socket_failed(exc)
        except Exception:
            # Raising here would end the whole trio run (this is a run_sync_soon callback).
            log.exception("nng socket for %s failed handling a pipe event", self.scheme)
            self._socket_failed(pynng.NNGException("pipe event handling failed", 0))

    async def _read_loop(self, fd: int) -> None:
        while True:
            try:
                await self._drain()
            except pynng.NNGException as exc:
                self._socket_failed(exc)
                return
            await trio.lowlevel.wait_readable(fd)

    def _socket_failed(self, exc: pynng.NNGException) -> None:
        log.error("nng socket for %s failed: %s", self.scheme, exc)
        for conn in list(self.conns.values()):
            conn._fail(_broken("nng socket failed", exc))
        self.close()

    async def _housekeeping_loop(self) -> None:
        while True:
            with trio.move_on_at(self._housekeeping()):
                await self._housekeeping_wakeup.wait()
            self._housekeeping_wakeup = trio.Event()

    async def _drain(self) -> None:
        """Receive every message nng has queued (raises pynng.NNGException if the socket
        fails), with a checkpoint now and then so that a flood cannot starve other tasks."""
        handled = 0
        while self._receive_one():
            handled += 1
            if handled % _DRAIN_BATCH == 0:
                await trio.lowlevel.checkpoint()

    def _receive_one(self) -> bool:
        """Receive and handle one message; False when none is queued."""
        msg_p = self._msg_p
        rv = _lib.nng_recvmsg(self.sock.socket, msg_p, _NONBLOCK)
        if rv == _EAGAIN:
            return False
        if rv:
            raise _nng_error(rv)
        msg = msg_p[0]
        try:
            pipe_id: int = _lib.nng_pipe_id(_lib.nng_msg_get_pipe(msg))
            data: bytes = _ffi.buffer(_lib.nng_msg_body(msg), _lib.nng_msg_len(msg))[:]
        finally:
            _lib.nng_msg_free(msg)
        conn = self.conns.get(pipe_id)
        if conn is not None:
            conn._received(data)
        else:
            pipe = self._pipes.get(pipe_id)
            if pipe is not None:
                self._handshake_message(pipe, data)
        return True

    async def _write_loop(self, fd: int) -> None:
        while True:
            await self._writer_wakeup.wait()
            self._writer_wakeup = trio.Event()
            while self._dirty:
                dirty, self._dirty = self._dirty, set()
                blocked = [c for c in dirty if c._flush_scheduled() is _Flush.BLOCKED]
                if blocked:
                    self._dirty.update(blocked)
                    await trio.lowlevel.wait_readable(fd)

    def _send_handshake(self, pipe: Any, data: bytes) -> None:
        """Raises pynng.NNGException when nng does not take it at once."""
        rv = _send_now(self.sock.socket, pipe.pipe, data)
        if rv:
            raise _nng_error(rv)

    def _ended(self) -> None:
        """The tasks are done and the socket is about to close."""

    def _pipe_added(self, pipe: Any) -> None:
        pass

    def _pipe_removed(self, pipe: Any) -> None:
        raise NotImplementedError

    def _handshake_message(self, pipe: Any, data: bytes) -> None:
        raise NotImplementedError

    def _housekeeping(self) -> float:
        """Do what is due now; return when the housekeeping task must next run.

        nng 1.11's TLS transport can lose a peer's close: when the last data and the close
        arrive together it shuts the TCP connection but never fails the pipe, so no removal
        event ever comes. Such a pipe no longer has a peer address, which is cheap to ask.
        A pipe still in its handshake is checked too: a listener that stops accepting closes
        new pipes at once, and a dialer that lost that close would otherwise wait out the
        whole handshake timeout.
        """
        if self.scheme != "nng+tls+tcp":
            return math.inf
        now = trio.current_time()
        if now >= self._next_liveness_check:
            for conn in list(self.conns.values()):
                if not _has_peer(conn._pipe):
                    log.info("connection to %s lost: its TLS pipe has no peer", conn.peer)
                    conn._fail(ConnectionBroken("peer closed the connection"))
            for pipe_id, pipe in list(self._pipes.items()):
                if pipe_id not in self.conns and not _has_peer(pipe):
                    log.info("a %s pipe lost its peer during the handshake", self.scheme)
                    self._pipes.pop(pipe_id, None)
                    _close_pipe(pipe)
                    self._pipe_removed(pipe)
            self._next_liveness_check = now + _TLS_LIVENESS_INTERVAL
        return self._next_liveness_check


@attrs.frozen
class _ServerHandshake:
    pipe: Any
    nonce: bytes
    deadline: float


class _ListenEndpoint(_Endpoint):
    def __init__(
        self,
        sock: Any,
        scheme: str,
        secret: bytes,
        max_frame: int,
        protect: bool,
        sinks: SinkFactory,
    ) -> None:
        super().__init__(sock, scheme, secret, max_frame, protect)
        self._sinks = sinks
        # Read from nng threads (pre-connect callback); a plain bool is enough.
        self._accepting = True
        self._handshakes: dict[int, _ServerHandshake] = {}
        sock.add_pre_pipe_connect_cb(self._vet_pipe)

    def stop_accepting(self) -> None:
        """Refuse new pipes; close the socket once the established connections are gone.

        nng closes a listener's pipes together with it, so the nng listener (and its port)
        lives until the last connection ends.
        """
        self._accepting = False
        for pending in self._handshakes.values():
            _close_pipe(pending.pipe)
        self._handshakes.clear()
        if not self.conns:
            self.close()

    def release(self, conn: NngConnection) -> None:
        self.conns.pop(conn._pipe.id, None)
        _close_pipe(conn._pipe)
        if not self._accepting and not self.conns:
            self.close()

    def _vet_pipe(self, pipe: Any) -> None:
        if not self._accepting:
            self._pipes.pop(pipe.id, None)
            pipe.close()

    def _peer(self, pipe: Any) -> str:
        try:
            return f"{self.scheme}://{pipe.remote_address}"
        except pynng.NNGException:
            return f"{self.scheme} peer"

    def _refuse(self, pipe: Any, why: object) -> None:
        log.warning("refused connection from %s: %s", self._peer(pipe), why)
        _close_pipe(pipe)

    def _pipe_added(self, pipe: Any) -> None:
        if not self._accepting:
            _close_pipe(pipe)
            return
        hello, nonce = _auth.server_hello()
        try:
            self._send_handshake(pipe, hello)
        except pynng.NNGException as exc:
            self._refuse(pipe, f"cannot send the handshake greeting: {exc}")
            return
        deadline = trio.current_time() + _auth.HANDSHAKE_TIMEOUT
        self._handshakes[pipe.id] = _ServerHandshake(pipe, nonce, deadline)

    def _pipe_removed(self, pipe: Any) -> None:
        self._handshakes.pop(pipe.id, None)
        conn = self.conns.get(pipe.id)
        if conn is not None:
            conn._fail(ConnectionBroken("peer closed the connection"))

    def _handshake_message(self, pipe: Any, data: bytes) -> None:
        pending = self._handshakes.pop(pipe.id, None)
        if not self._accepting:
            _close_pipe(pipe)
            return
        if pending is None:
            self._refuse(pipe, "it sent data before the handshake greeting")
            return
        try:
            answer = _auth.check_client_proof(self._secret, pending.nonce, data)
            self._send_handshake(pipe, answer)
        except (ValueError, pynng.NNGException) as exc:
            self._refuse(pipe, exc)
            return
        peer = self._peer(pipe)
        protection = None
        if self.protect:
            nonce_c = data[len(_auth.PREFIX) : len(_auth.PREFIX) + _auth.NONCE_BYTES]
            protection = _protect.keys_for(
                "server", self._secret, pending.nonce, nonce_c, self.max_frame
            )
        # The proof just sent is the first message of the window.
        conn = NngConnection(self, pipe, peer, credit=_WINDOW - 1, protection=protection)
        self.conns[pipe.id] = conn
        try:
            conn.sink = self._sinks(conn)
        except Exception:
            log.exception("no handler for connection from %s", peer)
            del self.conns[pipe.id]
            _close_pipe(pipe)

    def _housekeeping(self) -> float:
        now = trio.current_time()
        upcoming = super()._housekeeping()
        for pipe_id, pending in list(self._handshakes.items()):
            if pending.deadline <= now:
                del self._handshakes[pipe_id]
                self._refuse(pending.pipe, "handshake timed out")
            else:
                upcoming = min(upcoming, pending.deadline)
        return upcoming


class _DialEndpoint(_Endpoint):
    def __init__(
        self,
        sock: Any,
        scheme: str,
        secret: bytes,
        max_frame: int,
        protect: bool,
        address: str,
        sink: FrameSink,
    ) -> None:
        super().__init__(sock, scheme, secret, max_frame, protect)
        self._address = address
        self._sink = sink
        self._hello: bytes | None = None
        self._nonce_c: bytes | None = None
        self._outcome: NngConnection | TransportError | None = None
        self._settled = trio.Event()
        # Written from nng threads (pre-connect callback).
        self._had_pipe = False
        sock.add_pre_pipe_connect_cb(self._vet_pipe)

    async def outcome(self) -> NngConnection:
        """Wait for the handshake; raise what ended it if it failed."""
        await self._settled.wait()
        if isinstance(self._outcome, TransportError):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome

    def release(self, conn: NngConnection) -> None:
        self.conns.pop(conn._pipe.id, None)
        self.close()

    def _ended(self) -> None:
        self._settle(ConnectionBroken(f"cannot connect to {self._address}: transport closed"))

    def _vet_pipe(self, pipe: Any) -> None:
        # One pipe per dialer, ever: a redial would be a new, unauthenticated peer.
        if self._had_pipe:
            self._pipes.pop(pipe.id, None)
            pipe.close()
        self._had_pipe = True

    def _settle(self, outcome: NngConnection | TransportError) -> None:
        if not self._settled.is_set():
            self._outcome = outcome
            self._settled.set()

    def _handshake_message(self, pipe: Any, data: bytes) -> None:
        if self._settled.is_set():
            return
        where = f"cannot connect to {self._address}"
        try:
            if self._hello is None:
                proof, self._nonce_c = _auth.client_proof(self._secret, data)
                self._hello = data
                self._send_handshake(pipe, proof)
                return
            assert self._nonce_c is not None
            nonce_s = self._hello[len(_auth.PREFIX) :]
            _auth.check_server_proof(self._secret, self._nonce_c, nonce_s, data)
        except _auth.VersionMismatch as exc:
            self._settle(IncompatiblePeer(f"{where}: {exc}"))
            return
        except ValueError as exc:
            self._settle(AuthenticationError(f"{where}: {exc}"))
            return
        except pynng.NNGException as exc:
            self._settle(_broken(where, exc))
            return
        protection = None
        if self.protect:
            assert self._hello is not None and self._nonce_c is not None
            protection = _protect.keys_for(
                "client", self._secret, self._hello[len(_auth.PREFIX) :], self._nonce_c,
                self.max_frame,
            )
        # The server's proof is the first message of its window: it is acknowledged with
        # the first message this side sends.
        conn = NngConnection(
            self, pipe, self._address, credit=None, acks_owed=1, protection=protection
        )
        conn.sink = self._sink
        self.conns[pipe.id] = conn
        self._settle(conn)

    def _pipe_removed(self, pipe: Any) -> None:
        conn = self.conns.get(pipe.id)
        if conn is not None:
            conn._fail(ConnectionBroken("peer closed the connection"))
            return
        where = f"cannot connect to {self._address}"
        if self._nonce_c is not None:
            self._settle(
                AuthenticationError(
                    f"{where}: server refused our proof: this side does not have the job secret"
                )
            )
        else:
            self._settle(ConnectionBroken(f"{where}: connection closed during handshake"))


class NngListener(Listener):
    def __init__(self, endpoint: _ListenEndpoint, address: str) -> None:
        self._endpoint = endpoint
        self.address = address

    def close(self) -> None:
        self._endpoint.stop_accepting()


class NngTransport(Transport):
    """nng's tcp, ipc and tls+tcp transports, one ``Pair1`` pipe per connection."""

    schemes = ("nng+tcp", "nng+ipc", "nng+tls+tcp")

    def refusal_is_final(self, address: str) -> bool:
        # nng+ipc is this host's socket path; the tcp schemes are network addresses.
        return not address.startswith(NNG_NETWORK)

    def __init__(
        self,
        nursery: trio.Nursery,
        secret: bytes,
        max_frame: int,
        tls: TlsSettings | None = None,
        *,
        protect_tcp: bool = True,
    ) -> None:
        self._nursery = nursery
        self._secret = secret
        self._max_frame = max_frame
        #: Seal every frame on plain nng+tcp links with the record layer of tcp:// links
        #: (:mod:`._protect`); nng+tls+tcp has TLS, nng+ipc a private directory.
        self._protect_tcp = protect_tcp
        # None: read REGENCY_TLS_* each time a TLS socket opens, so a process can be given
        # its certificates after its transport started.
        self._tls = tls
        # No message exceeds _BATCH_BYTES plus its ack header and one frame header, so nng
        # refuses anything larger when it reads the length, before buffering a byte of it:
        # a peer that has not authenticated can make us hold at most this much per pipe.
        self._recv_max = _RECV_MAX

    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        scheme, url, _ = _parse(address)
        if scheme == "nng+ipc":
            path = url.removeprefix("ipc://")
            _check_private_dir(os.path.dirname(path) or ".")
        tls = self._tls_config(scheme, server=True, host="")
        sock = pynng.Pair1(
            polyamorous=True,
            recv_max_size=self._recv_max,
            recv_buffer_size=_RECV_BUFFER,
            send_buffer_size=_LISTENER_SEND_BUFFER,
            tls_config=tls,
        )
        endpoint = _ListenEndpoint(
            sock, scheme, self._secret, self._max_frame, self._protects(scheme), sinks
        )
        endpoint.tls = tls
        await self._nursery.start(endpoint.run)
        try:
            nng_listener = sock.listen(url)
        except pynng.NNGException as exc:
            endpoint.close()
            raise OSError(f"cannot listen on {address}: {exc}") from None
        if scheme == "nng+ipc":
            os.chmod(path, 0o600)
        return NngListener(endpoint, "nng+" + nng_listener.url)

    async def connect(self, address: str, sink: FrameSink) -> Connection:
        scheme, url, host = _parse(address)
        try:
            tls = self._tls_config(scheme, server=False, host=host)
        except (ValueError, OSError, pynng.NNGException) as exc:
            # A dial without usable TLS settings cannot verify its peer: that is a failed
            # authentication (retrying cannot help), not a bug at the call site.
            raise AuthenticationError(f"cannot connect to {address}: {exc}") from None
        sock = pynng.Pair1(
            recv_max_size=self._recv_max,
            recv_buffer_size=_RECV_BUFFER,
            send_buffer_size=_DIALER_SEND_BUFFER,
            reconnect_time_min=_NO_REDIAL_MS,
            reconnect_time_max=_NO_REDIAL_MS,
            tls_config=tls,
        )
        endpoint = _DialEndpoint(
            sock, scheme, self._secret, self._max_frame, self._protects(scheme), address, sink
        )
        endpoint.tls = tls
        await self._nursery.start(endpoint.run)
        try:
            # nng's synchronous dial reports why it failed (refused, TLS); its asynchronous one
            # only retries. One thread per dial, abandoned (and the socket closed) on timeout.
            with trio.fail_after(_DIAL_TIMEOUT):
                await trio.to_thread.run_sync(
                    functools.partial(sock.dial, url, block=True), abandon_on_cancel=True
                )
            with trio.fail_after(_auth.HANDSHAKE_TIMEOUT):
                return await endpoint.outcome()
        except pynng.NNGException as exc:
            endpoint.close()
            raise _broken(f"cannot connect to {address}", exc) from None
        except trio.TooSlowError:
            endpoint.close()
            raise ConnectionBroken(f"cannot connect to {address}: timed out") from None
        except BaseException:
            endpoint.close()
            raise

    def _protects(self, scheme: str) -> bool:
        return scheme == "nng+tcp" and self._protect_tcp

    def _tls_config(self, scheme: str, *, server: bool, host: str) -> Any:
        """The pynng TLSConfig for one socket, or None for schemes without TLS."""
        if scheme != "nng+tls+tcp":
            return None
        tls = self._tls if self._tls is not None else TlsSettings.from_env()
        if server:
            for field, value in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
                if not value:
                    raise ValueError(
                        f"listening on nng+tls+tcp needs TlsSettings.{field} (got None): pass "
                        "open_transport(tls=TlsSettings(cert_file=..., key_file=...)) "
                        f"or set {ENV_CERT} and {ENV_KEY}"
                    )
            assert tls.cert_file is not None and tls.key_file is not None
            with open(tls.cert_file) as f:
                cert = f.read()
            with open(tls.key_file) as f:
                key = f.read()
            return pynng.TLSConfig(
                pynng.TLSConfig.MODE_SERVER, own_cert_string=cert, own_key_string=key
            )
        if not tls.ca_file:
            raise ValueError(
                "dialing nng+tls+tcp needs TlsSettings.ca_file (got None) to verify the "
                f"listener: pass open_transport(tls=TlsSettings(ca_file=...)) or set {ENV_CA}"
            )
        return pynng.TLSConfig(
            pynng.TLSConfig.MODE_CLIENT,
            server_name=host,
            ca_files=[tls.ca_file],
            auth_mode=pynng.TLSConfig.AUTH_MODE_REQUIRED,
        )
