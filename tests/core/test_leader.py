"""Threads that wait read their own messages (core/_leader.py), with real processes: the
controller's thread in ``Future.get`` reads its reply, an idle actor thread its next call."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from regency.actor import ProcMesh, SupervisionError
from regency.core._controller import current_runtime
from regency.core._leader import Leader, loop_reads
from regency.transports._sockets import SocketConnection

from ..conftest import SpawnProcs
from .leader_actors import Gate, Opener, Seq

T = 30


@pytest.fixture
def pm(spawn_procs: SpawnProcs) -> ProcMesh:
    return spawn_procs(per_host={"gpus": 2})


@pytest.fixture
def leader() -> Iterator[Leader]:
    rt = current_runtime()
    assert rt.leader is not None, "production runtimes read on waiting threads by default"
    yield rt.leader
    rt.leader.on_lead = None


def test_replies_and_calls_are_read_by_the_threads_that_wait(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("lead_seq", Seq).slice(gpus=0)
    seq.taken.call_one().get(T)
    before, in_proc = leader.led, seq.led.call_one().get(T)
    for i in range(200):
        assert seq.take.call_one(i).get(T) == i
    # Each round trip gives both threads a chance; a few lose it to the machine's load
    # (the reply came before the thread got to wait, or the loop was reading).
    assert leader.led - before >= 50
    assert seq.led.call_one().get(T) - in_proc >= 50


def test_calls_and_replies_stay_in_order_whichever_thread_reads_them(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("lead_order", Seq).slice(gpus=1)
    before = leader.led
    futures = []
    for i in range(3000):
        futures.append(seq.take.call_one(i))
        if i % 50 == 0:  # the thread waits (and reads) while the rest queue up behind
            assert futures[-1].get(T) == i
    assert [f.get(T) for f in futures] == list(range(3000))
    assert seq.taken.call_one().get(T) == list(range(3000))
    assert leader.led > before


def test_a_proc_killed_while_the_waiting_thread_reads_fails_the_call(
    pm: ProcMesh, leader: Leader
) -> None:
    victim = pm.spawn("lead_victim", Seq).slice(gpus=1)
    pid = victim.pid.call_one().get(T)
    leading = threading.Event()
    leader.on_lead = leading.set

    def kill_once_the_thread_reads() -> None:
        # A wait that found every connection busy (the loop reading one just then) waits
        # on its lock instead and never leads: killed all the same after a while, so that
        # the call still fails rather than block for good.
        leading.wait(5)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_the_thread_reads)
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(SupervisionError, match=r"lead_victim\.block\(\) failed.*(SIGKILL|signal 9)"):
            victim.block.call_one().get(T)
    finally:
        leader.on_lead = None
        leading.set()
        killer.join()
    assert time.monotonic() - started < 10


def test_get_timeout_expires_while_the_thread_reads(pm: ProcMesh, leader: Leader) -> None:
    gate = pm.spawn("lead_gate", Gate).slice(gpus=0)
    opener = pm.spawn("lead_opener", Opener).slice(gpus=0)
    fut = gate.wait.call_one()
    for _ in range(5):  # a wait that found the loop mid-read waits on its lock: try again
        before = leader.led
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"lead_gate\.wait did not finish within 0\.2 s"):
            fut.get(0.2)
        assert 0.15 <= time.monotonic() - started < 10
        if leader.led > before:
            break
    else:
        pytest.fail("the waiting thread never read its own connections")
    opener.open.call_one().get(T)
    assert fut.get(T) == "opened"  # the connections went back: the reply still comes
    assert gate.wait.call_one().get(T) == "opened"


def test_a_thread_keeps_its_poll_set_until_the_connections_it_leads_change(
    spawn_procs: SpawnProcs, leader: Leader
) -> None:
    first = spawn_procs(per_host={"gpus": 1}).spawn("poll_first", Seq)
    first.take.call_one(-1).get(T)
    before, pollers = leader.led, []
    for i in range(100):
        assert first.take.call_one(i).get(T) == i
        pollers.append(leader._local.poller)  # kept alive here: identities stay distinct
    assert leader.led - before >= 50
    # A connection handed back mid-wait (an acknowledgement frame is the loop's) drops the
    # kept set; otherwise every wait polls the same one.
    assert len({id(p) for p in pollers}) <= 25
    # Another proc mesh: a new connection, which the next waits must poll (a kept set
    # without it would leave its replies unread: neither the silenced loop nor the
    # waiting thread would see them, and get() would time out).
    second = spawn_procs(per_host={"gpus": 1}).spawn("poll_second", Seq)
    for i in range(50):
        assert second.take.call_one(i).get(T) == i
        assert first.take.call_one(i).get(T) == i
    assert second.taken.call_one().get(T) == list(range(50))


def test_replies_that_come_during_a_fan_out_are_read_by_the_sending_thread(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("fan_seq", Seq)
    assert list(seq.take.call(0).get(T).values()) == [0, 0]
    leadable = current_runtime().inbound.leadable
    me = threading.get_ident()
    # A connection the loop was reading just then is not led, and a frame on another one
    # may end the select early: under load a few attempts may not see it.
    for attempt in range(50):
        resolved_on: list[int] = []

        def send(attempt: int = attempt, resolved_on: list[int] = resolved_on) -> None:
            # As in a fan-out whose first rank answers before the last frame is sent.
            fut = seq.slice(gpus=0).take.call_one(attempt)
            fut.add_done_callback(lambda: resolved_on.append(threading.get_ident()))
            select.select([conn.fileno() for conn in leadable.values()], [], [], T)

        leader.sending(send)
        if resolved_on == [me]:
            break
    else:
        pytest.fail("the sending thread never read a reply that came while it sent")
    # Everything went back to the loop: later calls, mesh calls and waits go on as before.
    assert seq.slice(gpus=1).take.call_one(-1).get(T) == -1
    assert list(seq.take.call(1).get(T).values()) == [1, 1]


def test_a_fan_out_that_raises_gives_the_connections_back(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("fan_raise", Seq).slice(gpus=0)
    assert seq.take.call_one(0).get(T) == 0

    def send() -> None:
        raise ValueError("message too large")

    for _ in range(3):
        with pytest.raises(ValueError, match="message too large"):
            leader.sending(send)
    # Connections left led would be read by no one (the loop's interest is silenced, and
    # a waiting thread cannot lead them): these would time out.
    for i in range(20):
        assert seq.take.call_one(i).get(T) == i


def _held(rt_leadable: dict[int, object]) -> list[bool]:
    return [bool(getattr(conn, "held", False)) for conn in rt_leadable.values()]


def test_a_mesh_call_sets_its_connections_aside_for_the_get_that_follows(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("hold_seq", Seq)
    assert list(seq.take.call(-1).get(T).values()) == [-1, -1]
    leadable = current_runtime().inbound.leadable
    for attempt in range(100):  # (the loop may be reading one just then; load may delay us)
        before = leader.holds
        fut = seq.take.call(attempt)
        held_after_call = _held(leadable)
        # (Under load both replies may come while the fan-out still reads: get() then has
        # nothing to wait for, and the attempt shows only the fan-out's part.)
        waits = not fut.done()
        assert list(fut.get(T).values()) == [attempt, attempt]
        # Set aside by the fan-out, then by get() for the next fan-out.
        # (A connection of another test's procs may be busy: not every one is taken.)
        if waits and any(held_after_call) and leader.holds == before + 2 and any(_held(leadable)):
            break
    else:
        pytest.fail(
            "a mesh call never set its connections aside for its get(): "
            f"{held_after_call}, {_held(leadable)}, {leader.holds - before} holds"
        )
    # A first call to one rank's get() leads every connection (to learn which one that
    # proc's replies come on), gives them back and sets nothing aside.
    before = leader.holds
    assert seq.slice(gpus=0).take.call_one(-2).get(T) == -2
    assert leader.holds == before and not leader._local.fanned_out
    # Later calls, from this thread and with the loop reading, go on as before.
    for i in range(50):
        assert list(seq.take.call(i).get(T).values()) == [i, i]
        assert seq.slice(gpus=i % 2).take.call_one(i).get(T) == i
    expected = [j for i in range(50) for j in ((i, i) if i % 2 == 0 else (i,))]
    assert seq.slice(gpus=0).taken.call_one().get(T)[-len(expected) :] == expected


def test_connections_set_aside_go_back_to_the_loop_when_no_thread_comes_back(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("hold_back", Seq)
    leadable = current_runtime().inbound.leadable
    for attempt in range(20):
        replied = threading.Event()
        fut = seq.take_slowly.call(attempt)  # the replies come after the fan-out
        fut.add_done_callback(replied.set)
        held = any(_held(leadable))
        # Its replies come on connections set aside, and no thread waits for them: the
        # loop takes the connections back and reads them (the callback runs there).
        assert replied.wait(T)
        assert list(fut.get(T).values()) == [attempt, attempt]
        if held:
            break
    else:
        pytest.fail("a fan-out never set its connections aside")


def test_a_thread_waiting_on_the_loop_takes_back_what_threads_set_aside(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("hold_lock", Seq)
    leadable = current_runtime().inbound.leadable
    for attempt in range(20):
        fut = seq.take_slowly.call(attempt)
        if any(_held(leadable)):
            break
        fut.get(T)
    else:
        pytest.fail("a fan-out never set its connections aside")
    with leader.loop_waiting():  # as a thread that waits on its lock does
        assert not any(_held(leadable))
        assert list(fut.get(T).values()) == [attempt, attempt]
        fut = seq.take.call(1)  # and this fan-out sets nothing aside
        assert not any(_held(leadable))
        assert list(fut.get(T).values()) == [1, 1]
    fut = seq.take_slowly.call(2)
    with loop_reads():  # a thread that may not read waits on its lock: the loop reads
        assert list(fut.get(T).values()) == [2, 2]


def test_threads_calling_meshes_at_once_all_get_their_replies(
    pm: ProcMesh, leader: Leader
) -> None:
    seq = pm.spawn("hold_many", Seq)
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            for i in range(150):
                if k == 2 and i % 10 == 0:
                    with loop_reads():  # now and then a thread that waits on its lock
                        assert seq.slice(gpus=i % 2).take.call_one(i).get(T) == i
                if i % 3:
                    assert list(seq.take.call(i).get(T).values()) == [i, i]
                else:
                    assert seq.slice(gpus=(i + k) % 2).take.call_one(i).get(T) == i
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []


def test_awaiting_a_call_gives_the_loop_the_connections_its_fan_out_set_aside(
    pm: ProcMesh, leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = pm.spawn("hold_await", Seq)
    me = threading.get_ident()
    reclaimed_here: list[bool] = []
    reclaim = SocketConnection.reclaim

    def recording(conn: SocketConnection) -> bool:
        taken = reclaim(conn)
        if taken and threading.get_ident() == me:
            reclaimed_here.append(True)
        return taken

    monkeypatch.setattr(SocketConnection, "reclaim", recording)

    async def main() -> list[int]:
        got = []
        for i in range(20):
            # Its fan-out sets the connections aside (the replies come later)...
            fut = seq.take_slowly.call(i)
            values = list((await fut).values())  # ...which the loop needs: it resolves it
            assert values == [i, i]
            got.append(values[0])
            if reclaimed_here:
                break
        return got

    got = asyncio.run(main())
    assert reclaimed_here, "an await never gave back the connections set aside"
    assert got == list(range(len(got)))


def test_a_thread_that_waits_for_one_rank_reads_only_that_procs_connection(
    spawn_procs: SpawnProcs, leader: Leader
) -> None:
    seq = spawn_procs(per_host={"gpus": 3}).spawn("lead_one", Seq)
    assert list(seq.take.call(-1).get(T).values()) == [-1, -1, -1]
    ranks = [seq.slice(gpus=g) for g in range(3)]
    leadable = current_runtime().inbound.leadable
    assert len(leadable) >= 3  # one inbound connection per proc (and any older ones)
    polled: list[int] = []
    leader.on_lead = lambda: polled.append(len(leader._local.sets[_last_set(leader)][1]))
    before = leader.led_one
    for i in range(150):
        assert ranks[i % 3].take.call_one(i).get(T) == i
    leader.on_lead = None
    # After a reply from each proc was read on this thread, a wait leads that proc's
    # connection alone (a few waits lose to the machine's load: the loop was reading).
    assert leader.led_one - before >= 30
    assert polled.count(1) >= 30
    for g in range(3):
        assert seq.slice(gpus=g).taken.call_one().get(T) == [-1, *range(g, 150, 3)]


def test_a_wrong_guess_of_the_reply_connection_costs_time_not_the_reply(
    spawn_procs: SpawnProcs, leader: Leader
) -> None:
    seq = spawn_procs(per_host={"gpus": 2}).spawn("lead_guess", Seq)
    first, second = seq.slice(gpus=0), seq.slice(gpus=1)
    for i in range(20):  # both procs' connections learned (most waits read their reply)
        assert first.take.call_one(i).get(T) == i
        assert second.take.call_one(i).get(T) == i
    known = leader._from
    addresses = [first._route().addresses[0], second._route().addresses[0]]
    if not all(a in known for a in addresses):
        pytest.skip("the loop read every reply of a proc (machine too loaded to learn)")
    # Swap them: each wait now leads the other proc's connection, while the loop reads
    # the reply (left to it) and the future's bell wakes the thread.
    known[addresses[0]], known[addresses[1]] = known[addresses[1]], known[addresses[0]]
    wrong = known[addresses[0]]
    assert first.take.call_one(100).get(T) == 100
    # That wait forgot the wrong guess (or, if the reply was already in when the thread
    # came to wait, kept it untested); within a few more calls the right one is learned.
    for i in range(101, 121):
        assert first.take.call_one(i).get(T) == i
        if known.get(addresses[0]) not in (None, wrong):
            break
    else:
        pytest.fail("the wrong guess was never corrected")
    assert first.taken.call_one().get(T) == [*range(20), *range(100, i + 1)]


def _last_set(leader: Leader) -> tuple[object, ...]:
    """The connections of the poll set this thread used last."""
    sets = leader._local.sets
    return next(k for k, (poller, _) in sets.items() if poller is leader._local.poller)


def test_a_one_rank_wait_sets_its_connection_aside_so_the_next_reply_is_the_callers(
    pm: ProcMesh, leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a wait for one rank's reply its connection stays silenced for the loop (set
    aside): the next call's reply is read by the thread that waits for it, however late it
    comes to wait, never by the loop."""
    import regency.core._leader as leader_module

    seq = pm.spawn("hold_one", Seq)
    ranks = [seq.slice(gpus=g) for g in range(2)]
    before = leader.led_one
    for i in range(40):  # each proc's connection learned (a few waits may lose to load)
        assert ranks[i % 2].take.call_one(i).get(T) == i
    assert leader.led_one > before
    monkeypatch.setattr(leader_module, "HOLD", 60.0)  # no reclaim during the test
    me = threading.get_ident()
    by: list[int] = []
    for i in range(20):
        holds = leader.holds
        fut = ranks[0].take.call_one(i)
        fut.add_done_callback(lambda: by.append(threading.get_ident()))
        # Meanwhile the first reply comes, on a connection nobody reads...
        assert ranks[1].take.call_one(i).get(T) == i
        # ...until this wait: the callback runs here, never on the loop.
        assert fut.get(T) == i
        assert leader.holds == holds + 2
    assert by == [me] * 20
    monkeypatch.undo()
    # The loop takes the connections back once threads stop coming (HOLD again).
    assert ranks[0].taken.call_one().get(T)[-20:] == list(range(20))


