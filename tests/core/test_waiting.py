"""The waiting seam (core/_waiting.py): production's waiters and the simulator's keep one
contract (``regency.testing.check_waiter``), each in its own world: real procs and sockets,
or a simulated cluster in virtual time."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from regency.actor import ProcMesh
from regency.core import _waiting
from regency.core._controller import current_runtime
from regency.core._future import Future
from regency.core._leader import Leader
from regency.sim import simulate
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


def test_the_simulators_lockstep_waiter_keeps_the_contract() -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        sleeper = procs.spawn("sleeper", Sleeper).slice(hosts=0, gpus=0)
        waiter: Any = _waiting.current()
        assert not waiter.runs_freely and not waiter.serves_any_thread
        check_waiter(waiter, lambda seconds: sleeper.nap.call_one(seconds))
        checker = procs.spawn("checker", Checker).slice(hosts=1, gpus=0)
        return str(checker.check.call_one(sleeper).get())

    first = simulate(program, seed=3, hosts=2)
    assert first.value == "LockstepWaiter"
    again = simulate(program, seed=3, hosts=2)
    assert (again.value, again.virtual_time) == (first.value, first.virtual_time)


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
