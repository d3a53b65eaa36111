"""Delivery sessions as pure state machines: events in, actions out, no I/O, no clock.

A process sends to another over one *session* at a time: the sender numbers every frame it
queues (0, 1, 2, ...), and each connection it opens starts with ``SESSION(id, first)``, so the
receiver knows the number of every frame that follows. The receiver hands each frame on once,
drops what it already handled (a resend after a reconnect), and acknowledges (``ACK(n)``:
every frame below ``n`` was handled). The sender keeps frames until acknowledged; when a
connection breaks, or goes silent with frames unacknowledged for the delivery timeout, it
dials again and resends them. When it cannot reconnect, or the peer is known to have exited,
it gives up: the link is failed and later sends raise.

Flow control: a session keeps at most ``window`` frames (and, past its first frame,
``window_bytes`` bytes) in flight, sent and not yet acknowledged; frames queued beyond that
wait in the sender (``pending``) and go out as acknowledgements come. What a receiver that
falls behind has in its socket buffers, and a sender in flight, is thus bounded however fast
the sender produces. What waits is bounded by the shell: ``has_room`` says
whether ``buffer_bytes`` allow one more frame (the shell then blocks a thread that sends, or
raises to a sender on the loop, which cannot wait; see ``Outbox.send``).

* :class:`Outbound` is one sender's session to one destination. Events: :meth:`queued`,
  :meth:`connected`, :meth:`acknowledged`, :meth:`lost`, :meth:`dial_failed`, :meth:`tick`,
  :meth:`give_up`; actions: :class:`Transmit`, :class:`Dial`, :class:`Close`,
  :class:`GiveUp`. The shell (:mod:`regency.core._outbox`) performs them on a transport.
* :class:`Receiver` is one inbound connection, :class:`SessionTable` the receiving process's
  sessions (shared by their connections, forgotten once no resend can come). The shell is
  :mod:`regency.core._inbound`.

Frames and connections are opaque here (the shells' objects); times are numbers the shell
passes in. Errors are values: an event on a failed session returns nothing or raises
:class:`SessionFailed`, never blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

Link = Any  # a connection, opaque to the machine
Frame = Any  # a frame, opaque to the machine

#: Frames a session keeps in flight at most (``Config.send_window``). Far above the
#: receiver's ``ack_every`` (1,024 in production), so acknowledgements come long before the
#: window closes: a pipelined burst of small calls never waits for one (at 2,048, 20,000
#: pipelined calls ran 15-20 % slower); the bytes in flight bound memory (``WINDOW_BYTES``).
WINDOW = 65536
#: Bytes a session keeps in flight at most, past its oldest unacknowledged frame (one frame
#: bigger than this goes alone). Receivers acknowledge every 256 KiB (``ACK_BYTES``).
WINDOW_BYTES = 32 << 20
#: Bytes of frames a sender may hold for one destination beyond the window
#: (``Config.send_buffer_bytes``).
BUFFER_BYTES = 256 << 20


def _unsized(frame: Frame) -> int:
    return 0


class Stalled(Exception):
    """Frames went unacknowledged for the delivery timeout on a connection."""


class SessionFailed(Exception):
    """The session gave up; ``cause`` is why (what :class:`GiveUp` carried)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class ForgottenSession(ValueError):
    """A connection resumed a session the receiver no longer knows (idle for longer than any
    sender keeps reconnecting): which of its frames were handled is unknown."""


# -- actions --------------------------------------------------------------------------------


@attrs.frozen
class Transmit:
    """Write ``frames`` on ``link``, in order, after ``SESSION(session, resume_at)`` when
    ``resume_at`` is not None (the start of a connection)."""

    link: Link
    frames: tuple[Frame, ...]
    resume_at: int | None = None


@attrs.frozen(eq=False)
class Dial:
    """Open a connection and report :meth:`Outbound.connected` or
    :meth:`Outbound.dial_failed`, after :meth:`Outbound.begin_dial` says to go ahead (False:
    this Dial is no longer the one to carry out, or another copy of it began). ``first``:
    the session's first connection (the peer may still be starting); otherwise a reconnect
    after ``cause``. Compared by identity: each Dial the machine hands out is its own."""

    first: bool
    cause: BaseException | None = None


