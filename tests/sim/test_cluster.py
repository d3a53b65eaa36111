"""The production runtime on a simulated cluster: determinism, virtual time, faults."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from regency.actor import SupervisionError
from regency.sim._cluster import current, simulate

from ..conftest import RootFailures
from .actors import Counter, Gossip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def gossip_program(hosts: Any) -> list[list[int]]:
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    counters = procs.spawn("counters", Counter)
    gossips = procs.spawn("gossips", Gossip, counters)
    result: list[list[int]] = gossips.poke_neighbours.call(3).get().values()
    return result


@pytest.mark.parametrize("seed", range(20))
def test_same_seed_same_run(seed: int) -> None:
    first = simulate(gossip_program, seed=seed, hosts=2)
    second = simulate(gossip_program, seed=seed, hosts=2)
    assert first.trace_hash == second.trace_hash
    assert first.events == second.events
    assert first.value == second.value
    assert sorted(v for vs in first.value for v in vs)[-1] <= 12


def test_different_seeds_schedule_differently() -> None:
    hashes = {simulate(gossip_program, seed=s, hosts=2).trace_hash for s in range(5)}
    assert len(hashes) > 1


def test_an_hour_of_virtual_time_takes_seconds() -> None:
    def program(hosts: Any) -> float:
        naps = hosts.spawn_procs(per_host={"gpus": 1}).spawn("naps", Counter)
        return float(naps.slice(hosts=0).nap.call_one(3600.0).get())

    start = time.monotonic()
    result = simulate(program, seed=1, hosts=1)
    assert result.value == 3600.0
    assert result.virtual_time >= 3600.0
    assert time.monotonic() - start < 20


def test_async_programs_run_too() -> None:
    async def program(hosts: Any) -> list[int]:
        counters = hosts.spawn_procs(per_host={"gpus": 2}).spawn("c", Counter, 5)
        await counters.incr.call(2)
        return list((await counters.value.call()).values())

    assert simulate(program, seed=2, hosts=2).value == [7, 7, 7, 7]


def test_a_crashed_proc_fails_calls_and_reaches_the_owner(roots: RootFailures) -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        counters = procs.spawn("simcrash", Counter)
        counters.value.call().get()
        napping = counters.slice(hosts=1).nap.call_one(60.0)
        current().crash_proc(procs._procs[1][1])
        try:
            napping.get()
        except SupervisionError as exc:
            return str(exc)
        return "no error"

    result = simulate(program, seed=3, hosts=2)
    assert "simcrash.nap() failed, The actor <" in result.value
    assert "> at rank 1 and all its descendants have failed" in result.value
    assert roots.wait_for("simcrash").ranks == (1,)


def test_a_crashed_host_is_detected_and_replays_identically(roots: RootFailures) -> None:
    def program(hosts: Any) -> tuple[list[int], str]:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        counters = procs.spawn("hostcrash", Counter)
        counters.value.call().get()
        current().crash_host("host1")
        alive = counters.slice(hosts=0).incr.call().get().values()
        try:
            counters.slice(hosts=1).value.call().get()
        except SupervisionError as exc:
            return alive, type(exc).__name__
        return alive, "no error"

    first = simulate(program, seed=4, hosts=2)
    assert first.value == ([1, 1], "SupervisionError")
    assert simulate(program, seed=4, hosts=2).trace_hash == first.trace_hash


def test_a_partition_fails_calls_across_it(roots: RootFailures) -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        cut_off = procs.slice(hosts=1).spawn("cutoff", Counter)
        cut_off.value.call_one().get()
        current().partition(["controller", "host0"], ["host1"])
        try:
            cut_off.nap.call_one(1.0).get()
        except SupervisionError as exc:
            return str(exc)
        return "answered across a partition"

    result = simulate(program, seed=5, hosts=2)
    assert "were partitioned from host1" in result.value
    assert roots.wait_for("cutoff").ranks == (0,)


UNCHANGED = textwrap.dedent(
    """
    from regency.actor import this_host
    from tests.sim.actors import Counter
    cs = this_host().spawn_procs(per_host={"gpus": 3}).spawn("cs", Counter, 1)
    cs.incr.broadcast(4)
    print(cs.value.call().get().values(), cs.slice(gpus=0).nap.call_one(7200.0).get())
    """
)


@pytest.mark.slow
def test_an_unchanged_program_runs_simulated_by_configuration() -> None:
    env = {**os.environ, "REGENCY_RUNTIME": "sim", "REGENCY_SEED": "9"}
    out = subprocess.run(
        [sys.executable, "-c", UNCHANGED],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[5, 5, 5] 7200.0"


FAILING = textwrap.dedent(
    """
    from regency.actor import Actor, endpoint, this_host
    class Bad(Actor):
        @endpoint
        def boom(self) -> None:
            raise RuntimeError("simulated failure")
    bad = this_host().spawn_procs(per_host={"gpus": 1}).spawn("bad", Bad)
    bad.boom.broadcast()
    bad.boom.call().get()
    """
)


@pytest.mark.slow
def test_a_failing_simulated_program_prints_how_to_replay_it() -> None:
    env = {**os.environ, "REGENCY_RUNTIME": "sim", "REGENCY_SEED": "11"}
    out = subprocess.run(
        [sys.executable, "-c", FAILING],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode != 0
    assert "actor mesh bad failed at rank(s) 0" in out.stderr
    assert "replay this simulation: REGENCY_RUNTIME=sim REGENCY_SEED=11" in out.stderr


def test_scale_in_small() -> None:
    """The 4,096-proc benchmark (benchmarks/bench_sim.py), at 128 procs."""
    from benchmarks.bench_sim import program

    result = simulate(program, seed=1, hosts=16)
    assert result.value == (128, 112)


def test_determinism_self_check_and_trace_export(tmp_path: Any) -> None:
    from regency.sim import check_simulation

    result = check_simulation(gossip_program, seed=12, hosts=2, runs=3)
    path = tmp_path / "trace.json"
    result.write_chrome_trace(str(path))
    import json

    trace = json.loads(path.read_text())["traceEvents"]
    assert {e["ph"] for e in trace} >= {"M", "s", "f", "i"}
    assert {e["args"]["name"] for e in trace if e["ph"] == "M"} >= {"controller", "host0", "host1"}


simulated = __import__("regency.testing", fromlist=["simulated_fixture"]).simulated_fixture()


def test_the_user_fixture(simulated: Any) -> None:
    assert simulated.run(gossip_program, hosts=2).value == simulated.run(gossip_program, hosts=2).value
    simulated.check_determinism(gossip_program, hosts=2)
