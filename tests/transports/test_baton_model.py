"""The read baton (regency.transports._baton), driven by Hypothesis against a model of what
its shell (``SocketConnection``) touches: the peer writing a connection's bytes into the
socket a little at a time (a frame can be half there) and perhaps ending the stream, the
receive buffer both readers share, trio's epoll (its one-shot interest, silenced and re-armed
behind trio's back, and what trio believes it armed), the loop's reader task (reading,
waiting with a deadline, woken by data, by a cancel or a deadline, parked) with the
callbacks threads schedule on the loop, and two threads that lead, read, hold and give back
while a third party reclaims, with ``epoll_ctl`` failing now and then. Each model method does
exactly what the shell's method of the same name does with the table's answer.

Whatever the interleaving: the baton never breaks (no event comes that its state cannot
see); at most one reader at a time (a thread reads only while it leads and the baton says a
thread reads; the loop reads only while the baton is the loop's); the loop's interest is
never armed while a thread leads or holds the connection, and is armed whenever the loop
waits with no one else to read; nothing is left unread with no reader on its way (a set-aside
connection holds no bytes, a waiting loop no whole frame, and a waiting loop the baton went
back to is being woken); frames are handled in order, each once. Once the peer is
done and every thread gives back or is reclaimed, the loop handles every frame sent and,
after the end of the stream, reports the loss.

The last tests plant wrong entries in the table (a transition that forgets to silence,
re-arm, wake, hand back or park) and check that the model catches each.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from regency.transports import _baton as B

THREADS = (0, 1)
MAX_FRAMES = 12
IN = 1  # trio's EPOLLIN
EOF = (-1, 0)  # the end of the stream, in the socket after the last byte
#: One in FAIL_ONE_IN ``epoll_ctl`` calls fails (a ``ctl`` draw of 0).
FAIL_ONE_IN = 8


class BatonModel(RuleBasedStateMachine):
    #: The table under test, flat (``STEP[state | event]``); mutants replace it.
    STEP: tuple[tuple[int, int], ...] = B.STEP

    @initialize(loop_frames=st.sets(st.integers(0, MAX_FRAMES - 1), max_size=4))
    def connect(self, loop_frames: set[int]) -> None:
        #: Frames the thread's sink leaves to the loop (by number: a frame's kind decides).
        self.loop_frames = loop_frames
        self.baton = B.LOOP
        self.sent = 0  # frames whose first half the peer wrote
        self.half = False  # the peer wrote only the first half of frame ``sent - 1``
        self.ended = False  # the peer wrote the end of the stream
        self.socket: list[tuple[int, int]] = []  # (frame, half) not yet received, or EOF
        self.buffer: list[tuple[int, int]] = []  # received, not yet handled (shared)
        self.handled: list[tuple[int, str]] = []  # (frame, by whom)
        self.lost = 0  # times the loop reported the connection's loss
        # trio's epoll: the kernel's interest, and trio's own record of what it armed
        self.armed = False
        self.trio_flags = 0
        # the reader task: "read" (it runs: holds the baton), "wait" (in wait_readable),
        # "parked" (waits for a hand-back), "done" (reported the loss)
        self.phase = "read"
        self.woken = False  # (waiting) its wait ended; it has not run yet
        self.scope = 0  # the wait's cancel scope
        self.handed = 0  # the parked wait's event
        self.handed_set: set[int] = set()
        self.callbacks: list[tuple[str, int]] = []  # run_sync_soon, in order
        self.leads: dict[int, bool] = dict.fromkeys(THREADS, False)

    # -- the shell's moves ------------------------------------------------------------------

    def feed(self, event: int) -> tuple[int, int]:
        before = self.baton
        self.baton, action = self.STEP[before | event]
        assert action != B.ILLEGAL, f"{B.describe(before, event)} is illegal"
        return self.baton, action

    def move_locked(self, event: int, ctl: int) -> int:
        """``SocketConnection._move_locked``; its ``epoll_ctl`` fails when ``ctl`` is 0."""
        _, action = self.feed(event)
        if action == B.REARM:
            if ctl:
                self.armed = True  # (trio's record is left as trio made it)
                return action
            _, action = self.feed(B.REARM_FAILED)
        if action == B.WAKE_LOOP:
            self.callbacks.append(("cancel", self.scope))
        elif action == B.HAND_BACK:
            self.callbacks.append(("set", self.handed))
        return action

    @property
    def dirty(self) -> int:
        return B.UNREAD * bool(self.buffer)

    def deliver(self, frame: int, by: str) -> None:
        assert self.buffer[:2] == [(frame, 0), (frame, 1)]
        del self.buffer[:2]
        self.handled.append((frame, by))

    # -- the peer ---------------------------------------------------------------------------

    @precondition(lambda self: not self.ended and (self.half or self.sent < MAX_FRAMES))
    @rule()
    def peer_writes(self) -> None:
        """Half a frame: the next one's first half, or the second half of the last."""
        if self.half:
            self.socket.append((self.sent - 1, 1))
        else:
            self.socket.append((self.sent, 0))
            self.sent += 1
        self.half = not self.half

    @precondition(lambda self: not self.ended and not self.half)
    @rule()
    def peer_closes(self) -> None:
        self.socket.append(EOF)
        self.ended = True

    # -- trio ------------------------------------------------------------------------------

    @precondition(lambda self: self.armed and self.socket)
    @rule()
    def epoll_fires(self) -> None:
        """The one-shot interest fires: trio wakes the reader task if it waits (else the
        event finds no waiter: spurious, harmless)."""
        self.armed = False
        self.trio_flags = 0
        if self.phase == "wait":
            self.woken = True

    @precondition(lambda self: self.phase == "wait" and not self.woken)
    @rule()
    def deadline_passes(self) -> None:
        """The wait's deadline (the big buffer's) ends it: trio's abort drops its interest."""
        self.abort()

    def abort(self) -> None:
        if self.trio_flags != 0:
            self.armed = False  # epoll_ctl(MOD, fd, EPOLLONESHOT)
            self.trio_flags = 0
        self.woken = True

    @precondition(lambda self: self.callbacks)
    @rule()
    def loop_runs_a_callback(self) -> None:
        kind, which = self.callbacks.pop(0)
        if kind == "cancel":
            if self.phase == "wait" and which == self.scope and not self.woken:
                self.abort()
        else:
            self.handed_set.add(which)

    # -- the reader task --------------------------------------------------------------------

    @precondition(lambda self: self.phase == "read")
    @rule()
    def loop_reads(self) -> None:
        """``_read_frames``: receive what the socket has, handle every whole frame, and wait
        (``_await_readable``) once no whole frame is left."""
        assert self.baton == B.LOOP, f"the loop reads while the baton is {B.describe(self.baton)}"
        while self.socket and self.socket[0] != EOF:
            self.buffer.append(self.socket.pop(0))
        while len(self.buffer) >= 2:
            self.deliver(self.buffer[0][0], "loop")
        if self.socket and self.socket[0] == EOF and not self.buffer:
            self.lost += 1
            self.phase = "done"
            return
        _, action = self.feed(B.LOOP_WAITS)
        if action != B.NOTHING:
            return
        self.scope += 1
        self.phase = "wait"
        self.woken = False
        if self.trio_flags != IN:  # trio arms only what it does not think armed
            self.armed = True
            self.trio_flags = IN

    @precondition(lambda self: self.phase == "wait" and self.woken)
    @rule()
    def loop_wakes(self) -> None:
        _, action = self.feed(B.LOOP_WAKES)
        if action == B.PARK:
            self.handed += 1
            self.phase = "parked"
        else:
            self.phase = "read"

    @precondition(lambda self: self.phase == "parked" and self.handed in self.handed_set)
    @rule()
    def loop_is_handed_back(self) -> None:
        self.phase = "read"

    # -- threads ----------------------------------------------------------------------------

    @precondition(lambda self: self.phase != "done")
    @rule(t=st.sampled_from(THREADS), ctl=st.integers(0, FAIL_ONE_IN - 1))
    def lead(self, t: int, ctl: int) -> None:
        """``SocketConnection.lead``; its ``epoll_ctl`` fails when ``ctl`` is 0."""
        if self.leads[t]:
            return  # (a thread leads a connection once)
        action = self.STEP[self.baton | B.LEAD][1]
        if action == B.NOTHING:
            self.feed(B.LEAD)
            self.leads[t] = True
            return
        if action != B.SILENCE:
            return
        self.feed(B.LEAD)
        if not ctl:
            self.feed(B.SILENCE_FAILED)
            return
        self.armed = False
        self.leads[t] = True

    @precondition(lambda self: any(self.leads.values()))
    @rule(t=st.sampled_from(THREADS))
    def read_led(self, t: int) -> None:
        """``SocketConnection.read_led`` (once poll said readable, or not)."""
        if not self.leads[t]:
            return
        if self.baton not in B.THREAD_READS:
            self.leads[t] = False  # read_led answers False: handed back
            return
        assert not any(self.leads[o] for o in THREADS if o != t), "two threads lead"
        if self.socket and self.socket[0] == EOF:
            self.move_locked(B.GIVE_BACK + B.UNREAD, 1)  # end of stream: the loop's
            self.leads[t] = False
            return
        while self.socket and self.socket[0] != EOF:
            self.buffer.append(self.socket.pop(0))
        while self.buffer:
            frame = self.buffer[0][0]
            if frame in self.loop_frames or len(self.buffer) < 2:
                break
            self.deliver(frame, f"thread {t}")
        if self.buffer and self.buffer[0][0] in self.loop_frames:
            self.move_locked(B.GIVE_BACK + B.UNREAD, 1)  # left to the loop, unread
            self.leads[t] = False

    @precondition(lambda self: any(self.leads.values()))
    @rule(t=st.sampled_from(THREADS), ctl=st.integers(0, FAIL_ONE_IN - 1))
    def hold(self, t: int, ctl: int) -> None:
        if self.leads[t]:
            self.leads[t] = False
            self.move_locked(B.HOLD + self.dirty, ctl)

    @precondition(lambda self: any(self.leads.values()))
    @rule(t=st.sampled_from(THREADS), ctl=st.integers(0, FAIL_ONE_IN - 1))
    def give_back(self, t: int, ctl: int) -> None:
        if self.leads[t]:
            self.leads[t] = False
            self.move_locked(B.GIVE_BACK + self.dirty, ctl)

    @rule(ctl=st.integers(0, FAIL_ONE_IN - 1))
    def reclaim(self, ctl: int) -> None:
        """From any thread, the loop's included (``Leader._reclaim``, ``loop_waiting``)."""
        self.move_locked(B.RECLAIM + self.dirty, ctl)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def one_reader_at_a_time(self) -> None:
        leading = [t for t in THREADS if self.leads[t]]
        name = B.describe(self.baton)
        if self.baton in B.THREAD_READS:
            assert len(leading) == 1, f"baton {name} with threads {leading} leading"
        else:
            assert not leading, f"threads {leading} lead while the baton is {name}"
        assert self.phase != "read" or self.baton == B.LOOP, f"the loop reads, baton {name}"
        assert self.baton != B.PARKED or self.phase == "parked", f"baton {name}, loop not parked"
        assert self.phase != "parked" or self.baton in (B.PARKED, B.LOOP), (
            f"the loop is parked, baton {name}"
        )

    @invariant()
    def the_interest_is_armed_iff_the_loop_should_read(self) -> None:
        name = B.describe(self.baton)
        if self.baton in (B.THREAD, B.PARKED, B.HELD):
            assert not self.armed, f"the loop's interest is armed while the baton is {name}"
        if self.phase == "wait" and not self.woken and self.baton == B.LOOP_WAITING:
            assert self.armed, "the loop waits for data with its interest silenced"
        if self.phase == "wait" and not self.woken:
            assert self.trio_flags == IN

    @invariant()
    def nothing_is_left_unread_without_a_reader_on_its_way(self) -> None:
        name = B.describe(self.baton)
        if self.baton == B.HELD:
            assert not self.buffer, f"set aside with {self.buffer} unread"
        if self.phase == "wait" and not self.woken:
            if self.baton == B.LOOP_WAITING:
                assert len(self.buffer) < 2, f"the loop waits for data with {self.buffer} unread"
            if self.baton == B.LOOP:
                assert ("cancel", self.scope) in self.callbacks, (
                    f"the baton is the loop's ({name}), but no one wakes the waiting loop"
                )

    @invariant()
    def frames_are_handled_in_order_once(self) -> None:
        frames = [frame for frame, _ in self.handled]
        assert frames == list(range(len(frames))), f"handled out of order or twice: {frames}"
        for frame, by in self.handled:
            assert by == "loop" or frame not in self.loop_frames, f"{frame} taken by {by}"

    # -- the end ----------------------------------------------------------------------------

    def teardown(self) -> None:
        if not hasattr(self, "baton"):
            return
        if self.half:
            self.peer_writes()
        for t in THREADS:  # every thread gives back, and the loop takes back what is held
            if self.leads[t]:
                self.read_led(t)
            self.give_back(t, 1)
        self.reclaim(1)
        for _ in range(200):  # the loop runs until it has nothing left to do
            self.check_all()
            if self.callbacks:
                self.loop_runs_a_callback()
            elif self.armed and self.socket:
                self.epoll_fires()
            elif self.phase == "read":
                self.loop_reads()
            elif self.phase == "wait" and self.woken:
                self.loop_wakes()
            elif self.phase == "parked" and self.handed in self.handed_set:
                self.loop_is_handed_back()
            else:
                break
        frames = [frame for frame, _ in self.handled]
        assert frames == list(range(self.sent)), (
            f"sent {self.sent} frames, handled {frames}; stuck with the baton "
            f"{B.describe(self.baton)}, the loop {self.phase}, buffer {self.buffer}, "
            f"socket {self.socket}, interest {'armed' if self.armed else 'silenced'}"
        )
        assert self.lost == (1 if self.ended else 0), "the end of the stream went unreported"

    def check_all(self) -> None:
        self.one_reader_at_a_time()
        self.nothing_is_left_unread_without_a_reader_on_its_way()
        self.the_interest_is_armed_iff_the_loop_should_read()
        self.frames_are_handled_in_order_once()


