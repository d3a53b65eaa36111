"""A scheduled or random fault does exactly what its direct call does: one code path.

Each kind of fault runs twice on one seed: once scheduled (``faults=FaultSchedule(...)``) and
once as the direct call (``regency.sim.current().crash_host(...)`` and so on) made by the
program at the same virtual time. The runs must be the same run: the same value and the same
event log, line for line. (The trace hashes differ by design: they hash which task ran, and
the fault comes from another task.) Random faults are held to the same calls by watching
which code applies them. A schedule the run cannot apply is refused before it starts, with
the direct call's error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings

from regency.actor import Actor, current_rank, endpoint
from regency.sim import (
    ClogFault,
    CrashHostFault,
    CrashProcFault,
    DelayFault,
    DisconnectFault,
    Faults,
    FaultSchedule,
    PartitionFault,
    PauseProcFault,
    ScheduledFault,
    SimCluster,
    SimNetwork,
    SimResult,
    current,
    fault_schedules,
    simulate,
)
from regency.sim._cluster import check_schedule

from ..conftest import RootFailures
from .actors import Counter

AT = 0.5
#: A fault of the schedule's zero value at ``AT``: the direct run gets the same fault task
#: (sleeping until ``AT``) as the scheduled one, so both runs schedule their tasks alike.
NOTHING = PartitionFault(AT, 0.0, (), ())


def _program(direct: Callable[[Any], None] | None) -> Callable[[Any], Any]:
    """Counters on three hosts; at ``AT`` the fault (made here if ``direct``), then calls to
    every rank at three later times: which answer, which fail, with what."""

    async def program(hosts: Any) -> list[object]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        counters = procs.spawn("paths", Counter)
        await counters.value.call()
        await trio.sleep_until(AT)
        if direct is not None:
            direct(current())
        seen: list[object] = []
        for when in (0.7, 3.0, 12.0):
            await trio.sleep_until(when)
            for rank in range(3):
                try:
                    seen.append(await counters.slice(hosts=rank).incr.call_one())
                except Exception as exc:
                    seen.append(type(exc).__name__)
        return seen

    return program


def _proc(sim: Any, position: int) -> str:
    """The proc a scheduled proc fault names by ``position`` (modulo how many run)."""
    running = list(sim.procs)
    return running[position % len(running)]


PAIRS: dict[str, tuple[Callable[[Any], None], ScheduledFault]] = {
    "crash_host": (lambda sim: sim.crash_host("host1"), CrashHostFault(AT, "host1")),
    "partition": (
        lambda sim: sim.partition(["host0"], ["controller", "host2"], duration=2.0, one_way=True),
        PartitionFault(AT, 2.0, ("host0",), ("controller", "host2"), one_way=True),
    ),
    "partition forever": (
        lambda sim: sim.partition("host2", "controller"),
        PartitionFault(AT, float("inf"), ("host2",), ("controller",)),
    ),
    "disconnect": (
        lambda sim: sim.disconnect("controller", "host2"),
        DisconnectFault(AT, "controller", "host2"),
    ),
    "disconnect with a relay restarting": (
        lambda sim: sim.disconnect("controller", "host2", refuse_for=1.0),
        DisconnectFault(AT, "controller", "host2", 1.0),
    ),
    "clog": (lambda sim: sim.clog("host1", 1.5), ClogFault(AT, "host1", 1.5)),
    "delay": (
        lambda sim: sim.delay("controller", "host0", 0.3, 4.0),
        DelayFault(AT, "controller", "host0", 0.3, 4.0),
    ),
    "crash_proc": (lambda sim: sim.crash_proc(_proc(sim, 4)), CrashProcFault(AT, 4)),
    "pause_proc": (lambda sim: sim.pause_proc(_proc(sim, 2), 2.0), PauseProcFault(AT, 2, 2.0)),
    "pause_proc past the heartbeat timeout": (
        lambda sim: sim.pause_proc(_proc(sim, 0), 30.0),
        PauseProcFault(AT, 0, 30.0),
    ),
}


@pytest.mark.parametrize("kind", list(PAIRS))
def test_a_scheduled_fault_is_its_direct_call(kind: str, roots: RootFailures) -> None:
    call, fault = PAIRS[kind]
    direct = simulate(_program(call), seed=3, hosts=3, faults=FaultSchedule(faults=(NOTHING,)))
    scheduled = simulate(_program(None), seed=3, hosts=3, faults=FaultSchedule(faults=(fault,)))
    assert scheduled.value == direct.value
    lines = [str(e) for e in direct.events]
    assert [str(e) for e in scheduled.events] == lines
    assert scheduled.log == direct.log
    assert any(e.time == AT and e.kind != "deliver" for e in direct.events), lines


def test_a_scheduled_host_crash_kills_the_procs_on_it_at_once(roots: RootFailures) -> None:
    # The bug this file was written for: a scheduled crash only cut the network, and an
    # async loop on the crashed host went on running until its proc was killed as stuck.
    result = simulate(
        _program(None), seed=3, hosts=3, faults=FaultSchedule(faults=(CrashHostFault(AT, "host1"),))
    )
    at_crash = [str(e) for e in result.events if e.time == AT]
    assert "crash_proc" not in " ".join(at_crash)  # a host crash is not a proc fault...
    gone = [e for e in result.events if e.kind == "transport_gone" and "host1" in e.detail]
    assert gone and gone[0].time == AT, at_crash  # ...but its procs are gone at that instant
    assert result.value == [
        1, "SupervisionError", 1, 2, "SupervisionError", 2, 3, "SupervisionError", 3
    ]


#: (host, virtual time) of every turn of the Looper actors' loops: an effect outside the
#: network, which a crash must stop at once.
TURNS: list[tuple[str, float]] = []


class Looper(Actor):
    @endpoint
    async def loop(self) -> None:
        host = current_rank()["hosts"]
        while True:
            TURNS.append((f"host{host}", trio.current_time()))
            await trio.sleep(0.1)


@pytest.mark.parametrize("how", ["scheduled", "direct"])
def test_a_crashed_host_runs_no_more_code(how: str, roots: RootFailures) -> None:
    async def program(hosts: Any) -> None:
        loopers = hosts.spawn_procs().spawn("loopers", Looper)
        loopers.loop.broadcast()
        await trio.sleep_until(AT)
        if how == "direct":
            current().crash_host("host1")
        await trio.sleep(20.0)

    TURNS.clear()
    schedule = (CrashHostFault(AT, "host1"),) if how == "scheduled" else (NOTHING,)
    simulate(program, seed=2, hosts=2, faults=FaultSchedule(faults=schedule))
    crashed = [t for host, t in TURNS if host == "host1"]
    alive = [t for host, t in TURNS if host == "host0"]
    assert crashed and max(crashed) <= AT, crashed[-5:]
    assert max(alive) > AT + 19.0  # the other host's loop went on


def _kinds(result: SimResult) -> set[str]:
    return {e.kind for e in result.events}


def test_random_faults_go_through_the_direct_calls(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    """Every random fault is applied inside one of the calls a program makes: the network's
    and the procs' primitives are never reached another way."""
    inside: list[str] = []
    applied: list[str] = []

    def public(name: str) -> None:
        original = getattr(SimCluster, name)

        def wrapper(self: SimCluster, *args: Any, **kwargs: Any) -> Any:
            inside.append(name)
            try:
                return original(self, *args, **kwargs)
            finally:
                inside.pop()

        monkeypatch.setattr(SimCluster, name, wrapper)

    def primitive(owner: type, name: str) -> None:
        original = getattr(owner, name)

        def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
            assert inside, f"{owner.__name__}.{name} was applied outside a direct fault call"
            applied.append(f"{inside[-1]}->{name}")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for name in ("partition", "disconnect", "clog", "delay", "crash_proc", "pause_proc"):
        public(name)
    for name in ("partition", "disconnect", "clog", "delay", "crash_host"):
        primitive(SimNetwork, name)
    for name in ("_crash", "_pause"):
        primitive(SimCluster, name)

    async def program(hosts: Any) -> None:
        counters = hosts.spawn_procs(per_host={"gpus": 2}).spawn("randomly", Counter)
        for _ in range(20):
            try:
                await counters.incr.call()
            except Exception:
                pass
            await trio.sleep(1.0)

    every = Faults(
        delay=0.3, disconnect=0.3, partition=0.3, clog=0.3, crash=0.1, pause=0.2,
        mean_duration=1.0,
    )
    kinds: set[str] = set()
    for seed in range(3):
        kinds |= _kinds(simulate(program, seed=seed, hosts=3, faults=every, timeout=3600))
    assert {"delay", "partition", "clog", "crash_proc", "pause"} <= kinds
    assert {a.split("->")[0] for a in applied} == {
        "partition", "disconnect", "clog", "delay", "crash_proc", "pause_proc"
    }


