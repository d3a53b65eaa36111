"""Who reads a connection, the loop or a thread: the baton, as a pure state machine.

A connection a thread can read (:class:`regency.transports.ThreadReadable`) is read by the
loop's reader task most of the time; a thread that waits for a reply may take over while the
reader task is idle, read on its own thread, and hand the connection back (core/_leader.py).
This module decides every move of that baton; it performs none. The shell
(:class:`regency.transports._sockets.SocketConnection`) feeds it an event under the
connection's read lock, stores the next state and performs the action it gets back: silence
or re-arm the loop's interest in the socket (``epoll_ctl`` on trio's epoll), wake the reader
task (cancel its wait), hand the connection back to a reader task that parked.

States (:data:`STATES`), by who may read the receive buffer:

* :data:`LOOP`: the reader task reads (or is about to: it was woken and has not run yet).
* :data:`LOOP_WAITING`: the reader task waits for the socket to be readable, its interest
  armed; a thread may take over (:data:`LEAD`).
* :data:`THREAD`: a thread reads; the loop's interest is silenced.
* :data:`PARKED`: a thread reads, and the reader task woke meanwhile (data came before the
  silence, or a deadline): it waits to be handed the connection back.
* :data:`HELD`: no one reads: a thread set it aside, still silenced, to lead it again soon
  (any thread may; the loop takes it back with :data:`RECLAIM`).
* :data:`BROKEN`: an event the state cannot see came (a bug in the shell or its caller): no
  one reads again, the shell fails the connection. It is never left.

Events (:data:`EVENTS`): the reader task's :data:`LOOP_WAITS` (about to wait) and
:data:`LOOP_WAKES` (its wait ended: readable, deadline, or woken); a thread's :data:`LEAD`,
:data:`HOLD`, :data:`GIVE_BACK`, and anyone's :data:`RECLAIM`; each of the last three in an
``_UNREAD`` variant when the loop must run now (bytes are left in the buffer, or the
connection closed: only the reader task reports a loss); and the shell's reports that an action
failed, :data:`SILENCE_FAILED` and :data:`REARM_FAILED`.

Actions (:data:`ACTIONS`), returned with the next state: :data:`NOTHING` (done),
:data:`REFUSED` (nothing changed: ``lead``/``reclaim`` answer False, ``hold``/``give_back``
do nothing), :data:`SILENCE`, :data:`REARM`, :data:`WAKE_LOOP`, :data:`HAND_BACK`,
:data:`PARK` (the reader task waits for :data:`HAND_BACK`), :data:`ILLEGAL` (now broken).

:data:`TABLE` is the whole behaviour: ``(state, event) -> (next state, action)``, total
(:func:`check_table`, run at import). The shell steps with :data:`STEP`, the same table as a
flat tuple indexed by ``state | event`` (states are below 8, events multiples of 8): one
index, no allocation, on the hottest path of a round trip. ``tests/transports/
test_baton_model.py`` drives it with Hypothesis against a model of the socket, trio's epoll,
the reader task and threads, and plants wrong entries to see that the model catches them.
"""

from __future__ import annotations

# -- states -----------------------------------------------------------------------------------

LOOP = 0
LOOP_WAITING = 1
THREAD = 2
PARKED = 3
HELD = 4
BROKEN = 5
STATES = (LOOP, LOOP_WAITING, THREAD, PARKED, HELD, BROKEN)
STATE_NAMES = ("loop", "loop_waiting", "thread", "parked", "held", "broken")

#: The states in which a thread reads the buffer (``read_led`` goes on).
THREAD_READS = frozenset((THREAD, PARKED))

# -- events (multiples of 8: ``state | event`` indexes STEP) ---------------------------------

LOOP_WAITS = 0 << 3
LOOP_WAKES = 1 << 3
LEAD = 2 << 3
HOLD = 3 << 3
HOLD_UNREAD = 4 << 3
GIVE_BACK = 5 << 3
GIVE_BACK_UNREAD = 6 << 3
RECLAIM = 7 << 3
RECLAIM_UNREAD = 8 << 3
SILENCE_FAILED = 9 << 3
REARM_FAILED = 10 << 3
EVENTS = (
    LOOP_WAITS, LOOP_WAKES, LEAD, HOLD, HOLD_UNREAD, GIVE_BACK, GIVE_BACK_UNREAD, RECLAIM,
    RECLAIM_UNREAD, SILENCE_FAILED, REARM_FAILED,
)
EVENT_NAMES = (
    "loop_waits", "loop_wakes", "lead", "hold", "hold_unread", "give_back",
    "give_back_unread", "reclaim", "reclaim_unread", "silence_failed", "rearm_failed",
)
#: Added to HOLD, GIVE_BACK or RECLAIM (``event + UNREAD * dirty``): the ``_UNREAD`` variant.
UNREAD = HOLD_UNREAD - HOLD
assert GIVE_BACK_UNREAD - GIVE_BACK == RECLAIM_UNREAD - RECLAIM == UNREAD