BatonModel.TestCase.settings = settings(max_examples=500, stateful_step_count=40, deadline=None)
test_baton_model = BatonModel.TestCase


# -- the table ---------------------------------------------------------------------------------


def test_the_table_is_total_and_checked() -> None:
    B.check_table()
    assert set(B.TABLE) == {(s, e) for s in B.STATES for e in B.EVENTS}
    assert {B.LOOP_WAITING, B.HELD} == B.LEADABLE
    for (state, event), step in B.TABLE.items():
        assert B.step(state, event) == step
    broken = dict(B.TABLE)
    del broken[B.HELD, B.RECLAIM]
    with pytest.raises(AssertionError, match=r"\(held, reclaim\): no transition"):
        B.check_table(broken)
    broken = {**B.TABLE, (B.THREAD, B.LEAD): (B.LOOP, B.REFUSED)}
    with pytest.raises(AssertionError, match=r"\(thread, lead\): refused, yet moves"):
        B.check_table(broken)
    broken = {**B.TABLE, (B.BROKEN, B.LEAD): (B.THREAD, B.NOTHING)}
    with pytest.raises(AssertionError, match=r"\(broken, lead\): leaves BROKEN"):
        B.check_table(broken)


def test_an_event_a_state_cannot_see_breaks_the_baton_for_good() -> None:
    assert B.step(B.PARKED, B.LOOP_WAKES) == (B.BROKEN, B.ILLEGAL)
    assert B.describe(B.PARKED, B.LOOP_WAKES) == "parked --loop_wakes-->"
    for event in B.EVENTS:
        assert B.step(B.BROKEN, event)[0] == B.BROKEN
    assert B.step(B.BROKEN, B.LEAD) == (B.BROKEN, B.REFUSED)