# -- a schedule the run cannot apply is refused before it starts ---------------------------


def _direct_error(call: Callable[[Any], None]) -> BaseException:
    """The error of ``call(current())`` made by a program of a 4-host simulation."""

    def program(hosts: Any) -> BaseException:
        try:
            call(current())
        except Exception as exc:
            return exc
        raise AssertionError("the direct call was accepted")

    error: BaseException = simulate(program, seed=1, hosts=4).value
    return error


def _refused(fault: ScheduledFault) -> BaseException:
    ran = []

    def program(hosts: Any) -> None:
        ran.append(True)

    with pytest.raises((LookupError, ValueError, TypeError)) as info:
        simulate(program, seed=1, hosts=4, faults=FaultSchedule(faults=(fault,)))
    assert ran == [], "the program ran although its schedule was refused"
    assert not getattr(info.value, "__notes__", None)  # refused up front, not by a run
    return info.value


HOSTS = "(hosts: 'controller', 'host0', 'host1', 'host2', 'host3')"


@pytest.mark.parametrize(
    ("fault", "call", "kind", "text"),
    [
        pytest.param(
            CrashHostFault(AT, "host9"), lambda sim: sim.crash_host("host9"), LookupError,
            f"no simulated host 'host9' {HOSTS}", id="crash of an unknown host",
        ),
        pytest.param(
            CrashHostFault(AT, "controller"), lambda sim: sim.crash_host("controller"), ValueError,
            "the controller's host 'controller' cannot crash", id="crash of the controller",
        ),
        pytest.param(
            DelayFault(AT, "hostA", "host1", 0.1, 1.0),
            lambda sim: sim.delay("hostA", "host1", 0.1, 1.0), LookupError,
            f"no simulated host 'hostA' {HOSTS}", id="delay from an unknown host",
        ),
        pytest.param(
            DisconnectFault(AT, "host0", "h1"), lambda sim: sim.disconnect("host0", "h1"),
            LookupError, f"no simulated host 'h1' {HOSTS}", id="disconnect of an unknown host",
        ),
        pytest.param(
            ClogFault(AT, "host4", 1.0), lambda sim: sim.clog("host4", 1.0), LookupError,
            f"no simulated host 'host4' {HOSTS}", id="clog of an unknown host",
        ),
        pytest.param(
            PartitionFault(AT, 1.0, ("host0",), ("host1", "nowhere")),
            lambda sim: sim.partition(["host0"], ["host1", "nowhere"], 1.0), LookupError,
            f"no simulated host 'nowhere' {HOSTS}", id="partition with an unknown host",
        ),
        pytest.param(
            PartitionFault(AT, 1.0, ("host0", "host1"), ("host1",)),
            lambda sim: sim.partition(["host0", "host1"], ["host1"], 1.0), ValueError,
            "partition sides must not share hosts (both have ['host1'])", id="overlapping sides",
        ),
    ],
)
def test_a_bad_schedule_is_refused_at_the_start_as_its_direct_call_is(
    fault: ScheduledFault, call: Callable[[Any], None], kind: type, text: str
) -> None:
    refused = _refused(fault)
    direct = _direct_error(call)
    assert type(refused) is type(direct) is kind
    assert text in str(refused) and text in str(direct), (refused, direct)
    assert str(refused).startswith(repr(fault)), refused  # says which fault of the schedule
    # The same error after the name of the call: the schedule's names its fault as well.
    assert str(refused).endswith(str(direct).split(": ", 1)[-1])


