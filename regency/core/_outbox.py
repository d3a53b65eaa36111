"""The way out to one destination: :class:`Outbox` queues, numbers and resends frames of a
delivery session until the receiver acknowledges them (the inbound half is
:mod:`regency.core._inbound`)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

import trio

from .. import transports
from . import _codec
from ._errors import UndeliverableError

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")


class Outbox:
    """The way out to one destination address: queues until connected, then writes through,
    and survives a broken connection.

    ``send`` is thread-safe and never blocks. The first send schedules the connect on the
    trio thread; frames sent meanwhile queue here and are flushed, in order, before the
    connection is published to later senders.

    Delivery is a *session*: each connection starts with ``SESSION(id, first)``, the receiver
    numbers the frames that follow from ``first``, and acknowledges (``ACK(n)``: every frame
    below ``n`` was handled) every ``ack_every`` frames or ``ack_delay`` seconds. Frames
    stay here until acknowledged. When a connection breaks, the outbox dials again (until
    ``delivery_timeout``) and resends what was not acknowledged; the receiver drops what it
    already handled. So a link that breaks and comes back loses nothing and delivers nothing
    twice. A refused dial (nothing listens: the proc is gone) or a known exit ends it at once.
    """

    def __init__(self, runtime: Runtime, address: str) -> None:
        self._rt = runtime
        self.address = address
        self._conn: transports.Connection | None = None
        self._lock = threading.Lock()
        self._pending: list[transports.Frame] = []
        self._connecting = False
        self._error: BaseException | None = None
        # The nonce keeps ids unique across jobs: a worker outlives its controllers, whose
        # proc ids (from pids) can repeat, e.g. in containers.
        self._session = f"{runtime.proc_id}#{runtime._nonce}#{next(runtime._sessions)}"
        #: Frames sent on this session and not yet acknowledged, oldest first.
        self._unacked: deque[transports.Frame] = deque()
        #: How many frames of the session the receiver has acknowledged.
        self._acked = 0
        #: Since when (trio time) frames have waited for an acknowledgement that did not come,
        #: and how many were acknowledged then (see ``check_stalled``).
        self._stalled_since: float | None = None
        self._stalled_at = 0

    def send(self, frame: transports.Frame) -> None:
        size = len(frame) if isinstance(frame, bytes) else transports.frame_size(frame)
        if size > self._rt.config.max_frame_bytes:
            raise ValueError(
                f"message of {size} bytes exceeds max_frame_bytes="
                f"{self._rt.config.max_frame_bytes}; raise it with "
                "regency.configure(max_frame_bytes=...)"
            )
        with self._lock:
            if self._error is not None:
                raise UndeliverableError(
                    f"cannot deliver to the proc at {self.address}: {self._error}"
                )
            conn = self._conn
            probe = self._rt.probe
            if probe is not None:
                index = self._acked + len(self._unacked) + len(self._pending)
                probe.frame_sent(self._rt, self.address, self._session, index)
            if conn is None:
                self._pending.append(frame)
                if not self._connecting:
                    self._connecting = True
                    self._rt.call_soon(self._start)
                return
            self._unacked.append(frame)
            try:
                conn.send_nowait(frame)
            except transports.TransportError:
                pass  # kept in _unacked; the lost connection brings a reconnect and a resend

    def acknowledged(self, count: int) -> None:
        """The receiver handled the session's first ``count`` frames."""
        with self._lock:
            while self._acked < count and self._unacked:
                self._unacked.popleft()
                self._acked += 1

    def check_stalled(self, now: float) -> None:
        """Called every ``heartbeat_interval`` on the trio thread: a connection whose frames
        have gone unacknowledged for ``delivery_timeout`` is dead even if nothing said so (a
        silent network cut, a peer host that vanished without a reset). Drop it and
        reconnect; the reconnect either resends or, within ``delivery_timeout``, fails the
        link. Receivers acknowledge within ``ack_delay`` of handling, from their trio loop,
        so a live peer never trips this."""
        conn = self._conn
        if conn is None or not self._unacked:
            self._stalled_since = None
            return
        if self._stalled_since is None or self._acked != self._stalled_at:
            self._stalled_since, self._stalled_at = now, self._acked
            return
        waited = now - self._stalled_since
        if waited < self._rt.config.delivery_timeout:
            return
        self._stalled_since = None
        log.warning(
            "no acknowledgement from %s for %.1f s; reconnecting", self.address, waited
        )
        self._connection_lost(
            conn,
            transports.ConnectionBroken(
                f"connection to {self.address} is broken: {len(self._unacked)} frame(s) "
                f"unacknowledged for {waited:.1f} s"
            ),
        )
        conn.close()

    def _start(self) -> None:
        self._rt.nursery.start_soon(self._connect)

    async def _connect(self) -> None:
        try:
            ready = self._rt.child_ready.get(self.address)
            if ready is not None:
                with trio.fail_after(self._rt.config.spawn_timeout):
                    await ready.wait()
                if self._error is not None:
                    return
            conn = await self._dial(self._rt.config.spawn_timeout, retry_refused=True)
        except (transports.TransportError, trio.TooSlowError, OSError, ValueError) as exc:
            if isinstance(exc, trio.TooSlowError):
                exc = TimeoutError(
                    f"proc did not start within spawn_timeout={self._rt.config.spawn_timeout} s"
                )
            self._broken(exc)
            return
        self._resume(conn)

    def _resume(self, conn: transports.Connection) -> None:
        """Start a session on ``conn``: resend what is unacknowledged, then what queued."""
        with self._lock:
            if self._error is not None:
                conn.close()
                return
            # Everything queued joins the session first, so a send failing part-way loses
            # nothing: what did not go out is resent by the next attempt, in order.
            self._unacked.extend(self._pending)
            self._pending.clear()
            try:
                conn.send_nowait(_codec.pack_session(self._session, self._acked))
                for frame in self._unacked:
                    conn.send_nowait(frame)
            except transports.TransportError:
                pass  # it broke again: its connection_lost starts the next attempt
            self._conn = conn
            self._connecting = False

    async def _dial(self, within: float, *, retry_refused: bool) -> transports.Connection:
        """Connect, retrying for ``within`` seconds. While a proc starts nothing listens yet
        (``retry_refused``: a sibling may still be starting); a refused reconnect means the
        proc is gone. A wrong secret fails at once."""
        deadline = trio.current_time() + within
        delay = 0.001
        while True:
            try:
                # One dial into a black hole must not outlast the whole allowance.
                with trio.move_on_at(deadline) as attempt:
                    return await self._rt.transport.connect(self.address, _OutboundSink(self))
                assert attempt.cancelled_caught
                raise transports.ConnectionBroken(
                    f"cannot connect to {self.address}: no answer within {within} s"
                )
            except transports.AuthenticationError:
                raise
            except transports.ConnectionRefused:
                if not retry_refused or trio.current_time() + delay > deadline:
                    raise
            except transports.ConnectionBroken:
                if trio.current_time() + delay > deadline:
                    raise
            await trio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _connection_lost(self, conn: transports.Connection, exc: BaseException) -> None:
        with self._lock:
            if self._error is not None or self._conn is not conn:
                return
            self._conn = None
            self._connecting = True  # new frames queue in _pending meanwhile
        self._rt.start_soon(self._reconnect, exc)

    async def _reconnect(self, cause: BaseException) -> None:
        child = self._rt.children.get(self.address)
        if child is not None and child.returncode is not None:
            self._broken(cause)
            return
        within = self._rt.config.delivery_timeout
        try:
            conn = await self._dial(within, retry_refused=False)
        except (transports.TransportError, OSError) as exc:
            self._broken(
                ConnectionError(f"{cause}; no reconnection within {within} s ({exc})")
                if not isinstance(exc, transports.ConnectionRefused)
                else cause
            )
            return
        log.info("reconnected to %s; resending %d frame(s)", self.address, len(self._unacked))
        self._resume(conn)

    def _broken(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = exc
            self._pending.clear()
            self._unacked.clear()
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        probe = self._rt.probe
        if probe is not None:
            probe.session_failed(self._rt, self.address, self._session)
        self._rt.link_failed(self.address, exc)

    def close(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.close()


class _OutboundSink:
    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        count = _codec.unpack_ack(frame)
        if count is not None:
            self._outbox.acknowledged(count)
        else:
            self._outbox._rt.on_frame(frame)

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        if exc is None:
            return  # we closed it
        self._outbox._connection_lost(conn, exc)