# -- planted mutations -------------------------------------------------------------------------

#: Wrong entries, each a bug the model must catch: ``(state, event) -> wrong step``.
MUTANTS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "lead without silencing": ((B.LOOP_WAITING, B.LEAD), (B.THREAD, B.NOTHING)),
    "give back without re-arming": ((B.THREAD, B.GIVE_BACK), (B.LOOP_WAITING, B.NOTHING)),
    "give back unread bytes by re-arming": (
        (B.THREAD, B.GIVE_BACK_UNREAD), (B.LOOP_WAITING, B.REARM)
    ),
    "the loop reads over a thread": ((B.THREAD, B.LOOP_WAKES), (B.LOOP, B.NOTHING)),
    "a parked loop never handed back": ((B.PARKED, B.GIVE_BACK), (B.LOOP, B.NOTHING)),
    "a parked loop's connection held": ((B.PARKED, B.HOLD), (B.HELD, B.NOTHING)),
    "hold re-arms": ((B.THREAD, B.HOLD), (B.HELD, B.REARM)),
    "reclaim without re-arming": ((B.HELD, B.RECLAIM), (B.LOOP_WAITING, B.NOTHING)),
    "reclaim wakes no one": ((B.HELD, B.RECLAIM), (B.LOOP, B.NOTHING)),
    "the loop waits as a thread": ((B.LOOP, B.LOOP_WAITS), (B.THREAD, B.NOTHING)),
    "the loop reads still waiting": ((B.LOOP_WAITING, B.LOOP_WAKES), (B.LOOP_WAITING, B.NOTHING)),
    "the loop reads a held connection": ((B.HELD, B.LOOP_WAKES), (B.HELD, B.NOTHING)),
    "a failed silence still leads": ((B.THREAD, B.SILENCE_FAILED), (B.THREAD, B.NOTHING)),
    "a failed re-arm left waiting": ((B.LOOP_WAITING, B.REARM_FAILED), (B.LOOP_WAITING, B.NOTHING)),
    "two threads lead": ((B.THREAD, B.LEAD), (B.THREAD, B.NOTHING)),
    "lead from a parked loop": ((B.PARKED, B.LEAD), (B.THREAD, B.NOTHING)),
}


@pytest.mark.slow  # (a long property run per mutant: up to a few hundred examples)
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_model_catches_a_planted_mutation(mutant: str) -> None:
    key, wrong = MUTANTS[mutant]
    assert B.TABLE[key] != wrong

    class Mutant(BatonModel):
        STEP = B.compile_table({**B.TABLE, key: wrong})

    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            Mutant,
            settings=settings(
                max_examples=2000,
                stateful_step_count=40,
                deadline=None,
                database=None,
                derandomize=True,
                phases=(Phase.generate,),
                suppress_health_check=list(HealthCheck),
            ),
        )
