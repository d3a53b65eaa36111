"""Simulator scale (issue #4): N hosts x 8 simulated procs spawn an actor mesh, answer a
``call()``, and survive a host crash. ``python -m benchmarks.bench_sim [HOSTS]``."""

from __future__ import annotations

import sys
import time
from typing import Any

import regency.actor
from regency.actor import Actor, endpoint
from regency.sim._cluster import current, simulate


class Node(Actor):
    @endpoint
    async def rank(self) -> int:
        return 1


def program(hosts: Any) -> tuple[int, int]:
    procs = hosts.spawn_procs(per_host={"gpus": 8})
    nodes = procs.spawn("nodes", Node)
    total = sum(nodes.rank.call().get().values())
    current().crash_host("host1")
    survivors = nodes.slice(hosts=slice(2, None))
    after = sum(survivors.rank.call().get().values())
    return total, after


def chatty(hosts: Any) -> int:
    nodes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("chatty", Node)
    for _ in range(200):
        nodes.rank.call().get()
    return len(nodes)


def run(hosts: int = 512) -> list[tuple[str, str, float, str]]:
    regency.actor.unhandled_fault_hook = lambda failure: None
    start = time.perf_counter()
    result = simulate(program, seed=1, hosts=hosts)
    real = time.perf_counter() - start
    procs = hosts * 8
    assert result.value == (procs, procs - 16), result.value
    start = time.perf_counter()
    busy = simulate(chatty, seed=2, hosts=4)
    busy_real = time.perf_counter() - start
    frames = sum(1 for e in busy.events if e.kind == "deliver")
    return [
        (f"{procs} simulated procs: spawn, call(), host crash, call()", "<= 30", real, "s real"),
        ("simulated messages delivered per real second (200 calls to 8 procs)", "", frames / busy_real, "msg/s"),
    ]


if __name__ == "__main__":
    for figure, target, value, unit in run(int(sys.argv[1]) if len(sys.argv) > 1 else 512):
        print(f"{figure:60s} {value:12,.2f} {unit} {target}")
