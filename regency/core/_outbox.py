"""The way out to one destination: :class:`Outbox`, the shell that runs a delivery session
(:class:`regency.core._delivery.Outbound`) on the runtime's transport. The machine decides;
this module dials, writes, closes and reports (the inbound half is
:mod:`regency.core._inbound`)."""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

import trio

from .. import transports
from . import _codec
from ._delivery import (
    CONNECTED,
    FAILED,
    Action,
    Close,
    Dial,
    GiveUp,
    Outbound,
    SessionFailed,
    Stalled,
    Transmit,
)
from ._errors import UndeliverableError
from ._future import Future
from ._messages import Ack, Session
from ._waiting import here as _here

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")


class Outbox:
    """The way out to one destination address: queues until connected, then writes through,
    and survives a broken connection (see :mod:`regency.core._delivery`).

    ``send`` is thread-safe and never blocks. The first send schedules the connect on the
    trio thread; frames sent meanwhile queue and are flushed, in order, before the
    connection is published to later senders. Every write happens under the outbox's lock,
    so frames from one process to one destination go out in the order they were sent.
    """

    def __init__(self, runtime: Runtime, address: str) -> None:
        self._rt = runtime
        self._probe = runtime.env.probe  # the environment never changes
        self._max_frame = runtime.config.max_frame_bytes  # nor does a runtime's config
        self.address = address
        self._lock = threading.Lock()
        config = runtime.config
        self._machine = Outbound(
            runtime.new_session_id(),
            window=config.send_window,
            buffer_bytes=config.send_buffer_bytes,
            size_of=_frame_size,
        )
        #: Threads that wait for room (``send_buffer_bytes``): each waits on a future of its
        #: own, through its waiter (core/_waiting.py: a lock, its reply-reading leader, or a
        #: simulation's lockstep turn), resolved when acknowledgements make room.
        self._room_waits: list[Future[None]] = []
        #: Whether "waiting for a busy peer" was logged for the current stall.
        self._busy_logged = False
        #: When :meth:`check_stalled` last ran (the watchdog's time).
        self._checked_at: float | None = None
        #: When the runtime's watchdog first saw this outbox failed (it is forgotten later).
        self.broken_at: float | None = None
        #: The session's frame count after this runtime's last direct actor message through
        #: this outbox (``Casting``: a tree cast to a proc with one not yet acknowledged
        #: goes directly too, behind it).
        self.direct_mark = 0

    @property
    def _session(self) -> str:
        return self._machine.session

    @property
    def _unacked(self) -> deque[transports.Frame]:
        """Frames sent and not yet acknowledged (the machine's, oldest first)."""
        return self._machine.unacked

    def send(self, frame: transports.Frame, direct: bool = False) -> int:
        """Send ``frame``; returns how many frames the session has queued, this one
        included (what the receiver's acknowledgement must reach for it to be handled).
        ``direct``: a direct actor message, whose count becomes :attr:`direct_mark` under
        the lock (stored after it, two threads' marks could land in the wrong order)."""
        size = len(frame) if type(frame) is bytes else transports.frame_size(frame)
        if size > self._max_frame:
            raise ValueError(
                f"message of {size} bytes exceeds max_frame_bytes={self._max_frame}; raise "
                "it with regency.configure(max_frame_bytes=...)"
            )
        machine = self._machine
        # ``with``, not acquire()/try/release(): acquire() returning is a point where
        # Python 3.11 raises a pending KeyboardInterrupt (or the SIGUSR2 UnhandledFault),
        # outside the try, leaving the lock held for good; ``with`` has no such point (the
        # other form saved about 1,000 instructions a message; the review took it back).
        interrupted: list[Action] | None = None
        try:
            with self._lock:
                if machine.pending and not machine.has_room(size):
                    self._wait_for_room(size)
                probe = self._probe
                if probe is not None and machine.cause is None:
                    probe.frame_sent(
                        self._rt, self.address, machine.session, machine.queued_count
                    )
                # The window's bytes with this frame in flight (``unacked_bytes`` is 0 when
                # nothing is: then the frame goes whatever its size), summed once.
                unacked = machine.unacked
                in_flight = machine.unacked_bytes + size
                if (
                    machine.state == CONNECTED
                    and not machine.pending
                    and (
                        # (the common case first: frames in flight, the window open)
                        (len(unacked) < machine.window and in_flight <= machine.window_bytes)
                        or not unacked
                    )
                ):
                    # What machine.queued(frame) does when connected (then it says SEND_NOW),
                    # written out: a call less per message (about 600 instructions). Counted
                    # before it is queued: an interrupt in between leaves the count ahead (a
                    # later tree cast waits longer), never behind (it could overtake).
                    count = machine.queued_count = machine.queued_count + 1
                    mark = self.direct_mark  # (set before the write: never behind it)
                    if direct:
                        self.direct_mark = count
                    link = machine.link
                    try:
                        # (In the try: a signal pending since the lock was taken is raised
                        # as append returns, the frame queued and not written.)
                        unacked.append(frame)
                        machine.unacked_bytes = in_flight
                        # The first frame a thread sends after it waited for a message
                        # answers it: sent at once, not coalesced (core/_waiting.py).
                        answer = _here.waited
                        if answer:
                            _here.waited = False
                        link.send_nowait(frame, answer)
                    except transports.TransportError:
                        pass  # kept unacknowledged; the lost connection brings a resend
                    except Exception:
                        # An error of this frame's (no memory to seal it, say), raised
                        # before any of it was written: it was never sent.
                        machine.withdraw(frame)
                        self.direct_mark = mark
                        raise
                    except BaseException:
                        # An interrupt (Ctrl-C, the SIGUSR2 fault) inside the write: the
                        # frame may be unwritten or half written while the session counts
                        # it as sent, and the receiver would number the next frame in its
                        # place. The connection goes; the session resumes on a new one
                        # from what the receiver acknowledged (it drops what it handled).
                        cause = transports.ConnectionBroken("a write to it was interrupted")
                        interrupted = [Close(link, str(cause)), *machine.lost(link, cause)]
                        raise
                    return count
                try:
                    action = machine.queued(frame, size)
                except SessionFailed as exc:
                    raise UndeliverableError(
                        f"cannot deliver to the proc at {self.address}: {exc.cause}"
                    ) from None
                count = machine.queued_count
                if direct:
                    self.direct_mark = count
        finally:
            if interrupted is not None:  # (on the loop: closing is the loop's to do)
                try:
                    self._rt.call_soon(functools.partial(self._after, interrupted))
                except (trio.RunFinishedError, RuntimeError):
                    pass  # the runtime is closing: its connections close with it
        if isinstance(action, Dial):  # the session's first
            self._after([action])
        return count

    def _wait_for_room(self, size: int) -> None:
        """Under the lock: ``send_buffer_bytes`` are waiting for the window. A thread waits
        until acknowledgements make room or the session fails (the delivery timeout bounds
        a wait on a peer that stopped acknowledging: the session reconnects or gives up); a
        sender on the loop, which would wait for itself, raises."""
        machine = self._machine
        if self._rt.on_runtime_thread():
            raise SendBufferFull(
                f"cannot send {size} bytes to the proc at {self.address}: "
                f"{machine.pending_bytes} bytes in {len(machine.pending)} message(s) already "
                f"wait for it to acknowledge (send_buffer_bytes={machine.buffer_bytes}; "
                f"{len(machine.unacked)} in flight, send_window={machine.window}). The "
                "receiver does not keep up with this sender, and a sender on the runtime's "
                "loop (an async endpoint or an asyncio task) cannot wait for it: slow the "
                "sender down (await replies, or send from a thread, which waits for room), or "
                "raise send_buffer_bytes with regency.configure(...)"
            )
        while not machine.has_room(size):
            room: Future[None] = Future()
            self._room_waits.append(room)
            self._lock.release()  # (the sender's ``with`` takes it again and releases it)
            try:
                room.get(self._rt.config.heartbeat_interval)
            except TimeoutError:
                pass  # look again: the session may have failed meanwhile
            finally:
                self._lock.acquire()

    def _wake_room(self) -> None:
        """Under the lock: threads waiting for room look again."""
        waits, self._room_waits = self._room_waits, []
        for room in waits:
            room.set_result(None)

    def acknowledged(self, count: int) -> None:
        """The receiver handled the session's first ``count`` frames: what waited for the
        window goes out, and threads waiting for room are woken."""
        with self._lock:
            machine = self._machine
            waiting = bool(machine.pending)
            actions = machine.acknowledged(count)
            if actions:
                self._perform(actions)
            if waiting:
                self._wake_room()

    def check_stalled(self, now: float) -> None:
        """Called every ``heartbeat_interval`` on the trio thread (see
        :meth:`Outbound.tick`). A stalled peer that is busy, not stuck (a local child whose
        CPU time advances while it is silent: a long call holding its GIL), is waited for;
        a dead or stopped one is dropped and dialed again."""
        config = self._rt.config
        timeout = config.delivery_timeout
        # A tick long overdue means this runtime's own loop was held (busy with a flood of
        # frames, say): the acknowledgements may be waiting unread in our socket, so the
        # peer's silence cannot be judged this time (the wait restarts, as for a busy one).
        late = (
            self._checked_at is not None
            and now - self._checked_at > max(3 * config.heartbeat_interval, timeout / 4)
        )
        self._checked_at = now
        with self._lock:
            waited = self._machine.stalled_for(now)
        # Looked at from half the timeout on: a proc's first look only starts its record.
        busy = waited >= timeout / 2 and self._peer_busy(now)
        overdue = busy and waited >= timeout
        with self._lock:
            actions = self._machine.tick(now, timeout, busy or late)
        if overdue and not self._busy_logged:
            self._busy_logged = True
            log.warning(
                "no acknowledgement from %s for %.1f s, but the proc is busy (its CPU time "
                "advances: a long call holding its GIL), not stuck; waiting for it",
                self.address,
                timeout,
            )
        elif not waited:
            self._busy_logged = False
        if actions:
            if isinstance(actions[0], Close):
                log.warning("no acknowledgement from %s (%s); reconnecting", self.address,
                            actions[0].reason)
            else:
                log.warning("no dial to %s began within two heartbeats (an interrupt?); "
                            "dialing again", self.address)
            self._after(actions)

    def _peer_busy(self, now: float) -> bool:
        """Whether the peer is known to be alive and computing (``Runtime.peer_busy``)."""
        try:
            return self._rt.peer_busy(self.address, now)
        except Exception:  # a look at /proc must never break the watchdog
            log.debug("could not tell whether %s is busy", self.address, exc_info=True)
            return False

    def _perform(self, actions: list[Action]) -> list[Action]:
        """Write what the machine says to write (under the lock); return the rest."""
        rest: list[Action] = []
        for action in actions:
            if isinstance(action, Transmit):
                try:
                    if action.resume_at is not None:
                        session = Session(self._machine.session, action.resume_at)
                        action.link.send_nowait(_codec.encode(session))
                    for frame in action.frames:
                        action.link.send_nowait(frame)
                except transports.TransportError:
                    pass  # it broke again: its connection_lost starts the next attempt
            else:
                rest.append(action)
        return rest

    def _after(self, actions: list[Action]) -> None:
        """Carry out what must not happen under the lock (closing may report a loss)."""
        for action in actions:
            if isinstance(action, Dial):
                if action.first:
                    self._rt.call_soon(functools.partial(self._start, action))
                elif not self._rt.closing:
                    # (Closing, the runtime does not reconnect: its connections close with
                    # it, and a peer that exits at the same time breaks them first.)
                    try:
                        self._rt.start_soon(self._reconnect, action)
                    except trio.RunFinishedError:
                        pass  # its loop ended meanwhile (we are on another thread)
            elif isinstance(action, Close):
                action.link.close()
            elif isinstance(action, GiveUp):
                probe = self._rt.probe
                if probe is not None:
                    probe.session_failed(self._rt, self.address, self._machine.session)
                self._rt.link_failed(self.address, action.cause)
            elif isinstance(action, Transmit):
                with self._lock:
                    self._perform([action])

    def _start(self, dial: Dial) -> None:
        if not self._rt.closing:  # (as for a reconnect: nothing to connect for any more)
            self._rt.nursery.start_soon(self._connect, dial)

    def _begin_dial(self, dial: Dial) -> bool:
        """Whether this attempt may carry ``dial`` out (``Outbound.begin_dial``)."""
        with self._lock:
            return self._machine.begin_dial(dial)

    async def _connect(self, dial: Dial) -> None:
        if not self._begin_dial(dial):
            return
        try:
            ready = self._rt.child_ready.get(self.address)
            if ready is not None:
                with trio.fail_after(self._rt.config.spawn_timeout):
                    await ready.wait()
                if self._machine.cause is not None:
                    return
            within = self._rt.config.spawn_timeout
            conn = await self._dial(within, refused_for=within)
        except (transports.TransportError, trio.TooSlowError, OSError, ValueError) as exc:
            if isinstance(exc, trio.TooSlowError):
                exc = TimeoutError(
                    f"proc did not start within spawn_timeout={self._rt.config.spawn_timeout} s"
                )
            self.give_up(exc)
            return
        self._resume(conn)

    def _resume(self, conn: transports.Connection) -> None:
        """A dial succeeded: start the session on ``conn``, resending what is unacknowledged,
        then what queued."""
        with self._lock:
            rest = self._perform(self._machine.connected(conn))
            self._wake_room()  # what waited joined the session: room for more
        if rest:
            self._after(rest)

    async def _dial(self, within: float, *, refused_for: float) -> transports.Connection:
        """Connect, retrying for ``within`` seconds, and while the address refuses for
        ``refused_for`` of them (while a proc starts nothing listens yet: a sibling may still
        be starting; on a network address, a relay or proxy in between may be restarting).
        A wrong secret or wire version fails at once, and so does a session given up
        meanwhile (the peer exited)."""
        start = trio.current_time()
        deadline = start + within
        refused_until = start + min(refused_for, within)
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
            except (transports.AuthenticationError, transports.IncompatiblePeer):
                raise
            except transports.ConnectionRefused:
                if trio.current_time() + delay > refused_until:
                    raise
            except transports.ConnectionBroken:
                if trio.current_time() + delay > deadline:
                    raise
            if self._machine.state == FAILED:
                assert self._machine.cause is not None
                raise transports.ConnectionBroken(str(self._machine.cause))
            await trio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _connection_lost(self, conn: transports.Connection, exc: BaseException) -> None:
        with self._lock:
            actions = self._machine.lost(conn, exc)
        if actions:
            self._after(actions)

    async def _reconnect(self, dial: Dial) -> None:
        if not self._begin_dial(dial):
            return
        cause = dial.cause
        if isinstance(cause, Stalled):
            cause = transports.ConnectionBroken(f"connection to {self.address} is broken: {cause}")
        assert cause is not None
        child = self._rt.children.get(self.address)
        if child is not None and child.returncode is not None:
            self.give_up(cause)
            return
        within = self._rt.config.delivery_timeout
        # A refusal on a local socket means the proc is gone (nothing else can listen at
        # its path). On a network address it may be a relay, proxy or load balancer in
        # between that restarts: keep dialing for ``reconnect_refused_s``. The transport
        # says which (``Transport.refusal_is_final``).
        final = self._rt.transport.refusal_is_final(self.address)
        refused_for = 0.0 if final else self._rt.config.reconnect_refused_s
        while True:
            try:
                conn = await self._dial(within, refused_for=refused_for)
            except (transports.TransportError, OSError, ValueError) as exc:
                # (ValueError: a peer of another wire version, a bad lane or seal, as
                # _connect.) A proc of this host that is silent but computing (a long call holding
                # its GIL) cannot answer a dial until the call returns: it is waited for
                # (another window each time), as its acknowledgements are (check_stalled).
                # Not one that refuses: its listener is gone (it is exiting).
                if (
                    isinstance(exc, transports.ConnectionBroken)
                    and not isinstance(
                        exc,
                        transports.ConnectionRefused
                        | transports.AuthenticationError
                        | transports.IncompatiblePeer,
                    )
                    and self._machine.state != FAILED
                    and self._peer_busy(trio.current_time())
                ):
                    log.warning(
                        "no reconnection to %s within %.1f s, but the proc is busy (its CPU "
                        "time advances), not stuck; dialing again",
                        self.address,
                        within,
                    )
                    continue
                refused = isinstance(exc, transports.ConnectionRefused)
                self.give_up(
                    cause
                    if refused and not refused_for
                    else ConnectionError(
                        f"{cause}; no reconnection within "
                        f"{min(refused_for, within) if refused else within} s ({exc})"
                    )
                )
                return
            break
        log.info("reconnected to %s; resending %d frame(s)", self.address, len(self._unacked))
        self._resume(conn)

    def give_up(self, exc: BaseException) -> None:
        """Give up: the peer exited or cannot be reached."""
        # Kept for later senders' errors; its traceback would keep the frames (and receive
        # buffers) of the reader that raised it alive.
        exc = exc.with_traceback(None)
        with self._lock:
            actions = self._machine.give_up(exc)
            self._wake_room()  # threads waiting for room raise the session's error
        if actions:
            self._after(actions)

    # -- what others may read -------------------------------------------------------------

    def direct_unacked(self) -> bool:
        """Whether a direct actor message sent through this outbox is not yet acknowledged
        (a cast to the proc then goes directly too, not down a tree: ``Casting``)."""
        return self._machine.acked < self.direct_mark

    @property
    def idle(self) -> bool:
        """Whether no frame waits for an acknowledgement or for the link."""
        machine = self._machine
        return not (machine.unacked or machine.pending)

    @property
    def failed(self) -> bool:
        """Whether the session was given up: the peer is gone for good."""
        return self._machine.state == FAILED

    def close(self) -> None:
        conn = self._machine.link
        if conn is not None:
            conn.close()



class SendBufferFull(UndeliverableError):
    """A sender on a runtime's loop queued more than ``send_buffer_bytes`` for one peer that
    does not keep up (a thread would wait for room instead). Nothing was sent or lost: the
    message that raised was not queued; those before it are delivered in order."""


def _frame_size(frame: transports.Frame) -> int:
    return len(frame) if type(frame) is bytes else transports.frame_size(frame)


class _OutboundSink:
    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        msg = _codec.decode(frame)
        if type(msg) is Ack:
            self._outbox.acknowledged(msg.count)
        else:
            rt = self._outbox._rt
            with rt.dispatch_lock:
                rt.dispatch(msg)

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        if exc is None:
            return  # we closed it
        self._outbox._connection_lost(conn, exc)
