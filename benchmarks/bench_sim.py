"""Simulator figures. ``python -m benchmarks.bench_sim [HOSTS]``.

* scale: N hosts x 8 simulated procs spawn an actor mesh, answer a ``call()``, survive a host
  crash and answer again;
* idle time: six procs whose endpoints sleep an hour, five times (18,000 virtual seconds);
* throughput: simulated events (network events, the trace's log) per real second on a
  call-heavy workload, and messages delivered per real second.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import trio

import regency.actor
from regency.actor import Actor, endpoint
from regency.sim._cluster import current, simulate


class Node(Actor):
    @endpoint
    async def rank(self) -> int:
        return 1

    @endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds


def program(hosts: Any) -> tuple[int, int]:
    procs = hosts.spawn_procs(per_host={"gpus": 8})
    nodes = procs.spawn("nodes", Node)
    total = sum(nodes.rank.call().get().values())
    current().crash_host("host1")
    survivors = nodes.slice(hosts=slice(2, None))
    after = sum(survivors.rank.call().get().values())
    return total, after


def idle(hosts: Any) -> int:
    naps = hosts.spawn_procs(per_host={"gpus": 2}).spawn("naps", Node)
    for _ in range(5):
        naps.nap.call(3600.0).get()
    return len(naps)


def chatty(hosts: Any) -> int:
    nodes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("chatty", Node)
    for _ in range(200):
        nodes.rank.call().get()
    return len(nodes)


def _best(fn: Any, repeats: int = 3) -> tuple[float, Any]:
    """Best real time of ``repeats`` runs (and the last result)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def _cpu(fn: Any) -> float:
    """CPU seconds of one run (less sensitive than real time to a loaded machine)."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def run(hosts: int = 512) -> list[tuple[str, str, float, str]]:
    regency.actor.unhandled_fault_hook = lambda failure: None
    start_cpu = time.process_time()
    real, result = _best(lambda: simulate(program, seed=1, hosts=hosts), repeats=1)
    scale_cpu = time.process_time() - start_cpu
    procs = hosts * 8
    assert result.value == (procs, procs - 16), result.value
    idle_real, quiet = _best(lambda: simulate(idle, seed=1, hosts=3))
    assert quiet.value == 6 and quiet.virtual_time > 18_000
    busy_real, busy = _best(lambda: simulate(chatty, seed=2, hosts=4))
    busy_cpu = _cpu(lambda: simulate(chatty, seed=2, hosts=4))
    frames = sum(1 for e in busy.events if e.kind == "deliver")
    return [
        (f"{procs} simulated procs: spawn, call(), host crash, call()", "<= 10", real, "s real"),
        ("  the same, CPU time of the process", "", scale_cpu, "s CPU"),
        ("6 procs, endpoints sleep 3600 s five times (18,000 virtual s)", "<= 2", idle_real,
         "s real"),
        ("  its simulated events (without skipping idle time: ~432,000)", "", len(quiet.events),
         "events"),
        ("simulated events per real second (200 calls to 8 procs)", ">= 100,000",
         len(busy.events) / busy_real, "events/s"),
        ("  the same per CPU second", "", len(busy.events) / busy_cpu, "events/s"),
        ("simulated messages delivered per real second (same workload)", "", frames / busy_real,
         "msg/s"),
    ]


if __name__ == "__main__":
    for figure, target, value, unit in run(int(sys.argv[1]) if len(sys.argv) > 1 else 512):
        print(f"{figure:66s} {value:14,.2f} {unit} {target}")
