"""``SimResult.replay()`` reruns a run exactly, and the replay line carries every argument that
shaped it: hosts, faults (a schedule by its repr, which reads back), buggify, timeout,
skip_idle."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import regency.sim
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
    ReplayDiverged,
    SimResult,
    fault_schedules,
    simulate,
)

from ..conftest import RootFailures
from .actors import Counter

#: Every kind of scheduled fault, a partition that lasts until healed among them.
SCHEDULE = FaultSchedule(
    Faults(disconnect=0.1, pause=0.05, max_delay=0.25, mean_duration=0.5),
    (
        ClogFault(0.2, "host1", 0.3),
        DelayFault(0.3, "controller", "host0", 0.5, 2.0),
        PartitionFault(0.5, math.inf, ("host1",), ("host0",), one_way=True),
        DisconnectFault(1.0, "controller", "host1"),
        PauseProcFault(1.2, 1, 0.5),
        CrashProcFault(1.5, 3),
        CrashHostFault(2.0, "host1"),
    ),
)


def program(hosts: Any) -> list[object]:
    counters = hosts.spawn_procs(per_host={"gpus": 2}).spawn("replayed", Counter)
    seen: list[object] = []
    for _ in range(4):
        try:
            seen.append(sorted(counters.incr.call().get().values()))
            counters.slice(hosts=0, gpus=0).nap.call_one(0.7).get()
        except Exception as exc:
            seen.append(type(exc).__name__)
    return seen


def _arguments_of(line: str) -> tuple[object, dict[str, Any]]:
    """Evaluate a replay line with ``simulate`` swapped for a recorder of its arguments,
    with the names ``from regency.sim import *`` gives."""
    seen: list[tuple[object, dict[str, Any]]] = []

    def record(program: object, **kwargs: Any) -> None:
        seen.append((program, kwargs))

    class Sim:
        simulate = staticmethod(record)

    class Regency:
        sim = Sim

    names = {name: getattr(regency.sim, name) for name in regency.sim.__all__}
    code = line.split("  # ")[0]  # the buggify comment
    eval(code, {**names, "regency": Regency, "program": program})
    assert len(seen) == 1
    return seen[0]


def test_the_replay_line_carries_every_argument_and_reads_back(roots: RootFailures) -> None:
    result = simulate(
        program, seed=7, hosts=2, faults=SCHEDULE, buggify=None, timeout=900.0, skip_idle=False
    )
    line = result.replay_line
    assert line.startswith("regency.sim.simulate(program, seed=7, hosts=2, faults=FaultSchedule(")
    assert "float('inf')" in line
    prog, kwargs = _arguments_of(line)
    assert prog is program
    assert kwargs == {
        "seed": 7, "hosts": 2, "faults": SCHEDULE, "buggify": None, "timeout": 900.0,
        "skip_idle": False,
    }


def test_defaults_stay_out_of_the_replay_line() -> None:
    result = simulate(lambda hosts: 3, seed=2)
    assert result.replay_line == "regency.sim.simulate(program, seed=2, hosts=4)"
    assert _arguments_of(result.replay_line)[1] == {"seed": 2, "hosts": 4}


def test_replay_reruns_the_same_run(roots: RootFailures) -> None:
    first = simulate(program, seed=5, hosts=2, faults=SCHEDULE, buggify=None)
    again = first.replay()
    assert isinstance(again, SimResult)
    assert again.trace_hash == first.trace_hash
    assert again.events == first.events
    assert again.value == first.value
    assert again.log == first.log
    assert again.replay_line == first.replay_line


def test_replay_of_random_faults_and_buggify(roots: RootFailures) -> None:
    faults = Faults(crash=0.2, pause=0.3, disconnect=0.3, partition=0.2, clog=0.2, delay=0.2)
    first = simulate(program, seed=11, hosts=2, faults=faults, buggify=True)
    assert first.replay().trace_hash == first.trace_hash
    assert _arguments_of(first.replay_line)[1]["faults"] == faults


def test_a_run_that_does_not_replay_says_where_it_parted() -> None:
    naps = iter([0.5, 0.25])

    def fickle(hosts: Any) -> None:  # depends on state kept between runs
        counter = hosts.spawn_procs().spawn("fickle", Counter)
        counter.nap.call_one(next(naps)).get()

    first = simulate(fickle, seed=1, hosts=1)
    with pytest.raises(ReplayDiverged) as info:
        first.replay()
    message = str(info.value)
    assert isinstance(info.value, AssertionError)
    assert "regency.sim.simulate(program, seed=1, hosts=1) is not the same run" in message
    assert first.trace_hash in message
    assert "they part at event" in message and "the global random module" in message


def test_a_failing_run_names_every_argument_in_its_replay_note() -> None:
    schedule = FaultSchedule(faults=(ClogFault(0.1, "host0", 0.2),))

    def failing(hosts: Any) -> None:
        raise ValueError("the program's own check failed")

    with pytest.raises(ValueError, match="the program's own check failed") as info:
        simulate(failing, seed=4, hosts=1, faults=schedule, buggify=True, skip_idle=False)
    notes = info.value.__notes__
    replay = [n for n in notes if n.startswith("replay: ")]
    assert replay == [
        f"replay: regency.sim.simulate(program, seed=4, hosts=1, faults={schedule!r}, "
        "buggify=True, skip_idle=False)"
    ]
    assert _arguments_of(replay[0][len("replay: "):])[1]["faults"] == schedule


def test_a_result_made_by_hand_cannot_replay() -> None:
    with pytest.raises(ValueError, match="does not know its program"):
        SimResult(None, 0.0, "", [], 0).replay()


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(schedule=fault_schedules(3, crashes=True, procs=True))
def test_every_schedule_reads_back_from_its_repr(schedule: FaultSchedule) -> None:
    names = {name: getattr(regency.sim, name) for name in regency.sim.__all__}
    assert eval(repr(schedule), names) == schedule
    assert _arguments_of(
        regency.sim._cluster.replay_line(3, 3, {"faults": schedule})
    )[1]["faults"] == schedule
