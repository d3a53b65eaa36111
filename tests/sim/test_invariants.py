"""The invariant checker that runs on every simulated run, and the process faults.

Random fault schedules, crashes and pauses included, run against the invariants; planted bugs
(a failure reported twice, a lost frame nobody hears about) show the checker catches what it
claims to; pauses and silent links show the runtime ends every call within its timeouts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings

from regency.actor import Actor, ActorError, SupervisionError, endpoint
from regency.core import _oversight, _runtime
from regency.core._inbound import _ACK_DELAY
from regency.sim import (
    CrashProcFault,
    Faults,
    FaultSchedule,
    InvariantViolation,
    PauseProcFault,
    current,
    fault_schedules,
    simulate,
)

from ..conftest import RootFailures
from .actors import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Faults strike the simulated hosts; the controller's host stays up (crashing it ends the run).
HOSTS = ["host0", "host1", "host2"]


class Boss(Actor):
    """Owns a mesh of counters on procs it spawns; handles their failures."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, tuple[int, ...]]] = []

    @endpoint
    def build(self, hosts: Any) -> None:
        self.counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("workers", Counter)

    @endpoint
    def work(self, rounds: int) -> list[Any]:
        out: list[Any] = []
        for _ in range(rounds):
            try:
                out.append(sum(self.counters.incr.call().get(timeout=600).values()))
            except (SupervisionError, ActorError) as exc:
                out.append(type(exc).__name__)
        return out

    @endpoint
    async def nap(self, seconds: float) -> None:
        await trio.sleep(seconds)

    @endpoint
    def seen(self) -> list[tuple[str, tuple[int, ...]]]:
        return self.failures

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append((failure.mesh_name, failure.ranks))
        return True


def workload(hosts: Any) -> list[Any]:
    """A boss on host0 owns counters on every host and calls them; any fault may strike."""
    results: list[Any] = []
    boss = hosts.slice(hosts=0).spawn_procs().spawn("boss", Boss)
    try:
        boss.build.call_one(hosts).get()
    except (SupervisionError, ActorError) as exc:
        return [type(exc).__name__]
    for _ in range(6):
        try:
            results.extend(boss.work.call_one(3).get())
            boss.nap.call_one(1.0).get()  # virtual time, for faults to happen in
        except (SupervisionError, ActorError) as exc:
            results.append(type(exc).__name__)
            break
    return results


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(schedule=fault_schedules(HOSTS, horizon=6.0, max_faults=4, crashes=True, procs=True))
@pytest.mark.slow
def test_random_faults_crashes_and_pauses_keep_the_invariants(
    schedule: FaultSchedule, roots: RootFailures
) -> None:
    # simulate() raises InvariantViolation if any guarantee broke; a hang shows as a timeout.
    simulate(workload, seed=3, hosts=3, faults=schedule, timeout=3600, buggify=None)


def test_random_crash_and_pause_rates_keep_the_invariants(roots: RootFailures) -> None:
    faults = Faults(crash=0.3, pause=0.5, disconnect=0.3, mean_duration=3.0)
    kinds = set()
    for seed in range(4):
        result = simulate(workload, seed=seed, hosts=3, faults=faults, timeout=3600, buggify=True)
        kinds |= {e.kind for e in result.events}
    assert {"crash_proc", "pause"} <= kinds


def test_a_short_pause_delays_calls_and_a_long_one_gets_the_proc_killed(
    roots: RootFailures,
) -> None:
    def program(hosts: Any) -> tuple[list[int], float, str]:
        counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("paused", Counter)
        counters.incr.call().get()
        target = counters._procs[1][1]
        current().pause_proc(target, 3.0)  # shorter than heartbeat_timeout (10 s)
        start = current().now()
        values = counters.incr.call().get().values()
        waited = current().now() - start
        current().pause_proc(target, 60.0)
        try:
            counters.incr.call().get()
        except SupervisionError as exc:
            return values, waited, str(exc)
        return values, waited, "answered while paused"

    values, waited, error = simulate(program, seed=2, hosts=2).value
    assert values == [2, 2]
    assert 2.9 < waited < 4.0
    assert "sent no heartbeat" in error and "killed by signal 9" in error
    assert roots.wait_for("paused").ranks == (1,)