def test_frames_read_on_a_thread_join_the_scheduled_acknowledgement_without_a_wake_up(
    pm: ProcMesh, leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that reads replies acknowledges every ``ack_every`` frames itself; the
    delayed acknowledgement of the frames after that joins the flush already scheduled on
    the loop instead of waking it each time (at most one wake-up per flush), and every
    frame is still acknowledged (the proc's side, where its actor thread reads the calls:
    the controller's outbox empties)."""
    rt = current_runtime()
    seq = pm.spawn("ack_join", Seq).slice(gpus=0)
    assert seq.take.call_one(-1).get(T) == -1
    wakes: list[bool] = []  # whether a flush was scheduled when a thread woke the loop
    call_soon = rt.call_soon

    def counting_call_soon(fn: object) -> None:
        if "_acknowledge" in getattr(fn, "__qualname__", ""):
            wakes.append(rt.inbound.ack_scheduled)
        call_soon(fn)  # type: ignore[arg-type]

    monkeypatch.setattr(rt, "call_soon", counting_call_soon)
    before = leader.led
    # Every ack_every frames acknowledged on the thread (twice), then a few more.
    n = 2 * rt.env.ack_every + 7
    for i in range(n):
        assert seq.take.call_one(i).get(T) == i
    assert leader.led - before > n // 2  # most replies were read on this thread
    # Never while a flush is on its way (the thread checks under the dispatch lock, which
    # the flush takes to collect its sinks), so about one per flush, not one per ack_every
    # frames. (Whether a flush starts within the loop depends on the delay and the pace:
    # one scheduled before it may cover every frame.)
    assert not any(wakes), f"{sum(wakes)} of {len(wakes)} wake-ups with a flush scheduled"
    monkeypatch.undo()
    boxes = [b for b in list(rt.outboxes.values()) if b._machine.unacked]
    deadline = time.monotonic() + T
    while any(b._machine.unacked for b in boxes):  # acknowledged within ack_delay
        assert time.monotonic() < deadline, "frames read on a thread were never acknowledged"
        time.sleep(0.01)


def test_a_connection_set_aside_goes_back_to_the_loop_while_the_thread_calls_another_proc(
    pm: ProcMesh, leader: Leader
) -> None:
    """A thread that waited for one proc's reply and then goes on calling another does not
    keep the first proc's connection away from the loop: it goes back while the thread
    calls (frames only the loop handles on it, such as log lines, are read). Which path
    takes it back is not told apart here: under load a wait for the loop or a pause between
    calls also does; test_reclaim.py pins the per-connection reclaim in virtual time."""
    seq = pm.spawn("hold_other", Seq)
    first, other = seq.slice(gpus=0), seq.slice(gpus=1)
    address = first.take.call_one(-1).addresses[0]
    for i in range(40):  # each proc's connection learned (a few waits may lose to load)
        assert first.take.call_one(i).get(T) == i
        assert other.take.call_one(i).get(T) == i
    known = leader._from.get(address)
    assert known is not None, "the first proc's connection was never learned"
    conn = known[1]
    for i in range(200):  # until a wait for the first proc sets its connection aside
        assert first.take.call_one(i).get(T) == i
        if conn.held:
            break
    else:
        pytest.fail("a wait for one proc's reply never set its connection aside")
    deadline = time.monotonic() + T
    calls = 0
    while conn.held:
        assert time.monotonic() < deadline, f"still set aside after {calls} calls to another"
        assert other.take.call_one(calls).get(T) == calls
        calls += 1
    assert first.taken.call_one().get(T)[-1] == i
