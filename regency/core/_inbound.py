"""The way in: :class:`InboundSink`, the shell that runs a :class:`~._delivery.Receiver` on
each inbound connection (numbering frames, dropping resends, acknowledging), and
:class:`InboundSessions`, the runtime's part that keeps its sessions
(:class:`~._delivery.SessionTable`) and batches acknowledgements."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .. import transports
from . import _codec
from ._delivery import Receiver, SessionTable, _Inbound
from ._messages import Ack, Call, Session
from ._metrics import count_received

_reply_fields = _codec.REPLY_FIELDS
_REPLY_FIELDS_BYTES = _codec.REPLY_FIELDS_BYTES
_reply_value = _codec.reply_value
_decode_compact_call = _codec.decode_compact_call
#: Replies in the envelope layout at least this big are taken by a thread that reads, like
#: compact ones (smaller ones, rare, go to the loop: not worth a second envelope unpickle).
_BULK_REPLY = 64 * 1024

class _Deferred(threading.local):
    """``deferred.error``: what handling a frame raised on this thread after the frame was
    taken (see ``InboundSink._raise_later``)."""

    #: None until set: a class attribute, so that reading it on a thread that never set it
    #: finds None (a ``getattr`` with a default on a bare ``threading.local`` built and
    #: dropped an ``AttributeError`` on every read, about 1,000 instructions).
    error: BaseException | None = None


deferred = _Deferred()

if TYPE_CHECKING:
    from ._config import Config
    from ._environment import Environment
    from ._runtime import Runtime

log = logging.getLogger("regency.transports")

_SESSION_MARK = _codec.SESSION_MARK  # checked on every frame: no call
# The first u32 of each fixed binary layout (any other frame is in the envelope layout).
_CALL_HEAD = _codec.CALL_HEAD
_REPLY_HEAD = _codec.REPLY_HEAD
_BINARY_HEADS = _codec.BINARY_HEADS

#: Acknowledge after this many frames or ``Receiver.ack_bytes`` bytes, or after ``_ACK_DELAY``
#: seconds, whichever is first. While calls and replies stream, every acknowledgement is a
#: frame that wakes the peer's loop to read it, and a delayed one also wakes this side's
#: loop twice (the timer's start and its end): 64 frames and 50 ms cost the 4-proc mesh
#: call about 0.16 loop wake-ups a call on the two sides (docs/performance.md, "The 4-proc
#: mesh call, session 7"). What a sender keeps meanwhile stays small: at most this many
#: frames below ``Receiver.ack_bytes`` in all (``_delivery.ACK_BYTES``).
_ACK_EVERY = 1024
_ACK_DELAY = 0.25


class InboundSink:
    """One inbound connection: numbers the frames of its session, drops the ones handled
    before a reconnect, and acknowledges."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._probe = runtime.env.probe  # the environment never changes
        self._conn: transports.Connection | None = None
        self._receiver = Receiver(runtime.env.ack_every)
        self._ack_pending = False
        self._threaded = runtime.threaded_actor  # (bound once, not per call frame)
        self._metered = runtime.config.metrics  # bytes of call frames per actor

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        receiver = self._receiver
        with self._rt.dispatch_lock:  # a thread may be handling frames of another connection
            if receiver.state is None or frame[:4] == _SESSION_MARK:
                self._session_frame(conn, frame)
                return
            index = receiver.frame(len(frame))
            if index is None:
                return  # handled before the reconnect: a resend
            if self._probe is not None:
                self._count(index)
            self._rt.on_frame(frame)
            if receiver.ack_due or not self._ack_pending:
                self._acknowledge(on_loop=True)  # (else one is on its way)

    def frame_on_thread(self, conn: transports.Connection, frame: memoryview) -> bool:
        """A frame read by a thread (``core/_leader.py``), not by the loop: a thread blocked
        in ``Future.get`` or an idle actor thread waiting for its next message. Replies,
        and calls to actors that have a thread, are handled here as the loop would handle
        them; False leaves any other frame to the loop (the thread hands the connection back
        with the frame unread, so the loop handles it in order). A simulation's threads read
        through here too (sim/_leading.py)."""
        receiver = self._receiver
        size = len(frame)
        if receiver.state is None or size < _REPLY_FIELDS_BYTES:
            return False  # (shorter: an acknowledgement, a session, or malformed: the loop's)
        rt = self._rt
        call: Call | None = None
        compact = False
        # The kind, told once by the first u32, unpacked with a compact reply's fields (which
        # other kinds do not use): one unpack, where slicing the view and comparing the
        # bytes of its head to each mark cost about 1,500 instructions a frame.
        head, port_id, reply_index, status = _reply_fields(frame)
        if head == _REPLY_HEAD:
            compact = True  # (its port is looked up under the lock, below)
        elif head == _CALL_HEAD:
            # Only a call to an actor with a thread (a proc's actor thread); any other is left
            # to the loop unread past its route (its payload is decoded once, there).
            try:
                call = _decode_compact_call(frame, self._threaded)
            except ValueError:
                return False  # malformed: the loop meets it and closes the connection
            if call is None:
                return False
        elif head in _BINARY_HEADS:
            return False  # a session, an acknowledgement: the loop's
        elif size >= _BULK_REPLY:
            # A big reply with out-of-band parts (shm lane) in the envelope layout: taken
            # here too, not left to the loop (a hand-back, a loop wake-up and a hop to this
            # thread: about 250 us of CPU per 1 MiB echo here). Its small envelope is
            # unpickled twice. Or a call with out-of-band arguments (below).
            try:
                bulk = _codec.bulk_reply_port(frame)
            except ValueError:
                return False  # malformed: the loop meets it and closes the connection
            if bulk is not None:
                handler = rt.ports.get(bulk)
                if handler is None or not handler.on_any_thread:
                    return False
            else:
                call = self._envelope_call(frame, head)
                if call is None:
                    return False
        else:
            # A call in the envelope layout (out-of-band arguments): as above.
            call = self._envelope_call(frame, head)
            if call is None:
                return False
        with rt.dispatch_lock:
            if compact:
                # Only port handlers that say so run off the loop (an endpoint call's
                # replies, acknowledgements); the others (log sink, channels, ...) expect the
                # trio thread. Looked up once, under the lock, and handed to ``deliver_reply``
                # (as the loop's looks it up under the lock before it delivers).
                handler = rt.ports.get(port_id)
                if handler is None or not handler.on_any_thread:
                    return False
            index = receiver.frame(size)
            # Numbered: the frame is taken, whatever happens next (the reader moves past it).
            # An error after this point (a KeyboardInterrupt on the main thread) is raised
            # once the frame counts as handled.
            try:
                if index is not None:
                    if self._probe is not None:
                        self._count(index)
                    if call is not None:
                        cell = rt.actors.get(call.actor)  # (else: gone meanwhile, or limbo)
                        if cell is not None:
                            cell.accept(call)
                            if self._metered:
                                count_received(rt, call, size)
                        else:
                            rt.to_actor(call.actor, call)
                    elif compact:  # its fields to its port, no record (as Runtime.on_frame)
                        rt.deliver_reply(port_id, reply_index, status, _reply_value(frame), handler)
                    else:
                        try:
                            rt.on_frame(frame)
                        except Exception as exc:  # malformed: the loop closes the connection
                            log.error(
                                "closing connection to %s after bad frame: %r", conn.peer, exc
                            )
                            rt.call_soon(conn.close)
                            return True
                if receiver.ack_due or not self._ack_pending:
                    self._acknowledge(on_loop=False)  # (else one is on its way)
            except BaseException as exc:
                self._raise_later(conn, exc)
        return True

    def _envelope_call(self, frame: memoryview, env_len: int) -> Call | None:
        """The call to an actor with a thread that ``frame`` (envelope layout) carries; None
        for any other frame, or a malformed one (the loop meets it and closes the
        connection)."""
        try:
            return _codec.decode_envelope_call(frame, env_len, self._threaded)
        except ValueError:
            return None

    def _raise_later(self, conn: transports.Connection, exc: BaseException) -> None:
        """An error out of handling a frame on a thread, once that frame counts as taken:
        the reading thread raises it once it has put the connection in order (``Leader``
        checks :data:`deferred` after each read), so the frame is not handled twice. On the
        loop it is raised at once."""
        if self._rt.on_runtime_thread():
            raise exc
        deferred.error = exc

    def _session_frame(self, conn: transports.Connection, frame: memoryview) -> None:
        """The first frame of a connection (its SESSION; any frame of a peer without
        sessions), or a SESSION later on (dispatch lock held)."""
        msg = _codec.decode(frame)
        if type(msg) is Session:
            # raises for a forgotten session
            sessions = self._rt.inbound
            state = sessions.opened(msg.session, msg.first)
            previous = self._receiver.started(msg.session, msg.first, state)
            if previous is not None:
                sessions.closed(previous)
            self._conn = conn
            readable = transports.thread_readable(conn)
            if readable is not None:  # threads waiting for replies may read it
                sessions.leadable[id(self)] = readable
        else:
            self._rt.dispatch(msg)  # a peer without sessions (tests, tools)

    # The bookkeeping both readers (the loop, a thread) do for a numbered frame.

    def _count(self, index: int) -> None:
        """Frame ``index`` of the session is being handled (the simulator's probe counts;
        callers test for a probe first: without one, as in production, nothing to do)."""
        probe = self._probe
        if probe is not None:
            assert self._receiver.session is not None
            probe.frame_handled(self._rt, self._receiver.session, index)

    def _acknowledge(self, *, on_loop: bool) -> None:
        """Acknowledge now (every ``ack_every`` frames or ``ack_bytes`` bytes: until
        acknowledged the sender keeps them for a resend) or within the delay."""
        if self._receiver.ack_due:
            self.ack()
        elif not self._ack_pending:
            self._ack_pending = True
            rt = self._rt
            sessions = rt.inbound
            if on_loop:
                sessions.ack_later(self)
            elif not sessions.join_scheduled_ack(self):
                rt.call_soon(lambda: sessions.ack_later(self))

    def ack(self) -> None:
        with self._rt.dispatch_lock:
            self._ack()

    def _ack(self) -> None:
        self._ack_pending = False
        conn = self._conn
        if conn is None or conn.closed:
            return
        count = self._receiver.ack()
        if count is not None:
            # (Not an answer, ``send_nowait``'s default: the mark a reading thread's wait
            # left, core/_waiting.py, stays for the frame that answers what it waited for.)
            try:
                conn.send_nowait(_codec.encode(Ack(count)))
            except transports.TransportError:
                pass
            except Exception:
                raise
            except BaseException:
                # An interrupt (Ctrl-C on a reading main thread) inside the write: the
                # acknowledgement may be half written, and the next one's bytes would be
                # read as its rest. The connection goes; its sender resumes the session on
                # a new one (and this side drops what it handled already). Nothing more is
                # written on it meanwhile (acknowledgements are all this side writes there).
                self._conn = None
                try:
                    self._rt.call_soon(conn.close)
                except (trio.RunFinishedError, RuntimeError):
                    pass  # the runtime is closing: its connections close with it
                raise

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        self._conn = None
        sessions = self._rt.inbound
        sessions.leadable.pop(id(self), None)
        session = self._receiver.ended()
        if session is not None:
            sessions.closed(session)


