"""The delivery session machines (regency.core._delivery), driven by Hypothesis: a sender,
links that break and drop what they carry, dials the shell loses before it begins them (a
KeyboardInterrupt on the sending thread) or begins late, a receiver, time. Whatever happens,
the receiver hands frames on in order and at most once; once the links heal, everything
queued arrives."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from regency.core._delivery import (
    CONNECTED,
    DIALING,
    FAILED,
    IDLE,
    SEND_NOW,
    Close,
    Dial,
    ForgottenSession,
    GiveUp,
    Outbound,
    Receiver,
    SessionFailed,
    SessionTable,
    Stalled,
    Transmit,
)

TIMEOUT = 10.0
ACK_EVERY = 3
ACK_BYTES = 100
#: The sender's flow control: frames and bytes in flight at most (frames are 1-60 bytes, so
#: both bounds close the window in turn).
WINDOW = 5
WINDOW_BYTES = 120


def _size(frame: int) -> int:
    """The size of a frame (frames are numbers here): 1 to 60 bytes, so that acknowledgements
    come by count (``ACK_EVERY``) and by bytes (``ACK_BYTES``), in varying mixes."""
    return 1 + (frame * 7) % 60


class _Link:
    """A connection: what is in flight on it, and the receiver at its far end."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.in_flight: deque[tuple[str, Any, Any]] = deque()
        self.receiver = Receiver(ACK_EVERY, ACK_BYTES)
        self.broken = False

    def __repr__(self) -> str:
        return f"link{self.number}"


class DeliveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sender = Outbound(
            "s#0#1", window=WINDOW, window_bytes=WINDOW_BYTES, size_of=_size
        )
        self.table = SessionTable()
        self.queued: list[int] = []
        self.delivered: list[int] = []
        self.links: list[_Link] = []
        #: Dials handed to the shell and not begun yet (a late copy and its re-issue can
        #: both be here), and whether an attempt has begun and not ended.
        self.dials: list[Dial] = []
        self.dialing = False
        #: Links the shell will close on its loop, after an interrupted write.
        self.closing: list[_Link] = []
        self.gave_up: BaseException | None = None
        self.now = 0.0

    # -- performing actions (what a shell does) ------------------------------------------

    def perform(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Transmit):
                link: _Link = action.link
                assert not link.broken
                if action.resume_at is not None:
                    link.in_flight.append(("session", self.sender.session, action.resume_at))
                for frame in action.frames:
                    link.in_flight.append(("frame", frame, None))
            elif isinstance(action, Dial):
                self.dials.append(action)
            elif isinstance(action, Close):
                self.close(action.link)
            elif isinstance(action, GiveUp):
                assert self.gave_up is None
                self.gave_up = action.cause
            else:
                raise AssertionError(f"unknown action {action!r}")

    def close(self, link: _Link) -> None:
        if link.broken:
            return
        link.broken = True
        link.in_flight.clear()
        session = link.receiver.ended()
        if session is not None:
            self.table.closed(session, self.now)

    def live(self) -> list[_Link]:
        return [link for link in self.links if not link.broken]

    # -- rules ---------------------------------------------------------------------------

    @rule()
    def queue(self) -> None:
        frame = len(self.queued) + (1000 if self.gave_up else 0)
        number = self.sender.queued_count
        try:
            action = self.sender.queued(frame, _size(frame))
        except SessionFailed as exc:
            assert self.gave_up is not None and exc.cause is self.gave_up
            return
        assert number == len(self.queued)
        self.queued.append(frame)
        if action is SEND_NOW:
            self.perform([Transmit(self.sender.link, (frame,))])
        elif action is not None:
            self.perform([action])

    @precondition(lambda self: bool(self.dials))
    @rule()
    def dial_is_lost(self) -> None:
        """The thread that was handed the dial never schedules it (an interrupt)."""
        self.dials.pop(0)

    @precondition(lambda self: bool(self.dials))
    @rule(data=st.data())
    def dial_is_late(self, data: st.DataObject) -> None:
        """A copy of a dial the shell holds turns up again later (handed out again by a
        tick while the first was only late): it may begin after newer dials."""
        self.dials.append(data.draw(st.sampled_from(self.dials)))

    def window_open(self) -> bool:
        """Whether the next frame would go out at once (connected, nothing waiting, room in
        the window)."""
        sender = self.sender
        return (
            sender.state == CONNECTED
            and not sender.pending
            and sender._fits(_size(len(self.queued)))
            and sender._fits(_size(len(self.queued) + 500))
        )

    @precondition(lambda self: self.window_open())
    @rule(written=st.booleans())
    def write_is_interrupted(self, written: bool) -> None:
        """A KeyboardInterrupt inside a connection's write (``Outbox.send``): the frame is
        counted as sent, written or not; the shell takes the connection for lost and closes
        it later, on its loop, so frames already on it may still arrive meanwhile."""
        frame = len(self.queued)
        assert self.sender.queued(frame, _size(frame)) is SEND_NOW
        self.queued.append(frame)
        link = self.sender.link
        if written:
            link.in_flight.append(("frame", frame, None))
        self.perform(self.sender.lost(link, ConnectionResetError("interrupted")))
        self.closing.append(link)

    @precondition(lambda self: self.window_open())
    @rule()
    def write_fails(self) -> None:
        """A frame's write fails with an error of its own before any byte went out (no
        memory to seal it): the shell withdraws it, and the sender gets the error; the
        frame was never sent, so the next one takes its number."""
        frame = len(self.queued) + 500  # (never queued for good)
        assert self.sender.queued(frame, _size(frame)) is SEND_NOW
        self.sender.withdraw(frame)

    @precondition(lambda self: bool(self.closing))
    @rule()
    def interrupted_link_closes(self) -> None:
        self.close(self.closing.pop(0))

    @precondition(lambda self: self.sender.state == IDLE)
    @rule()
    def queue_is_interrupted(self) -> None:
        """A KeyboardInterrupt cuts ``queued`` short after it queued the frame, before the
        session moved on: idle, with a frame waiting (the watchdog's tick dials)."""
        frame = len(self.queued)
        self.sender.queued_count += 1
        self.sender.pending.append(frame)
        self.sender.pending_bytes += _size(frame)
        self.queued.append(frame)

    @precondition(lambda self: bool(self.dials))
    @rule(data=st.data())
    def dial_begins(self, data: st.DataObject) -> None:
        """The shell begins one of the dials it holds (a late copy may come after its
        re-issue, or after a newer dial): only the machine's current one goes ahead."""
        dial = self.dials.pop(data.draw(st.integers(0, len(self.dials) - 1)))
        self.begin(dial)

    def begin(self, dial: Dial) -> None:
        current = self.sender.unbegun is dial and not self.dialing
        if self.sender.begin_dial(dial):
            assert current and not self.dialing, "two attempts dial at once"
            self.dialing = True
        else:
            assert not current or self.sender.state != DIALING

    @precondition(lambda self: self.dialing)
    @rule()
    def dial_succeeds(self) -> None:
        self.dialing = False
        link = _Link(len(self.links))
        self.links.append(link)
        self.perform(self.sender.connected(link))

    @precondition(lambda self: self.dialing)
    @rule()
    def dial_fails(self) -> None:
        self.dialing = False
        self.perform(self.sender.dial_failed(ConnectionRefusedError("nothing listens")))

    @precondition(lambda self: any(link.in_flight for link in self.links))
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        link = data.draw(st.sampled_from([link for link in self.links if link.in_flight]))
        kind, a, b = link.in_flight.popleft()
        receiver = link.receiver
        if kind == "session":
            state = self.table.opened(a, b)
            previous = receiver.started(a, b, state)
            if previous is not None:
                self.table.closed(previous, self.now)
            return
        index = receiver.frame(_size(a))
        if index is not None:
            assert index == len(self.delivered), "handed on out of order"
            self.delivered.append(a)
            # Due by count or by bytes: never more held back than either bound allows.
            assert receiver.ack_due or (
                receiver.unacked_bytes < ACK_BYTES and index + 1 - receiver.acked < ACK_EVERY
            )
        if receiver.ack_due:
            self.acknowledge(link)

    def acknowledge(self, link: _Link) -> None:
        count = link.receiver.ack()
        if count is not None and not link.broken:
            self.perform(self.sender.acknowledged(count))

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def ack_timer(self, data: st.DataObject) -> None:
        self.acknowledge(data.draw(st.sampled_from(self.live())))

    @precondition(lambda self: bool(self.live()))
    @rule(data=st.data())
    def link_breaks(self, data: st.DataObject) -> None:
        link = data.draw(st.sampled_from(self.live()))
        self.close(link)
        self.perform(self.sender.lost(link, ConnectionResetError("reset")))

    @rule(dt=st.sampled_from([0.5, 3.0, 6.0, 11.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        unbegun = self.sender.unbegun
        actions = self.sender.tick(self.now, TIMEOUT)
        if len(actions) == 1:  # a dial not begun by the second tick, handed out again
            # (or a first one, for a session an interrupt left idle with frames)
            (dial,) = actions
            assert dial is unbegun or (unbegun is None and isinstance(dial, Dial) and dial.first)
            assert not self.dialing
        elif actions:
            assert isinstance(actions[0], Close) and isinstance(actions[1], Dial)
            assert isinstance(actions[1].cause, Stalled)
        self.perform(actions)

    @rule()
    def peer_exits(self) -> None:
        self.perform(self.sender.give_up(ProcessLookupError("proc exited")))

    @precondition(lambda self: self.gave_up is None)
    @rule()
    def heal(self) -> None:
        """The network heals: the dial that is out succeeds, everything in flight arrives,
        and then everything queued has been handed on, once, in order. A dial that was lost
        is handed out again by the second tick."""
        for _ in range(3):
            if self.sender.state == IDLE and self.sender.pending:
                self.tick(0.5)
                continue
            if self.dialing or self.sender.state != DIALING:
                break
            while self.dials and not self.dialing:
                self.begin(self.dials.pop(0))
            if not self.dialing:
                self.tick(0.5)
        assert self.dialing or self.sender.state != DIALING, "a lost dial was never re-issued"
        if self.dialing:
            self.dial_succeeds()
        if self.gave_up is not None:
            return
        assert self.sender.state == CONNECTED or not self.queued
        for link in self.links:
            if not link.broken and link is not self.sender.link:
                self.close(link)  # an old connection the sender no longer uses
        # What is in flight arrives and is acknowledged, which lets what waited for the
        # window go, until nothing waits.
        for _ in range(len(self.queued) + 2):
            while self.sender.link is not None and self.sender.link.in_flight:
                self.arrive_on(self.sender.link)
            if self.sender.state != CONNECTED:
                break
            self.acknowledge(self.sender.link)
            if not self.sender.pending and not self.sender.link.in_flight:
                break
        if self.sender.state == CONNECTED:
            assert self.delivered == self.queued
            assert not self.sender.unacked and not self.sender.pending

    def arrive_on(self, link: _Link) -> None:
        kind, a, b = link.in_flight.popleft()
        if kind == "session":
            previous = link.receiver.started(a, b, self.table.opened(a, b))
            if previous is not None:
                self.table.closed(previous, self.now)
            return
        index = link.receiver.frame(_size(a))
        if index is not None:
            self.delivered.append(a)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def handed_on_in_order_at_most_once(self) -> None:
        assert self.delivered == self.queued[: len(self.delivered)]

    @invariant()
    def the_window_holds(self) -> None:
        """In flight: at most the window (a frame bigger than the byte window alone); what
        waits, waits only for the window or a connection; the byte counts add up."""
        sender = self.sender
        assert len(sender.unacked) <= WINDOW
        assert sender.unacked_bytes == sum(_size(f) for f in sender.unacked)
        assert sender.pending_bytes == sum(_size(f) for f in sender.pending)
        if sender.unacked_bytes > WINDOW_BYTES:
            assert len(sender.unacked) == 1
        if sender.state == CONNECTED and sender.pending:
            assert not sender._fits(_size(sender.pending[0])), "waits with the window open"

    @invariant()
    def acknowledged_only_what_was_handled(self) -> None:
        assert self.sender.acked <= len(self.delivered)

    @invariant()
    def the_numbers_add_up(self) -> None:
        sender = self.sender
        if sender.state == FAILED:
            assert self.gave_up is not None
            assert not sender.unacked and not sender.pending and sender.link is None
        else:
            assert sender.queued_count == len(self.queued)
            if sender.state == DIALING:
                assert sender.link is None
                # Never stuck: an attempt has begun, or a dial waits to be (handed out
                # again by the second tick if its copies were lost).
                assert self.dialing or sender.unbegun is not None
            if sender.unbegun is not None:
                assert sender.state == DIALING and not self.dialing and not sender.attempt
            assert sender.attempt == self.dialing


# No deadline: pure code, but on a loaded 2-core machine one example's steps can take longer
# than Hypothesis's default 200 ms (seen once: a failure that was only the clock).
DeliveryMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_delivery_sessions = DeliveryMachine.TestCase


def test_a_forgotten_session_cannot_resume() -> None:
    table = SessionTable()
    state = table.opened("a#1#1", 0)
    state.handled = 7
    table.closed("a#1#1", now=100.0)
    assert table.expire(now=120.0, horizon=30.0) == []
    assert table.expire(now=131.0, horizon=30.0) == ["a#1#1"]
    with pytest.raises(ForgottenSession, match="resumes at frame 7, but this process forgot"):
        table.opened("a#1#1", 7)


def test_a_connection_that_overtakes_the_old_one_sees_what_it_handled() -> None:
    table = SessionTable()
    old, new = Receiver(64), Receiver(64)
    old.started("s", 0, table.opened("s", 0))
    assert [old.frame(), old.frame()] == [0, 1]
    new.started("s", 1, table.opened("s", 1))  # resends from frame 1
    assert new.frame() is None  # frame 1 again: dropped
    assert new.frame() == 2
    assert old.frame() is None  # the old connection's late frame 2: dropped


def test_acknowledgements_fall_due_by_count_or_by_bytes() -> None:
    table = SessionTable()
    receiver = Receiver(4, ack_bytes=1000)
    receiver.started("s", 0, table.opened("s", 0))
    # Small frames: due at the fourth.
    assert [receiver.frame(10) for _ in range(3)] == [0, 1, 2] and not receiver.ack_due
    assert receiver.frame(10) == 3 and receiver.ack_due
    assert receiver.ack() == 4 and (receiver.ack_due, receiver.unacked_bytes) == (False, 0)
    # Bytes add up across frames: due once they reach ack_bytes, before the count does.
    assert receiver.frame(600) == 4 and not receiver.ack_due
    assert receiver.frame(400) == 5 and receiver.ack_due
    assert receiver.ack() == 6
    # One frame that big is due at once.
    assert receiver.frame(1000) == 6 and receiver.ack_due
    assert receiver.ack() == 7
    # A resend counts nothing.
    again = Receiver(4, ack_bytes=1000)
    again.started("s", 6, table.opened("s", 6))
    assert again.frame(5000) is None and not again.ack_due and again.unacked_bytes == 0


def test_a_failed_session_refuses_frames_and_closes_a_late_connection() -> None:
    sender = Outbound("s")
    dial = sender.queued("f0")
    assert isinstance(dial, Dial) and dial.first
    assert sender.give_up(TimeoutError("did not start")) == [GiveUp(sender.cause)]  # type: ignore[arg-type]
    with pytest.raises(SessionFailed, match="did not start"):
        sender.queued("f1")
    assert sender.connected("late") == [Close("late", "the session failed meanwhile")]
    assert sender.give_up(TimeoutError("again")) == []


def test_a_silent_link_is_dropped_after_the_timeout() -> None:
    sender = Outbound("s")
    sender.queued("f0")
    sender.connected("link")
    assert sender.tick(0.0, 10.0) == []  # starts the clock
    assert sender.tick(9.0, 10.0) == []
    close, dial = sender.tick(10.5, 10.0)
    assert close == Close("link", "1 frame(s) unacknowledged for 10.5 s")
    assert isinstance(dial, Dial) and not dial.first and isinstance(dial.cause, Stalled)
    assert sender.state == DIALING
    assert sender.begin_dial(dial)
    assert sender.connected("link2") == [Transmit("link2", ("f0",), resume_at=0)]


def test_progress_restarts_the_stall_clock() -> None:
    sender = Outbound("s")
    sender.queued("f0")
    sender.connected("link")
    sender.queued("f1")
    sender.tick(0.0, 10.0)
    sender.acknowledged(1)
    assert sender.tick(9.0, 10.0) == []  # acknowledged meanwhile: the clock restarts
    assert sender.tick(18.0, 10.0) == []
    assert len(sender.tick(19.5, 10.0)) == 2


def test_a_first_dial_never_begun_is_handed_out_again() -> None:
    """The thread that queued the first frame is handed the Dial and schedules it after it
    lets go of the outbox's lock; a KeyboardInterrupt in between loses it. The second tick
    after hands it out again; a copy that was only late finds nothing left to begin."""
    sender = Outbound("s")
    dial = sender.queued("f0")
    assert isinstance(dial, Dial) and dial.first  # ... and lost
    assert sender.queued("f1") is None  # queues behind the dial it thinks is out
    assert sender.tick(1.0, 10.0) == []
    assert sender.tick(2.0, 10.0) == [dial]  # handed out again
    assert sender.begin_dial(dial)
    assert not sender.begin_dial(dial)  # a late first copy: another attempt began
    assert sender.tick(3.0, 10.0) == [] and sender.tick(4.0, 10.0) == []  # not again
    assert sender.connected("link") == [Transmit("link", ("f0", "f1"), resume_at=0)]


def test_a_begun_dial_is_not_handed_out_again_and_a_stale_one_begins_nothing() -> None:
    sender = Outbound("s")
    first = sender.queued("f0")
    assert isinstance(first, Dial) and sender.begin_dial(first)
    assert [sender.tick(float(t), 10.0) for t in range(5)] == [[]] * 5
    sender.connected("link")
    (dial,) = sender.lost("link", ConnectionResetError("reset"))
    assert isinstance(dial, Dial) and not dial.first
    assert not sender.begin_dial(first)  # a late copy of the first dial: not this one
    assert sender.begin_dial(dial)
    assert sender.tick(10.0, 10.0) == [] and sender.tick(11.0, 10.0) == []


def test_a_session_an_interrupt_left_idle_with_frames_dials_at_the_second_tick() -> None:
    """A KeyboardInterrupt inside ``queued`` after the frame was queued and before the
    session moved on (``_dial``) leaves it idle with a frame waiting: the watchdog dials."""
    sender = Outbound("s")
    sender.queued_count, sender.pending = 1, deque(["f0"])  # what the cut-short call left
    assert sender.tick(1.0, 10.0) == []
    (dial,) = sender.tick(2.0, 10.0)
    assert isinstance(dial, Dial) and dial.first and sender.state == DIALING
    assert sender.begin_dial(dial)
    assert sender.connected("link") == [Transmit("link", ("f0",), resume_at=0)]