@attrs.frozen
class Close:
    """Close ``link`` (the machine no longer uses it)."""

    link: Link
    reason: str


@attrs.frozen
class GiveUp:
    """The session failed for good: fail whatever waits on the peer."""

    cause: BaseException


class _SendNow:
    """Write the frame just queued on the current link (the common case, allocation-free)."""

    def __repr__(self) -> str:
        return "SEND_NOW"


SEND_NOW = _SendNow()

Action = Transmit | Dial | Close | GiveUp

# -- states of an Outbound -------------------------------------------------------------------

IDLE = "idle"  # nothing queued yet, no connection
DIALING = "dialing"  # a Dial is out; frames queue
CONNECTED = "connected"  # frames go out as they are queued
FAILED = "failed"  # gave up; final


@attrs.define
class Outbound:
    """One sender's delivery session to one destination.

    Invariants: frames ``acked .. acked + len(unacked)`` went out on some connection and are
    not yet acknowledged; ``pending`` queued while no connection was up and go out, after the
    unacknowledged ones, when one comes. A failed session holds nothing and stays failed.
    """

    session: str
    state: str = IDLE
    #: The live connection while CONNECTED (None otherwise).
    link: Link = None
    #: How many frames of the session the receiver has acknowledged.
    acked: int = 0
    unacked: deque[Frame] = attrs.field(factory=deque)
    #: (No converter, nor any validator: one would make attrs hook every assignment to
    #: the record, four calls on each frame a sender counts; tests/core/test_hot_path.py.)
    pending: deque[Frame] = attrs.field(factory=deque)
    cause: BaseException | None = None
    #: Since when frames have waited for an acknowledgement that did not come, and how many
    #: were acknowledged then (see :meth:`tick`).
    stalled_since: float | None = None
    stalled_at: int = 0
    #: How many frames were ever queued: the number the next frame gets (``acked +
    #: len(unacked) + len(pending)`` until the session fails; counted, not summed, because
    #: a sender reads it after every frame it sends, see ``Outbox.direct_mark``).
    queued_count: int = 0
    #: The Dial to carry out while no attempt has begun (:meth:`begin_dial`), whether one
    #: has begun and not ended, and how many ticks have found the session waiting for a
    #: connection with no attempt begun. The first Dial is handed to the thread that sent
    #: the first frame, which schedules it after it lets go of the lock: a
    #: KeyboardInterrupt there (or inside :meth:`queued`) would lose it and leave every
    #: later frame queued for good; :meth:`tick` dials again instead.
    unbegun: Dial | None = None
    attempt: bool = False
    idle_ticks: int = 0
    #: Flow control (see the module's docstring): frames and bytes in flight at most, and
    #: bytes that may wait beyond them (``has_room``).
    window: int = WINDOW
    window_bytes: int = WINDOW_BYTES
    buffer_bytes: int = BUFFER_BYTES
    #: The size of a frame in bytes (the shell's; frames are opaque here).
    size_of: Callable[[Frame], int] = _unsized
    #: Bytes of the frames in ``unacked`` and in ``pending``.
    unacked_bytes: int = 0
    pending_bytes: int = 0

    def has_room(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes may be queued now: it goes out at once, or it
        fits the ``buffer_bytes`` that may wait for the window (or nothing waits: one frame
        bigger than the whole buffer still goes, alone). A failed session has room: queuing
        raises its error."""
        return (
            not self.pending
            or self.pending_bytes + size <= self.buffer_bytes
            or self.state == FAILED
        )

    def _fits(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes may go out now without exceeding the window."""
        unacked = self.unacked
        return not unacked or (
            len(unacked) < self.window and self.unacked_bytes + size <= self.window_bytes
        )

    def queued(self, frame: Frame, size: int = 0) -> _SendNow | Dial | None:
        """Send ``frame`` of ``size`` bytes (numbered :attr:`queued_count`): :data:`SEND_NOW`
        when a link is up and the window open, a first :class:`Dial`, or None (it waits
        for the link or the window). Raises :class:`SessionFailed` on a failed session.
        (``Outbox.send`` writes the connected case out: keep the two alike.)"""
        state = self.state
        # Counted before queued (see Outbox.send): never behind what is queued.
        if state == CONNECTED and not self.pending and self._fits(size):
            self.queued_count += 1
            self.unacked.append(frame)
            self.unacked_bytes += size
            return SEND_NOW
        if state == FAILED:
            assert self.cause is not None
            raise SessionFailed(self.cause)
        self.queued_count += 1
        self.pending.append(frame)
        self.pending_bytes += size
        if state == IDLE:
            return self._dial(True)
        return None

    def _admit(self) -> list[Frame]:
        """Move what the window now allows from ``pending`` to ``unacked``; returns it."""
        pending = self.pending
        moved: list[Frame] = []
        size_of = self.size_of
        while pending:
            size = size_of(pending[0])
            if not self._fits(size):
                break
            frame = pending.popleft()
            self.unacked.append(frame)
            self.unacked_bytes += size
            self.pending_bytes -= size
            moved.append(frame)
        if not pending:
            self.pending_bytes = 0
        return moved

    def withdraw(self, frame: Frame) -> None:
        """``frame``, just queued to a link, was not written at all (its write failed with
        an error of its own before any byte went out): it was never sent, so it takes no
        number (else the receiver would number the next frame in its place)."""
        unacked = self.unacked
        if unacked and unacked[-1] is frame:
            unacked.pop()
            self.unacked_bytes = max(0, self.unacked_bytes - self.size_of(frame))
            self.queued_count -= 1

    def _dial(self, first: bool, cause: BaseException | None = None) -> Dial:
        """Wait for a connection: the Dial to carry out (remembered before the state
        changes: a session never waits for a connection with nothing to dial)."""
        dial = self.unbegun = Dial(first, cause)
        self.state, self.link, self.idle_ticks = DIALING, None, 0
        return dial

    def begin_dial(self, dial: Dial) -> bool:
        """The shell is about to carry out ``dial``: True to go ahead; False when it is not
        the Dial to carry out now (connected or failed meanwhile, a newer Dial since) or
        another copy of it began (one :meth:`tick` handed out again whose first copy was
        late, not lost)."""
        if self.state != DIALING or self.attempt or self.unbegun is not dial:
            return False
        self.unbegun, self.attempt, self.idle_ticks = None, True, 0
        return True

    def connected(self, link: Link) -> list[Action]:
        """The Dial succeeded: start the session on ``link`` and resend."""
        if self.state == FAILED:
            return [Close(link, "the session failed meanwhile")]
        if self.state != DIALING:
            raise RuntimeError(f"connected while {self.state} (no dial was out)")
        # What the window allows of what queued joins the session first, so a write failing
        # part-way loses nothing: what did not go out is resent by the next attempt, in
        # order. (What was unacknowledged is resent whatever the window.)
        self._admit()
        self.state, self.link = CONNECTED, link
        self.stalled_since = None
        self.unbegun, self.attempt = None, False
        return [Transmit(link, tuple(self.unacked), resume_at=self.acked)]

    def acknowledged(self, count: int) -> list[Action]:
        """The receiver handled the session's first ``count`` frames: a :class:`Transmit`
        of what waited for the window, when it now opens."""
        unacked = self.unacked
        n = min(count - self.acked, len(unacked))
        if n <= 0:
            return []
        if n == len(unacked):
            unacked.clear()  # the usual acknowledgement: everything sent so far
            self.unacked_bytes = 0
        else:
            size_of, freed = self.size_of, 0
            for _ in range(n):
                freed += size_of(unacked.popleft())
            self.unacked_bytes = max(0, self.unacked_bytes - freed)
        self.acked += n
        if self.pending and self.state == CONNECTED:
            frames = self._admit()
            if frames:
                return [Transmit(self.link, tuple(frames))]
        return []

    def lost(self, link: Link, cause: BaseException) -> list[Action]:
        """``link`` broke. A stale link (an older connection) changes nothing."""
        if self.state != CONNECTED or self.link is not link:
            return []
        return [self._dial(False, cause)]

    def dial_failed(self, cause: BaseException) -> list[Action]:
        """The Dial failed for good (refused, timed out): give up."""
        return self.give_up(cause)

    def give_up(self, cause: BaseException) -> list[Action]:
        """Fail the session (the peer exited, or cannot be reached)."""
        if self.state == FAILED:
            return []
        actions: list[Action] = []
        if self.link is not None:
            actions.append(Close(self.link, "the session failed"))
        self.state, self.link, self.cause = FAILED, None, cause
        self.unbegun, self.attempt = None, False
        self.pending.clear()
        self.unacked.clear()
        self.pending_bytes = self.unacked_bytes = 0
        actions.append(GiveUp(cause))
        return actions

    def stalled_for(self, now: float) -> float:
        """Seconds the connection's frames have waited for an acknowledgement that did not
        come, as of the last :meth:`tick` (0 when none wait). The shell asks, past a part
        of the timeout, whether the peer is busy (which costs a look at the process), so
        that :meth:`tick` can be told when the timeout comes."""
        if (
            self.state != CONNECTED
            or not self.unacked
            or self.stalled_since is None
            or self.acked != self.stalled_at
        ):
            return 0.0
        return now - self.stalled_since

    def tick(self, now: float, timeout: float, peer_busy: bool = False) -> list[Action]:
        """Called periodically: a connection whose frames have gone unacknowledged for
        ``timeout`` is dead even if nothing said so (a silent network cut); drop it and
        dial again. A live receiver acknowledges well within ``timeout``.

        ``peer_busy``: the peer is known to be alive and computing (its CPU time advances
        and it is not stopped, though it is silent: a long call holding its GIL; see
        ``core/_liveness.py``). Its loop will read and acknowledge when the call returns,
        and a new connection would not be answered before either: the connection is kept
        and the wait starts over.

        A session that has waited for a connection for two ticks with no attempt begun
        dials again: the Dial handed out and lost (see :attr:`unbegun`; if it was only
        late, whichever copy the shell begins second finds :meth:`begin_dial` False), or,
        where a KeyboardInterrupt cut :meth:`queued` short, a first Dial (frames queued
        with the session still idle, or waiting with none remembered). The lock the shell
        holds around every call here means such a state outlives no call in progress."""
        if (self.state == DIALING and not self.attempt) or (
            self.state == IDLE and self.pending
        ):
            self.idle_ticks += 1
            if self.idle_ticks < 2:
                return []
            self.idle_ticks = 0
            dial = self.unbegun if self.state == DIALING else None
            return [dial if dial is not None else self._dial(True)]
        if self.state != CONNECTED or not self.unacked:
            self.stalled_since = None
            return []
        if self.stalled_since is None or self.acked != self.stalled_at:
            self.stalled_since, self.stalled_at = now, self.acked
            return []
        waited = now - self.stalled_since
        if waited < timeout:
            return []
        if peer_busy:
            self.stalled_since = now
            return []
        self.stalled_since = None
        link = self.link
        reason = f"{len(self.unacked)} frame(s) unacknowledged for {waited:.1f} s"
        return [Close(link, reason), self._dial(False, Stalled(reason))]


# -- the receiving side ----------------------------------------------------------------------


@attrs.define
class _Inbound:
    """What a receiving process knows of one session: how many of its frames were handled
    (shared by every connection of the session, so a reconnect that overtakes the old
    connection's last frames still sees them), its open connections, and since when it has
    had none."""

    handled: int = 0
    connections: int = 0
    idle_since: float | None = None


@attrs.define
class SessionTable:
    """The inbound sessions of one process. A session idle for longer than any sender keeps
    reconnecting (``horizon``) is forgotten, so a long-lived process (a worker serving many
    controllers) does not grow with every peer it ever had."""

    sessions: dict[str, _Inbound] = attrs.field(factory=dict)

    def opened(self, session: str, first: int) -> _Inbound:
        """A connection of ``session`` starts at frame ``first``. Raises
        :class:`ForgottenSession` for a session resumed after it was forgotten."""
        state = self.sessions.get(session)
        if state is None:
            if first > 0:
                raise ForgottenSession(
                    f"delivery session {session} resumes at frame {first}, but this process "
                    "forgot it (idle for longer than a sender may reconnect)"
                )
            state = self.sessions[session] = _Inbound()
        state.connections += 1
        state.idle_since = None
        return state

    def closed(self, session: str, now: float) -> None:
        """A connection of ``session`` ended."""
        state = self.sessions.get(session)
        if state is None:
            return
        state.connections -= 1
        if state.connections <= 0:
            state.connections, state.idle_since = 0, now

    def expire(self, now: float, horizon: float) -> list[str]:
        """Forget sessions idle for longer than ``horizon``; returns their ids."""
        expired = [
            s
            for s, state in self.sessions.items()
            if state.idle_since is not None and now - state.idle_since > horizon
        ]
        for session in expired:
            del self.sessions[session]
        return expired

    def any_idle(self) -> bool:
        return any(state.idle_since is not None for state in self.sessions.values())


#: Bytes of frames handled since the last acknowledgement that are acknowledged at once.
ACK_BYTES = 256 * 1024


@attrs.define
class Receiver:
    """One inbound connection: numbers its frames, says which to hand on, and when to
    acknowledge: after ``ack_every`` frames or ``ack_bytes`` bytes handled since the last
    acknowledgement, whichever comes first (one frame of ``ack_bytes`` or more at once);
    else the shell acknowledges within its delay."""

    ack_every: int
    #: A sender keeps every frame until it is acknowledged (for a resend): this bounds what
    #: it keeps when frames are big, where ``ack_every`` bounds how many small ones (a
    #: sender holding many big frames allocates fresh memory for every new payload, a page
    #: fault per 4 KiB: a 1 MiB echo cost 2 ms instead of 0.5).
    ack_bytes: int = ACK_BYTES
    session: str | None = None
    state: _Inbound | None = None
    #: The number of the next frame on this connection.
    next: int = 0
    #: The count last acknowledged on this connection.
    acked: int = 0
    #: Set by :meth:`frame` when enough frames were handled since the last acknowledgement
    #: to send one now (an attribute, not a second call: this runs for every frame).
    ack_due: bool = False
    #: Bytes of the frames handled since the last acknowledgement.
    unacked_bytes: int = 0

    def started(self, session: str, first: int, state: _Inbound) -> str | None:
        """The connection announced ``SESSION(session, first)``; ``state`` is the session's
        (from :meth:`SessionTable.opened`). Returns the session this connection carried
        before, if any (to close in the table)."""
        previous = self.session
        self.session, self.next, self.state = session, first, state
        return previous

    def frame(self, size: int = 0) -> int | None:
        """A frame of ``size`` bytes arrived: its number when it must be handed on, None
        for a resend of one already handled (drop it)."""
        state = self.state
        assert state is not None, "a frame before SESSION"
        index = self.next
        self.next = index + 1
        if index < state.handled:
            return None
        state.handled = index + 1
        unacked = self.unacked_bytes + size
        self.unacked_bytes = unacked
        self.ack_due = index + 1 - self.acked >= self.ack_every or unacked >= self.ack_bytes
        return index

    def ack(self) -> int | None:
        """The count to acknowledge now, or None when nothing new was handled."""
        state = self.state
        count = state.handled if state is not None else 0
        self.ack_due = False
        self.unacked_bytes = 0
        if count <= self.acked:
            return None
        self.acked = count
        return count

    def ended(self) -> str | None:
        """The connection ended; returns its session (to close in the table)."""
        session, self.session = self.session, None
        return session