def test_scheduled_proc_faults_pick_procs_by_position(roots: RootFailures) -> None:
    schedule = FaultSchedule(
        faults=(PauseProcFault(0.5, 0, 1.0), CrashProcFault(2.0, 7)),  # 7 % 3 procs: the 2nd
    )
    result = simulate(workload, seed=1, hosts=3, faults=schedule, timeout=3600)
    crashes = [e.detail for e in result.events if e.kind == "crash_proc"]
    pauses = [e.detail for e in result.events if e.kind == "pause"]
    assert len(crashes) == 1 and len(pauses) == 1
    assert "SupervisionError" in result.value or any(isinstance(v, int) for v in result.value)


def test_a_silent_link_fails_calls_within_the_delivery_timeout() -> None:
    # 30 s of extra latency between two procs' hosts, nothing else wrong: the heartbeats to the
    # controller flow, so only the delivery layer's own watchdog can notice.
    class Caller(Actor):
        @endpoint
        def call(self, target: Any) -> str:
            start = current().now()
            try:
                target.incr.call_one().get()
            except SupervisionError as exc:
                return f"{current().now() - start:.1f} {exc}"
            return f"{current().now() - start:.1f} answered"

    def program(hosts: Any) -> str:
        target = hosts.slice(hosts=1).spawn_procs().spawn("far", Counter)
        caller = hosts.slice(hosts=0).spawn_procs().spawn("caller", Caller)
        assert caller.call.call_one(target).get().endswith("answered")  # connected
        current().delay("host0", "host1", 30.0, 3600.0)
        result: str = caller.call.call_one(target).get()
        return result

    # Without the watchdog the call would answer after 60 s (a round trip at 30 s a way): the
    # frame goes unacknowledged for delivery_timeout (10 s), the reconnect gets no answer
    # within delivery_timeout either, and the call fails.
    result = simulate(program, seed=4, hosts=2).value
    seconds, _, why = result.partition(" ")
    assert 10.0 < float(seconds) < 35.0, result
    assert "unacknowledged" in why or "no answer" in why or "no reconnection" in why, result