class InboundSessions:
    """The runtime's inbound sessions (a component of :class:`Runtime`, ``rt.inbound``):
    which frames of each session were handled (:class:`~._delivery.SessionTable`), when
    their acknowledgements go out (batched), and which inbound connections a waiting thread
    may read (``core/_leader.py``)."""

    def __init__(
        self,
        config: Config,
        env: Environment,
        dispatch_lock: threading.RLock,
        start_soon: Callable[[Callable[[], Any]], None],
    ) -> None:
        self._config = config
        self._ack_delay = env.ack_delay
        #: Held while a frame is handled, on the loop or on a thread reading its own reply
        #: (the runtime's).
        self._dispatch_lock = dispatch_lock
        self._start_soon = start_soon
        #: Inbound connections a waiting thread may read, by sink.
        self.leadable: dict[int, transports.ThreadReadable] = {}
        self._table = SessionTable()
        self._to_ack: dict[int, InboundSink] = {}  # insertion-ordered: deterministic
        #: A flush of acknowledgements is scheduled (the simulator's ticker looks).
        self.ack_scheduled = False

    @property
    def delivered(self) -> dict[str, _Inbound]:
        """The inbound sessions this runtime remembers, by id."""
        return self._table.sessions

    def opened(self, session: str, first: int) -> _Inbound:
        """A connection of inbound ``session`` started at frame ``first``. A session
        resumed after this runtime forgot it cannot be taken (``ValueError``): which of its
        frames were handled is no longer known."""
        return self._table.opened(session, first)

    def closed(self, session: str) -> None:
        self._table.closed(session, trio.current_time())

    def forget_idle(self, now: float) -> None:
        """Drop sessions that cannot come back: a sender gives up reconnecting
        ``delivery_timeout`` after it noticed its link broke, which can be up to
        ``delivery_timeout`` (plus a watchdog tick) after we noticed; after three times that
        no resend of theirs can arrive."""
        config = self._config
        horizon = 3 * config.delivery_timeout + 2 * config.heartbeat_interval
        self._table.expire(now, horizon)

    def ack_later(self, sink: InboundSink) -> None:
        """Acknowledge ``sink``'s frames within ``ack_delay`` (on the trio thread)."""
        with self._dispatch_lock:  # (a thread that reads may join a scheduled flush)
            self._to_ack[id(sink)] = sink
            if self.ack_scheduled:
                return
            self.ack_scheduled = True
        self._start_soon(self._flush_acks)

    def join_scheduled_ack(self, sink: InboundSink) -> bool:
        """From a thread that read ``sink``'s frames, holding the dispatch lock: add it to
        the flush already scheduled (which takes that lock to collect its sinks), without
        waking the loop; False when none is (the caller schedules one on the loop). While
        frames flow, a thread that acknowledges every ``ack_every`` frames would otherwise
        wake the loop once per that many frames to schedule the next one."""
        if not self.ack_scheduled:
            return False
        self._to_ack[id(sink)] = sink
        return True

    async def _flush_acks(self) -> None:
        await trio.sleep(self._ack_delay)
        with self._dispatch_lock:  # sinks that joined on a thread are in, or see it unscheduled
            self.ack_scheduled = False
            sinks, self._to_ack = self._to_ack, {}
        for sink in sinks.values():
            sink.ack()
