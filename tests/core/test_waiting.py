"""The waiting seam (core/_waiting.py): production's waiters and the simulator's keep one
contract (``regency.testing.check_waiter``), each in its own world: real procs and sockets,
or a simulated cluster in virtual time."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio

from regency.actor import ProcMesh
from regency.core import _waiting
from regency.core._controller import current_runtime
from regency.core._future import Future
from regency.core._inbound import InboundSink
from regency.core._leader import Leader
from regency.sim import Faults, simulate
from regency.testing import check_waiter

from ..conftest import SpawnProcs
from .waiting_actors import Checker, Sleeper

T = 30


@pytest.fixture
def pm(spawn_procs: SpawnProcs) -> ProcMesh:
    return spawn_procs(per_host={"gpus": 2})


def test_the_leader_keeps_the_contract(pm: ProcMesh) -> None:
    sleeper = pm.spawn("wait_sleeper", Sleeper).slice(gpus=0)
    rt = current_runtime()
    assert type(rt.waiter) is Leader and rt.leader is rt.waiter
    assert _waiting.current() is rt.waiter, "the program's thread waits with the controller's"
    check_waiter(rt.waiter, lambda seconds: sleeper.nap.call_one(seconds))


def test_the_lock_waiter_keeps_the_contract(pm: ProcMesh) -> None:
    sleeper = pm.spawn("wait_sleeper_lock", Sleeper).slice(gpus=0)
    with _waiting.bound(_waiting.LOCK):
        check_waiter(_waiting.LOCK, lambda seconds: sleeper.nap.call_one(seconds))


def test_an_actor_thread_waits_with_its_procs_leader(pm: ProcMesh) -> None:
    sleeper = pm.spawn("wait_sleeper_actor", Sleeper).slice(gpus=1)
    checker = pm.spawn("wait_checker", Checker).slice(gpus=0)
    assert checker.check.call_one(sleeper).get(T) == "Leader"


def test_the_simulator_runs_the_production_leader_and_it_keeps_the_contract() -> None:
    """The simulator's runtimes wait with production's Leader on lockstep I/O
    (sim/_leading.py): its threads lead the simulated connections, read their replies and set
    them aside, in an order the seed decides and replays."""

    def program(hosts: Any) -> tuple[str, str, int, int]:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        sleeper = procs.spawn("sleeper", Sleeper).slice(hosts=0, gpus=0)
        waiter: Any = _waiting.current()
        assert type(waiter) is Leader
        assert not waiter.runs_freely and not waiter.serves_any_thread
        check_waiter(waiter, lambda seconds: sleeper.nap.call_one(seconds))
        checker = procs.spawn("checker", Checker).slice(hosts=1, gpus=0)
        on_actor = str(checker.check.call_one(sleeper).get())
        mesh = procs.spawn("sleepers", Sleeper)
        for _ in range(5):  # fan-outs: the sending thread leads, then holds for its get()
            assert mesh.nap.call(0.001).get().values() == [0.001] * 4
        return type(waiter).__name__, on_actor, waiter.led, waiter.holds

    first = simulate(program, seed=3, hosts=2)
    name, on_actor, led, holds = first.value
    assert (name, on_actor) == ("Leader", "Leader")
    assert led > 10 and holds > 0, (led, holds)
    again = simulate(program, seed=3, hosts=2)
    assert (again.value, again.virtual_time, again.trace_hash) == (
        first.value, first.virtual_time, first.trace_hash,
    )


def test_a_runtimes_loop_thread_refuses_to_block() -> None:
    pending: Future[int] = Future()

    async def on_a_loop() -> None:
        _waiting.enter_loop()
        try:
            assert _waiting.would_block_loop()
            with pytest.raises(RuntimeError, match="would block the runtime's event loop"):
                pending.get(1.0)
            _waiting.enter_loop()  # a second runtime on the same thread (the simulator's)
            _waiting.leave_loop()
            assert _waiting.would_block_loop(), "leaving one of two loops left the other"
        finally:
            _waiting.leave_loop()
        assert not _waiting.would_block_loop()

    before = _waiting.here.waiter
    trio.run(on_a_loop)
    assert _waiting.here.waiter is before


def test_seeds_explore_how_threads_and_the_loop_take_turns_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``Faults(read_race=...)`` each seed draws, at every lead and at every frame for a
    connection a thread leads or set aside, whether the loop wins the race for the read: its
    own interleaving of leads, holds, reclaims and the loop's reads, the baton's parked
    state included. Every run delivers every reply, in order, keeps the runtime's
    invariants (``simulate`` checks them) and replays from its seed."""
    reads: Counter[str] = Counter()
    on_thread, on_loop = InboundSink.frame_on_thread, InboundSink.frame_received

    def thread(self: InboundSink, conn: Any, frame: memoryview) -> bool:
        taken = on_thread(self, conn, frame)
        reads["thread" if taken else "declined"] += 1
        return taken

    def loop(self: InboundSink, conn: Any, frame: memoryview) -> None:
        reads["loop"] += 1
        on_loop(self, conn, frame)

    monkeypatch.setattr(InboundSink, "frame_on_thread", thread)
    monkeypatch.setattr(InboundSink, "frame_received", loop)

    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        mesh = procs.spawn("sleepers", Sleeper)
        one = mesh.slice(hosts=1, gpus=1)
        checker = procs.spawn("checker", Checker).slice(hosts=0, gpus=0)
        for _ in range(5):
            pending = [one.nap.call_one(float(i)) for i in range(5)]
            assert mesh.nap.call(0.0005).get().values() == [0.0005] * 4
            assert [f.get() for f in pending] == [0.0, 1.0, 2.0, 3.0, 4.0]
        return str(checker.check.call_one(one).get())

    seen = []
    for seed in range(4):
        reads.clear()
        result = simulate(program, seed=seed, hosts=2, faults=Faults(read_race=0.3))
        assert result.value == "Leader"
        seen.append(tuple(sorted(reads.items())))
        assert "read_race" in {event.kind for event in result.events}
    assert len(set(seen)) > 1, f"every seed read the same way: {seen}"
    reads.clear()
    simulate(program, seed=3, hosts=2, faults=Faults(read_race=0.3))
    assert tuple(sorted(reads.items())) == seen[3]
    assert Faults().read_race == 0.0
    with pytest.raises(ValueError, match=r"read_race must be a probability in \[0, 1\]"):
        Faults(read_race=1.5)
