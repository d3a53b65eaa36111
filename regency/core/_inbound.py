"""The way in: :class:`InboundSink`, the shell that runs a :class:`~._delivery.Receiver` on
each inbound connection (numbering frames, dropping resends, acknowledging), and
:class:`InboundSessions`, the runtime's part that keeps its sessions
(:class:`~._delivery.SessionTable`) and batches acknowledgements."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from .. import transports
from . import _codec
from ._delivery import Receiver, SessionTable, _Inbound
from ._messages import Ack, Session

if TYPE_CHECKING:
    from ._config import Config
    from ._environment import Environment
    from ._runtime import Runtime

_SESSION_MARK = _codec.SESSION_MARK  # checked on every frame: no call

#: Acknowledge after this many frames, or after ``_ACK_DELAY`` seconds, whichever is first.
_ACK_EVERY = 64
_ACK_DELAY = 0.05
#: A frame this big is acknowledged at once: until then the sender keeps it for a resend,
#: and a sender holding many big frames allocates fresh memory for every new payload
#: (a page fault per 4 KiB: a 1 MiB echo cost 2 ms instead of 0.5).
_ACK_BYTES = 256 * 1024


class InboundSink:
    """One inbound connection: numbers the frames of its session, drops the ones handled
    before a reconnect, and acknowledges."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._probe = runtime.env.probe  # the environment never changes
        self._conn: transports.Connection | None = None
        self._receiver = Receiver(runtime.env.ack_every)
        self._ack_pending = False

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        receiver = self._receiver
        if receiver.state is None or frame[:4] == _SESSION_MARK:
            msg = _codec.decode(frame)
            if type(msg) is Session:
                # raises for a forgotten session
                state = self._rt.session_opened(msg.session, msg.first)
                previous = receiver.started(msg.session, msg.first, state)
                if previous is not None:
                    self._rt.session_closed(previous)
                self._conn = conn
            else:
                self._rt.dispatch(msg)  # a peer without sessions (tests, tools)
            return
        index = receiver.frame()
        if index is None:
            return  # handled before the reconnect: a resend
        probe = self._probe
        if probe is not None:
            assert receiver.session is not None
            probe.frame_handled(self._rt, receiver.session, index)
        self._rt.on_frame(frame)
        if receiver.ack_due or len(frame) >= _ACK_BYTES:
            self.ack()
        elif not self._ack_pending:
            self._ack_pending = True
            self._rt.ack_later(self)

    def ack(self) -> None:
        self._ack_pending = False
        conn = self._conn
        if conn is None or conn.closed:
            return
        count = self._receiver.ack()
        if count is not None:
            try:
                conn.send_nowait(_codec.encode(Ack(count)))
            except transports.TransportError:
                pass

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        self._conn = None
        session = self._receiver.ended()
        if session is not None:
            self._rt.session_closed(session)


class InboundSessions:
    """The runtime's inbound sessions (a part of :class:`Runtime`)."""

    config: Config
    nursery: trio.Nursery
    env: Environment
    _sessions_in: SessionTable
    _to_ack: dict[int, InboundSink]  # insertion-ordered: deterministic
    _ack_scheduled: bool

    def _init_inbound_sessions(self) -> None:
        self._sessions_in = SessionTable()
        self._to_ack = {}
        self._ack_scheduled = False

    @property
    def delivered(self) -> dict[str, _Inbound]:
        """The inbound sessions this runtime remembers, by id."""
        return self._sessions_in.sessions

    def session_opened(self, session: str, first: int) -> _Inbound:
        """A connection of inbound ``session`` started at frame ``first``. A session
        resumed after this runtime forgot it cannot be taken (``ValueError``): which of its
        frames were handled is no longer known."""
        return self._sessions_in.opened(session, first)

    def session_closed(self, session: str) -> None:
        self._sessions_in.closed(session, trio.current_time())

    def _forget_idle_sessions(self, now: float) -> None:
        """Drop sessions that cannot come back: a sender gives up reconnecting
        ``delivery_timeout`` after it noticed its link broke, which can be up to
        ``delivery_timeout`` (plus a watchdog tick) after we noticed; after three times that
        no resend of theirs can arrive."""
        horizon = 3 * self.config.delivery_timeout + 2 * self.config.heartbeat_interval
        self._sessions_in.expire(now, horizon)

    def ack_later(self, sink: InboundSink) -> None:
        """Acknowledge ``sink``'s frames within ``ack_delay`` (on the trio thread)."""
        self._to_ack[id(sink)] = sink
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self.nursery.start_soon(self._flush_acks)

    async def _flush_acks(self) -> None:
        await trio.sleep(self.env.ack_delay)
        self._ack_scheduled = False
        sinks, self._to_ack = self._to_ack, {}
        for sink in sinks.values():
            sink.ack()