def test_something_that_is_no_fault_is_refused() -> None:
    with pytest.raises(TypeError, match=r"which is no fault"):
        simulate(lambda hosts: None, faults=FaultSchedule(faults=("host1 down",)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"faults must be a regency.sim.Faults"):
        simulate(lambda hosts: None, faults=[CrashHostFault(AT, "host1")])  # type: ignore[arg-type]


def test_the_zero_value_of_a_partition_is_accepted_and_does_nothing() -> None:
    result = simulate(
        lambda hosts: None, seed=1, hosts=2,
        faults=FaultSchedule(faults=(PartitionFault(0.0, 0.0, (), ()), NOTHING)),
    )
    assert "partition" not in _kinds(result)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(schedule=fault_schedules(3, crashes=True, procs=True))
def test_every_schedule_fault_schedules_draws_for_a_run_is_accepted(
    schedule: FaultSchedule,
) -> None:
    check_schedule(schedule, 3)
    names = {"controller", "host0", "host1", "host2"}
    for fault in schedule.faults:
        hosts = {
            getattr(fault, field) for field in ("host", "host_a", "host_b") if hasattr(fault, field)
        } | set(getattr(fault, "a_hosts", ())) | set(getattr(fault, "b_hosts", ()))
        assert hosts <= names
        if isinstance(fault, CrashHostFault):
            assert fault.host != "controller"


def test_fault_schedules_of_names_that_include_the_controller_never_crash_it() -> None:
    from hypothesis import find

    crash = find(
        fault_schedules(["controller", "host0"], crashes=True),
        lambda s: any(isinstance(f, CrashHostFault) for f in s.faults),
    )
    assert {f.host for f in crash.faults if isinstance(f, CrashHostFault)} == {"host0"}
    with pytest.raises(TypeError, match=r"host names"):
        fault_schedules(True)
    with pytest.raises(TypeError, match=r"a list of host names"):
        fault_schedules("host0")
    with pytest.raises(ValueError, match=r"at least one host"):
        fault_schedules(0)


def test_the_direct_error_names_every_host() -> None:
    # What the refusal above is compared with, pinned: the hosts listed in the mesh's order.
    error = _direct_error(lambda sim: sim.crash_host("host9"))
    assert re.fullmatch(rf"crash_host\(host\): no simulated host 'host9' {re.escape(HOSTS)}",
                        str(error)), error
