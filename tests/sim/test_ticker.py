"""Idle virtual time is skipped, and nothing that matters changes when it is.

The cluster's ticker (``regency/sim/_ticker.py``) applies idle heartbeat rounds analytically.
These tests compare runs with skipping on and off: a proc that stops answering after hours of
idleness is found at the same virtual time, calls fail the same way, and the idle hours cost
a handful of events instead of one per proc per second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from regency.actor import SupervisionError
from regency.sim import current, simulate

from ..conftest import RootFailures
from .actors import Counter


def idle_hours(hosts: Any) -> int:
    """Six procs whose endpoints sleep an hour, five times."""
    naps = hosts.spawn_procs(per_host={"gpus": 2}).spawn("naps", Counter)
    for _ in range(5):
        naps.nap.call(3600.0).get()
    return len(naps)


def test_idle_hours_cost_a_few_events_not_one_per_proc_per_second(
    configured: Callable[..., None],
) -> None:
    # (An hour-long endpoint is a stall: each warning's tick runs for real. Off here: this
    # test counts what idle time costs.)
    configured(stall_warning_s=0)
    result = simulate(idle_hours, seed=1, hosts=3)
    assert result.value == 6
    assert result.virtual_time > 5 * 3600
    # Without skipping: about 432,000 events (heartbeats and their acknowledgements).
    assert len(result.events) < 2_000, len(result.events)
    assert any(e.kind == "skip" for e in result.events)


def stops_answering(fault: str) -> Any:
    """After idle minutes, one proc stops answering (paused, crashed or cut off); a call to
    it fails. Returns when and how, and when the proc's failure reached the root."""

    def program(hosts: Any) -> tuple[str, float]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        counters = procs.spawn("quiet", Counter)
        counters.nap.call(600.0).get()
        victim = counters.slice(hosts=1)
        sim = current()
        if fault == "pause":
            sim.pause_proc(victim, 120.0)  # longer than heartbeat_timeout: the parent kills it
        elif fault == "crash":
            sim.crash_proc(victim)
        else:
            sim.partition(["controller", "host0"], ["host1"])
        try:
            victim.value.call_one().get()
            return "answered", sim.now()
        except SupervisionError as exc:
            return str(exc).split(":")[0], round(sim.now(), 9)

    return program


def failure_delays(events: list[Any]) -> list[tuple[str, float]]:
    """Each event from the fault on, with its delay after the fault (to the microsecond)."""
    kinds = ("crash_proc", "pause", "partition")
    start = next(e.time for e in events if e.kind in kinds)
    shown = {"pause", "crash_proc", "partition", "transport_gone", "unlisten", "heal"}
    return [(e.kind, round(e.time - start, 6)) for e in events if e.time >= start and e.kind in shown]


@pytest.mark.parametrize("fault", ["pause", "crash", "partition"])
def test_a_proc_that_stops_answering_is_found_at_the_same_virtual_time(
    fault: str, roots: RootFailures
) -> None:
    skipped = simulate(stops_answering(fault), seed=7, hosts=2)
    stepped = simulate(stops_answering(fault), seed=7, hosts=2, skip_idle=False)
    assert any(e.kind == "skip" for e in skipped.events)
    assert not any(e.kind == "skip" for e in stepped.events)
    (outcome, found), (stepped_outcome, stepped_found) = skipped.value, stepped.value
    assert outcome == stepped_outcome and outcome != "answered"
    # The skipped heartbeats drew no latency jitter, so the runs' random streams differ
    # from there on and times can differ by link jitter (1 ms): the fault struck within a
    # jitter of the same time, and was found the same delay after it.
    fault_at = next(e.time for e in skipped.events if e.kind in ("crash_proc", "pause", "partition"))
    stepped_fault_at = next(
        e.time for e in stepped.events if e.kind in ("crash_proc", "pause", "partition")
    )
    assert abs(fault_at - stepped_fault_at) < 0.002
    assert abs((found - fault_at) - (stepped_found - stepped_fault_at)) < 0.002
    assert [k for k, _ in failure_delays(skipped.events)] == [
        k for k, _ in failure_delays(stepped.events)
    ]


def test_skipping_is_deterministic() -> None:
    first = simulate(idle_hours, seed=3, hosts=3)
    again = simulate(idle_hours, seed=3, hosts=3)
    assert first.trace_hash == again.trace_hash and first.events == again.events