# -- actions ----------------------------------------------------------------------------------

NOTHING = 0
REFUSED = 1
SILENCE = 2  # epoll_ctl(MOD, fd, 0): the loop's interest off (trio still thinks it armed)
REARM = 3  # epoll_ctl(MOD, fd, EPOLLIN | EPOLLONESHOT [| EPOLLOUT]): as trio armed it
WAKE_LOOP = 4  # cancel the reader task's wait: it runs now
HAND_BACK = 5  # set the parked reader task's event: it runs now
PARK = 6  # (to the reader task) wait for HAND_BACK
ILLEGAL = 7  # the state cannot see this event: now BROKEN
ACTIONS = (NOTHING, REFUSED, SILENCE, REARM, WAKE_LOOP, HAND_BACK, PARK, ILLEGAL)
ACTION_NAMES = (
    "nothing", "refused", "silence", "rearm", "wake_loop", "hand_back", "park", "illegal"
)

_BROKEN = (BROKEN, ILLEGAL)
_KEEP = {state: (state, REFUSED) for state in STATES}

#: ``(state, event) -> (next state, action)``: the baton's whole behaviour.
TABLE: dict[tuple[int, int], tuple[int, int]] = {
    # The reader task reads. It waits when the buffer holds no whole frame; a thread that
    # hands back with bytes left (or a connection closed) woke it, and it wakes as it was.
    (LOOP, LOOP_WAITS): (LOOP_WAITING, NOTHING),
    (LOOP, LOOP_WAKES): (LOOP, NOTHING),
    (LOOP, LEAD): _KEEP[LOOP],
    (LOOP, HOLD): _KEEP[LOOP],  # (a thread whose read_led handed back already: no-op)
    (LOOP, HOLD_UNREAD): _KEEP[LOOP],
    (LOOP, GIVE_BACK): _KEEP[LOOP],
    (LOOP, GIVE_BACK_UNREAD): _KEEP[LOOP],
    (LOOP, RECLAIM): _KEEP[LOOP],
    (LOOP, RECLAIM_UNREAD): _KEEP[LOOP],
    (LOOP, SILENCE_FAILED): _BROKEN,
    (LOOP, REARM_FAILED): _BROKEN,
    # The reader task waits, interest armed: a thread may take over, silencing it.
    (LOOP_WAITING, LOOP_WAITS): _BROKEN,
    (LOOP_WAITING, LOOP_WAKES): (LOOP, NOTHING),
    (LOOP_WAITING, LEAD): (THREAD, SILENCE),
    (LOOP_WAITING, HOLD): _KEEP[LOOP_WAITING],
    (LOOP_WAITING, HOLD_UNREAD): _KEEP[LOOP_WAITING],
    (LOOP_WAITING, GIVE_BACK): _KEEP[LOOP_WAITING],
    (LOOP_WAITING, GIVE_BACK_UNREAD): _KEEP[LOOP_WAITING],
    (LOOP_WAITING, RECLAIM): _KEEP[LOOP_WAITING],
    (LOOP_WAITING, RECLAIM_UNREAD): _KEEP[LOOP_WAITING],
    (LOOP_WAITING, SILENCE_FAILED): _BROKEN,
    # (re-armed after a thread gave back: a failed epoll_ctl leaves the interest unknown,
    # so the reader task runs and waits afresh, which arms it)
    (LOOP_WAITING, REARM_FAILED): (LOOP, WAKE_LOOP),
    # A thread reads. Given back with nothing left: re-armed, the loop wakes only when
    # data comes; with bytes left or closed, the reader task is woken to handle them.
    (THREAD, LOOP_WAITS): _BROKEN,
    (THREAD, LOOP_WAKES): (PARKED, PARK),  # (woken before the silence took, or a deadline)
    (THREAD, LEAD): _KEEP[THREAD],  # one reader at a time
    (THREAD, HOLD): (HELD, NOTHING),
    (THREAD, HOLD_UNREAD): (LOOP, WAKE_LOOP),
    (THREAD, GIVE_BACK): (LOOP_WAITING, REARM),
    (THREAD, GIVE_BACK_UNREAD): (LOOP, WAKE_LOOP),
    (THREAD, RECLAIM): _KEEP[THREAD],  # (the loop takes back only what no thread leads)
    (THREAD, RECLAIM_UNREAD): _KEEP[THREAD],
    (THREAD, SILENCE_FAILED): (LOOP_WAITING, NOTHING),  # the take-over did not happen
    (THREAD, REARM_FAILED): _BROKEN,
    # A thread reads, the reader task is parked: whatever the thread does next, it hands
    # the connection back to the reader task (it is awake; nothing to re-arm or hold).
    (PARKED, LOOP_WAITS): _BROKEN,
    (PARKED, LOOP_WAKES): _BROKEN,
    (PARKED, LEAD): _KEEP[PARKED],
    (PARKED, HOLD): (LOOP, HAND_BACK),
    (PARKED, HOLD_UNREAD): (LOOP, HAND_BACK),
    (PARKED, GIVE_BACK): (LOOP, HAND_BACK),
    (PARKED, GIVE_BACK_UNREAD): (LOOP, HAND_BACK),
    (PARKED, RECLAIM): _KEEP[PARKED],
    (PARKED, RECLAIM_UNREAD): _KEEP[PARKED],
    (PARKED, SILENCE_FAILED): _BROKEN,
    (PARKED, REARM_FAILED): _BROKEN,
    # Set aside, silenced: the next thread leads it without a syscall; the loop takes it
    # back re-armed (or woken, when closed meanwhile). A reader task woken by its
    # deadline takes it as it is (trio re-arms at its next wait).
    (HELD, LOOP_WAITS): _BROKEN,
    (HELD, LOOP_WAKES): (LOOP, NOTHING),
    (HELD, LEAD): (THREAD, NOTHING),
    (HELD, HOLD): _KEEP[HELD],
    (HELD, HOLD_UNREAD): _KEEP[HELD],
    (HELD, GIVE_BACK): (LOOP_WAITING, REARM),
    (HELD, GIVE_BACK_UNREAD): (LOOP, WAKE_LOOP),
    (HELD, RECLAIM): (LOOP_WAITING, REARM),
    (HELD, RECLAIM_UNREAD): (LOOP, WAKE_LOOP),
    (HELD, SILENCE_FAILED): _BROKEN,
    (HELD, REARM_FAILED): _BROKEN,
    # Broken: nothing is read by a thread again; the reader task runs on (into the
    # connection's failure) instead of waiting.
    (BROKEN, LOOP_WAITS): _KEEP[BROKEN],
    (BROKEN, LOOP_WAKES): (BROKEN, NOTHING),
    (BROKEN, LEAD): _KEEP[BROKEN],
    (BROKEN, HOLD): _KEEP[BROKEN],
    (BROKEN, HOLD_UNREAD): _KEEP[BROKEN],
    (BROKEN, GIVE_BACK): _KEEP[BROKEN],
    (BROKEN, GIVE_BACK_UNREAD): _KEEP[BROKEN],
    (BROKEN, RECLAIM): _KEEP[BROKEN],
    (BROKEN, RECLAIM_UNREAD): _KEEP[BROKEN],
    (BROKEN, SILENCE_FAILED): _KEEP[BROKEN],
    (BROKEN, REARM_FAILED): _KEEP[BROKEN],
}