def test_the_checker_catches_a_failure_reported_twice(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    original = _oversight.Oversight._perform

    def twice(self: Any, action: Any) -> None:
        original(self, action)
        if type(action).__name__ == "Notify":
            original(self, action)

    monkeypatch.setattr(_oversight.Oversight, "_perform", twice)
    schedule = FaultSchedule(faults=(CrashProcFault(1.0, 1),))
    with pytest.raises(InvariantViolation, match=r"was told twice that rank 0 failed") as info:
        simulate(workload, seed=1, hosts=3, faults=schedule, timeout=3600)
    assert "replay: regency.sim.simulate(program, seed=1, hosts=3" in str(info.value)


def test_the_checker_catches_a_frame_lost_without_an_error(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    # The bug: after a reconnect, frames that were never acknowledged are not resent, and
    # nobody is told. The program's call would wait forever; the checker names the frame.
    original = _runtime.Outbox._resume

    def forgetful(self: Any, conn: Any) -> None:
        self._unacked.clear()
        original(self, conn)

    monkeypatch.setattr(_runtime.Outbox, "_resume", forgetful)

    def program(hosts: Any) -> None:
        counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("c", Counter)
        counters.incr.call().get()
        current().clog("host0", 0.5)
        counters.incr.broadcast()
        current().disconnect("controller", "host0")
        counters.slice(hosts=0).incr.call_one().get(timeout=3600)

    with pytest.raises(BaseException) as info:
        simulate(program, seed=2, hosts=1, timeout=600)
    notes = "\n".join(getattr(info.value, "__notes__", [])) + str(info.value)
    assert "was neither handled nor failed within" in notes, notes


def test_a_runtime_forgets_sessions_that_cannot_come_back() -> None:
    def program(hosts: Any) -> tuple[int, int, int]:
        controller = current().controller
        assert controller is not None
        sleeper = hosts.spawn_procs().spawn("sleeper", Counter)
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        counters = procs.spawn("c", Counter)
        counters.incr.call().get()
        sleeper.nap.call_one(0.1).get()
        before = len(controller.inbound.delivered)
        procs.stop().get()
        sleeper.nap.call_one(1.0).get()
        still = len(controller.inbound.delivered)
        sleeper.nap.call_one(60.0).get()  # > 3 x delivery_timeout + 2 heartbeat ticks
        return before, still, len(controller.inbound.delivered)

    before, still, after = simulate(program, seed=1, hosts=1).value
    assert before >= 3 and still == before
    assert after == before - 2  # the two stopped procs' sessions


def test_a_forgotten_session_cannot_resume() -> None:
    def program(hosts: Any) -> str:
        controller = current().controller
        assert controller is not None
        try:
            controller.inbound.opened("someone#0#1", 5)
        except ValueError as exc:
            return str(exc)
        return "accepted"

    message = simulate(program, seed=1, hosts=1).value
    assert "delivery session someone#0#1 resumes at frame 5, but this process forgot it" in message


def test_buggify_is_switched_on_by_the_seed_and_reaches_the_runtime() -> None:
    from regency.core._config import current_config

    def program(hosts: Any) -> tuple[float, int, float]:
        counters = hosts.spawn_procs(per_host={"gpus": 2}).spawn("b", Counter)
        total = sum(counters.incr.call().get().values())
        assert current().controller is not None
        return current_config().delivery_timeout, total, current().controller.ack_delay

    seen: dict[str, int] = {}
    for seed in range(12):
        result = simulate(program, seed=seed, hosts=2, buggify=None)
        switched = [e.detail for e in result.events if e.kind == "buggify"]
        timeout, total, ack_delay = result.value
        assert total == 4
        if not switched:
            seen["off"] = seen.get("off", 0) + 1
            assert (timeout, ack_delay) == (10.0, _ACK_DELAY)
            continue
        seen["on"] = seen.get("on", 0) + 1
        (detail,) = switched
        if "delivery_timeout=" in detail:
            assert f"delivery_timeout={timeout:g}" in detail
            seen["timeout"] = 1
        else:
            assert timeout == 10.0
        if "ack_delay=" in detail:
            assert f"ack_delay={ack_delay:g}" in detail
        # The same seed makes the same choices, and the configuration is restored after.
        assert simulate(program, seed=seed, hosts=2, buggify=None).events == result.events
        assert current_config().delivery_timeout == 10.0
    assert seen.get("on") and seen.get("off") and seen.get("timeout"), seen


PLANTED = textwrap.dedent(
    """
    from regency.core import _runtime
    original = _runtime._InboundSink.frame_received
    def forgetful(self, conn, frame):
        if self._receiver.state is not None:
            self._receiver.state.handled = 0  # the bug: forget which frames were handled
        original(self, conn, frame)
    _runtime._InboundSink.frame_received = forgetful

    from regency.actor import this_host
    from regency.sim import current
    from tests.sim.actors import Recorder
    r = this_host().spawn_procs().spawn("r", Recorder)
    r.log.call_one().get()
    for i in range(10):
        r.record.broadcast(i)
    host = next(iter(current().procs)).split("/")[2]
    current().disconnect("controller", host)
    print(r.log.call_one().get())
    """
)


@pytest.mark.slow
def test_an_unchanged_program_under_sim_reports_violations_at_exit() -> None:
    env = {**os.environ, "REGENCY_RUNTIME": "sim", "REGENCY_SEED": "3"}
    out = subprocess.run(
        [sys.executable, "-c", PLANTED], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=60,
    )
    assert out.returncode == 70, (out.stdout, out.stderr)
    assert "invariant violation(s)" in out.stderr and "was handled twice" in out.stderr
    assert "replay this simulation: REGENCY_RUNTIME=sim REGENCY_SEED=3" in out.stderr


def test_bad_process_faults_and_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"CrashProcFault.proc must be a position >= 0 among "
                       r"the running procs \(got -1\)"):
        CrashProcFault(0.0, -1)
    with pytest.raises(ValueError, match=r"PauseProcFault.duration must be a duration >= 0"):
        PauseProcFault(0.0, 0, -1.0)
    with pytest.raises(ValueError, match=r"Faults.pause must be a finite rate per simulated "
                       r"second >= 0 \(got -0.5\)"):
        Faults(pause=-0.5)
    with pytest.raises(TypeError, match=r"buggify must be True, False or None .* got 'yes'"):
        simulate(workload, seed=1, buggify="yes")  # type: ignore[arg-type]

    def program(hosts: Any) -> str:
        try:
            current().pause_proc("sim://host0/nobody", 1.0)
        except LookupError as exc:
            return str(exc)
        return "paused nobody"

    assert simulate(program, seed=1, hosts=1).value == (
        "pause_proc(proc): no running simulated proc at 'sim://host0/nobody'"
    )
