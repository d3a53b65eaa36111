"""The invariants fire on real bugs only.

Two corpora: legitimate programs that leave work behind or handle errors themselves (they must
pass, on several seeds), and planted bugs, one per invariant, each of which the checker must
name. A checker that fires on user behaviour teaches users to ignore it; one that misses a
planted bug checks nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from regency.actor import Actor, ActorError, SupervisionError, endpoint
from regency.core import _oversight, _runtime
from regency.core._inbound import InboundSessions
from regency.sim import current, simulate
from regency.sim._cluster import _SimProc

from ..conftest import RootFailures
from .actors import Counter


class Worker(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("planned")

    @endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds

    @endpoint
    def echo(self, value: int) -> int:
        return value


# -- legitimate programs -------------------------------------------------------------------


def spawn_procs_and_return(hosts: Any) -> None:
    hosts.spawn_procs(per_host={"gpus": 1})


def spawn_a_mesh_and_return(hosts: Any) -> None:
    hosts.spawn_procs(per_host={"gpus": 2}).spawn("left", Counter)


def abandon_a_call(hosts: Any) -> str:
    workers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker)
    workers.echo.call(1).get()
    workers.nap.call(100.0)  # never awaited
    return "returned"


def abandon_a_call_before_the_actors_exist(hosts: Any) -> None:
    hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker).nap.call(100.0)


def broadcast_and_return(hosts: Any) -> None:
    counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)
    for _ in range(10):
        counters.incr.broadcast(1)


def stop_a_mesh_mid_call(hosts: Any) -> str:
    workers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker)
    napping = workers.nap.call(50.0)
    workers.stop().get()
    try:
        napping.get()
        return "answered"
    except (ActorError, SupervisionError) as exc:
        return type(exc).__name__


def stop_a_mesh_mid_call_and_walk_away(hosts: Any) -> None:
    workers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker)
    workers.nap.call(50.0)
    workers.stop()


def stop_procs_mid_call(hosts: Any) -> str:
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    workers = procs.spawn("w", Worker)
    workers.echo.call(1).get()
    napping = workers.nap.call(50.0)
    procs.stop().get()
    try:
        napping.get()
        return "answered"
    except SupervisionError:
        return "SupervisionError"


def catch_an_actor_error(hosts: Any) -> str:
    workers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker)
    try:
        workers.fail.call().get()
    except ActorError:
        return "caught"
    return "no error"


def catch_a_crash(hosts: Any) -> str:
    workers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker)
    workers.echo.call(1).get()
    napping = workers.nap.call(50.0)
    current().crash_host(0)
    try:
        napping.get()
    except SupervisionError:
        return "caught"
    return "no error"


def return_early_from_a_loop(hosts: Any) -> int:
    counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)
    for i in range(100):
        if counters.incr.call(1).get().values()[0] > 3:
            return i
    return -1


def raise_after_spawning(hosts: Any) -> None:
    hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Worker).nap.call(5.0)
    raise KeyError("the program's own error")


async def async_abandon_a_call(hosts: Any) -> None:
    counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)
    await counters.value.call()
    counters.nap.call(100.0)


async def async_spawn_and_return(hosts: Any) -> None:
    hosts.spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)


LEGITIMATE: list[tuple[Callable[[Any], Any], Any]] = [
    (spawn_procs_and_return, None),
    (spawn_a_mesh_and_return, None),
    (abandon_a_call, "returned"),
    (abandon_a_call_before_the_actors_exist, None),
    (broadcast_and_return, None),
    (stop_a_mesh_mid_call, "answered"),  # stop() lets the call in hand finish
    (stop_a_mesh_mid_call_and_walk_away, None),
    (stop_procs_mid_call, "SupervisionError"),
    (catch_an_actor_error, "caught"),
    (catch_a_crash, "caught"),
    (return_early_from_a_loop, 3),
    (async_abandon_a_call, None),
    (async_spawn_and_return, None),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("program", "value"), LEGITIMATE, ids=[p.__name__ for p, _ in LEGITIMATE]
)
def test_legitimate_programs_break_no_invariant(
    program: Callable[[Any], Any], value: Any, seed: int, roots: RootFailures
) -> None:
    assert simulate(program, seed=seed, hosts=2).value == value


def test_a_program_that_raises_gets_its_own_error_back() -> None:
    # Work it queued before raising (a launch, a call) must not crash the simulation's loop.
    with pytest.raises(KeyError, match="the program's own error") as info:
        simulate(raise_after_spawning, seed=3, hosts=1)
    assert "replay: regency.sim.simulate(program, seed=3, hosts=1)" in str(info.value.__notes__)


# -- planted bugs, one per invariant -------------------------------------------------------


def chatter(hosts: Any) -> None:
    """Calls that keep frames in flight across a disconnect (resends happen)."""
    counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)
    counters.incr.call().get()
    current().clog(0, 0.5)
    for _ in range(3):
        counters.incr.broadcast()
    current().disconnect("controller", 0)
    counters.slice(hosts=0).incr.call_one().get(timeout=3600)


def planted(program: Callable[[Any], Any], **options: Any) -> str:
    with pytest.raises(BaseException) as info:
        simulate(program, **options)
    return "\n".join(getattr(info.value, "__notes__", [])) + str(info.value)


def test_planted_duplicate_delivery_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1. The receiver forgets which frames of a session it handled: resends run twice.
    original = InboundSessions.opened

    def forgets(self: Any, session: str, first: int) -> Any:
        state = original(self, session, first)
        return type(state)()  # a fresh record: nothing handled

    monkeypatch.setattr(InboundSessions, "opened", forgets)
    report = planted(chatter, seed=2, hosts=1, timeout=600)
    assert "was handled twice" in report, report


def test_planted_skipped_frame_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2. The receiver believes one frame more was handled than was: a frame is lost.
    original = InboundSessions.opened

    def skips(self: Any, session: str, first: int) -> Any:
        resumed = session in self.delivered
        state = original(self, session, first)
        if resumed:
            state.handled += 1
        return state

    monkeypatch.setattr(InboundSessions, "opened", skips)
    report = planted(chatter, seed=2, hosts=1, timeout=600)
    assert "(order broken or frames lost)" in report, report


def test_planted_hang_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3. After a reconnect the sender does not resend what was never acknowledged.
    original = _runtime.Outbox._resume

    def forgetful(self: Any, conn: Any) -> None:
        self._unacked.clear()
        original(self, conn)

    monkeypatch.setattr(_runtime.Outbox, "_resume", forgetful)
    report = planted(chatter, seed=2, hosts=1, timeout=600)
    assert "was neither handled nor failed within" in report, report


def owner_with_crash(hosts: Any) -> None:
    workers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("owned", Worker)
    workers.echo.call(1).get()
    current().crash_host(0)
    try:
        workers.echo.call(2).get()
    except SupervisionError:
        pass


def test_planted_double_report_is_caught(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    # 4a. Supervision tells the owner twice.
    original = _oversight.Oversight._perform

    def twice(self: Any, action: Any) -> None:
        original(self, action)
        if type(action).__name__ in ("Notify", "RunRootHook"):
            original(self, action)

    monkeypatch.setattr(_oversight.Oversight, "_perform", twice)
    report = planted(owner_with_crash, seed=1, hosts=1)
    assert "was told twice that rank 0 failed" in report, report


def test_planted_lost_report_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4b. Supervision never tells the owner of a crashed proc's actors.
    original = _oversight.Oversight._perform

    def mute(self: Any, action: Any) -> None:
        if type(action).__name__ not in ("Notify", "RunRootHook"):
            original(self, action)

    monkeypatch.setattr(_oversight.Oversight, "_perform", mute)
    report = planted(owner_with_crash, seed=1, hosts=1)
    assert "was never told that rank 0 failed, though it is alive" in report, report


def test_planted_leftover_proc_is_caught(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    # 5a. Procs ignore STOP_PROC and the launcher's kill does not kill.
    original = _runtime.Runtime.stop

    def stubborn(self: Any) -> None:
        if self.parent_address is None:
            original(self)

    monkeypatch.setattr(_runtime.Runtime, "stop", stubborn)
    monkeypatch.setattr(_SimProc, "kill", lambda self: None)
    report = planted(spawn_a_mesh_and_return, seed=1, hosts=1)
    assert "simulated proc(s) still run after the controller stopped its procs" in report, report


def test_planted_waiting_port_is_caught(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    # 5b. A lost proc does not fail the calls waiting on it.
    original = _runtime.Runtime._lose

    def keeps_ports(self: Any, address: str, exc: BaseException, child: Any) -> None:
        ports = dict(self.ports)
        original(self, address, exc, child)
        self.ports.update(ports)

    monkeypatch.setattr(_runtime.Runtime, "_lose", keeps_ports)
    report = planted(abandon_a_call, seed=1, hosts=1)
    assert "reply port(s) of the controller still wait on procs that are gone" in report, report
