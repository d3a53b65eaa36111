"""The way in: :class:`InboundSink` numbers the frames of each inbound delivery session,
drops the ones handled before a reconnect and acknowledges; :class:`InboundSessions` (part of
the runtime) keeps each session's handled-frame counter across connections and batches
acknowledgements."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from .. import transports
from . import _codec

if TYPE_CHECKING:
    from ._config import Config
    from ._runtime import Runtime

#: Acknowledge after this many frames, or after ``_ACK_DELAY`` seconds, whichever is first.
_ACK_EVERY = 64
_ACK_DELAY = 0.05


class InboundSink:
    """One inbound connection: numbers the frames of its session, drops the ones handled
    before a reconnect, and acknowledges."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._conn: transports.Connection | None = None
        self._session: str | None = None
        #: [frames of the session handled], shared by every connection of the session, so a
        #: reconnect that overtakes the old connection's last frames still sees them.
        self._handled: list[int] | None = None
        self._next = 0  # index of the next frame in the session
        self._acked = 0
        self._ack_pending = False

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        handled = self._handled
        if handled is None or frame[:4] == _codec.SESSION_MARK:
            session = _codec.unpack_session(frame)
            if session is not None:
                handled = self._rt.session_opened(*session)  # raises for a forgotten one
                if self._session is not None:
                    self._rt.session_closed(self._session)
                self._session, self._next = session
                self._handled = handled
                self._conn = conn
            else:
                self._rt.on_frame(frame)  # a peer without sessions (tests, tools)
            return
        index = self._next
        self._next = index + 1
        if index < handled[0]:
            return  # handled before the reconnect: a resend
        handled[0] = index + 1
        probe = self._rt.probe
        if probe is not None:
            assert self._session is not None
            probe.frame_handled(self._rt, self._session, index)
        self._rt.on_frame(frame)
        if index + 1 - self._acked >= self._rt.ack_every:
            self.ack()
        elif not self._ack_pending:
            self._ack_pending = True
            self._rt.ack_later(self)

    def ack(self) -> None:
        self._ack_pending = False
        count = self._handled[0] if self._handled is not None else 0
        if count > self._acked and self._conn is not None and not self._conn.closed:
            self._acked = count
            try:
                self._conn.send_nowait(_codec.pack_ack(count))
            except transports.TransportError:
                pass

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        self._conn = None
        if self._session is not None:
            self._rt.session_closed(self._session)
            self._session = None



class InboundSessions:
    """The runtime's bookkeeping of inbound sessions (a part of :class:`Runtime`)."""

    config: Config
    nursery: trio.Nursery
    ack_delay: float
    #: Per inbound session: how many of its frames were handled (resends below it drop).
    delivered: dict[str, list[int]]
    #: Per inbound session: its open connections, and since when it has had none. A
    #: session idle for longer than its sender could still reconnect is forgotten.
    _session_conns: dict[str, int]
    _idle_sessions: dict[str, float]
    _to_ack: dict[int, InboundSink]  # insertion-ordered: deterministic
    _ack_scheduled: bool

    def _init_inbound_sessions(self) -> None:
        self.delivered = {}
        self._session_conns = {}
        self._idle_sessions = {}
        self._to_ack = {}
        self._ack_scheduled = False

    def session_opened(self, session: str, first: int) -> list[int]:
        """A connection of inbound ``session`` started at frame ``first``: its
        handled-frames counter. A session resumed after this runtime forgot it cannot be
        taken: which of its frames were handled is no longer known."""
        handled = self.delivered.get(session)
        if handled is None:
            if first > 0:
                raise ValueError(
                    f"delivery session {session} resumes at frame {first}, but this process "
                    "forgot it (idle for longer than a sender may reconnect)"
                )
            handled = self.delivered[session] = [0]
        self._session_conns[session] = self._session_conns.get(session, 0) + 1
        self._idle_sessions.pop(session, None)
        return handled

    def session_closed(self, session: str) -> None:
        left = self._session_conns.get(session, 0) - 1
        if left > 0:
            self._session_conns[session] = left
            return
        self._session_conns.pop(session, None)
        self._idle_sessions[session] = trio.current_time()

    def _forget_idle_sessions(self, now: float) -> None:
        """Drop the counters of sessions that cannot come back: a sender gives up
        reconnecting ``delivery_timeout`` after it noticed its link broke, which can be up to
        ``delivery_timeout`` (plus a watchdog tick) after we noticed; after three times that
        no resend of theirs can arrive, and a long-lived process
        (a worker serving many controllers) does not grow with every peer it ever had."""
        horizon = 3 * self.config.delivery_timeout + 2 * self.config.heartbeat_interval
        expired = [s for s, since in self._idle_sessions.items() if now - since > horizon]
        for session in expired:
            del self._idle_sessions[session]
            self.delivered.pop(session, None)

    def ack_later(self, sink: InboundSink) -> None:
        """Acknowledge ``sink``'s frames within ``_ACK_DELAY`` (on the trio thread)."""
        self._to_ack[id(sink)] = sink
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self.nursery.start_soon(self._flush_acks)

    async def _flush_acks(self) -> None:
        await trio.sleep(self.ack_delay)
        self._ack_scheduled = False
        sinks, self._to_ack = self._to_ack, {}
        for sink in sinks.values():
            sink.ack()