def check_table(table: dict[tuple[int, int], tuple[int, int]] | None = None) -> None:
    """Raise AssertionError unless ``table`` (default :data:`TABLE`) is total over
    :data:`STATES` x :data:`EVENTS`, leads only to states, performs only actions, refuses
    without moving, and breaks exactly where it says ILLEGAL, for good."""
    table = TABLE if table is None else table
    for state in STATES:
        for event in EVENTS:
            name = f"({STATE_NAMES[state]}, {EVENT_NAMES[event >> 3]})"
            assert (state, event) in table, f"{name}: no transition"
            after, action = table[state, event]
            assert after in STATES, f"{name}: leads to {after!r}, not a state"
            assert action in ACTIONS, f"{name}: action {action!r} is not an action"
            assert action != REFUSED or after == state, f"{name}: refused, yet moves"
            assert (action == ILLEGAL) == (after == BROKEN != state), (
                f"{name}: ILLEGAL must lead to BROKEN and only it"
            )
            if state == BROKEN:
                assert after == BROKEN, f"{name}: leaves BROKEN"
    assert len(table) == len(STATES) * len(EVENTS), "entries outside STATES x EVENTS"


def compile_table(
    table: dict[tuple[int, int], tuple[int, int]],
) -> tuple[tuple[int, int], ...]:
    """``table`` as a flat tuple indexed by ``state | event`` (unused slots: ILLEGAL)."""
    flat = [_BROKEN] * ((max(EVENTS) | 7) + 1)
    for (state, event), step in table.items():
        flat[state | event] = step
    return tuple(flat)


check_table()
#: :data:`TABLE`, indexed by ``state | event``: ``next_state, action = STEP[state | event]``.
STEP = compile_table(TABLE)
#: The states in which a thread's ``lead`` may succeed (read without the lock first).
LEADABLE = frozenset(state for state in STATES if TABLE[state, LEAD][1] != REFUSED)


def step(state: int, event: int) -> tuple[int, int]:
    """``(next state, action)`` for ``event`` in ``state`` (the shell indexes :data:`STEP`
    itself)."""
    return STEP[state | event]


def describe(state: int, event: int | None = None) -> str:
    """Names, for messages: ``'thread'`` or ``'thread --lead-->'``."""
    if event is None:
        return STATE_NAMES[state]
    return f"{STATE_NAMES[state]} --{EVENT_NAMES[event >> 3]}-->"
