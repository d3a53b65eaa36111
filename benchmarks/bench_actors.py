"""Actor figures of issue #2, measured end to end with real processes.

Run through ``make bench`` (``benchmarks/run.py``), or directly for one transport:
``python -m benchmarks.bench_actors``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from regency.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def ping(self, x: object = None) -> object:
        return x

    @endpoint
    async def aping(self, x: object = None) -> object:
        return x

    @endpoint
    async def asyncio_ping(self, x: object = None) -> object:
        await asyncio.sleep(0)  # asyncio code in the endpoint (Monarch style)
        return x

    @endpoint
    def nbytes(self, data: bytes) -> int:
        return len(data)


def _median_us(fn: Callable[[], object], n: int, repeats: int = 5) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def run() -> list[tuple[str, str, float, str]]:
    """Return rows of (figure, target, measured, unit)."""
    rows: list[tuple[str, str, float, str]] = []
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    echo = procs.spawn("echo", Echo)
    one = echo.slice(gpus=0)
    echo.ping.call().get(30)
    for _ in range(2000):
        one.ping.call_one().get()
    rows.append(("call_one round trip, sync endpoint", "<= 100", _median_us(lambda: one.ping.call_one().get(), 2000), "us"))
    rows.append(("call_one round trip, async endpoint", "<= 100", _median_us(lambda: one.aping.call_one().get(), 2000), "us"))
    one.asyncio_ping.call_one().get(30)  # opens the proc's asyncio loop
    rows.append(("call_one round trip, async endpoint awaiting asyncio.sleep(0)", "", _median_us(lambda: one.asyncio_ping.call_one().get(), 2000), "us"))

    def pipelined() -> float:
        n = 20_000
        t0 = time.perf_counter()
        futs = [one.ping.call_one() for _ in range(n)]
        for f in futs:
            f.get()
        return n / (time.perf_counter() - t0)

    pipelined()
    rows.append(("pipelined call_one, 20,000 calls", ">= 60,000", statistics.median(pipelined() for _ in range(5)), "calls/s"))
    rows.append(("call over a 4-process mesh", "<= 250", _median_us(lambda: echo.ping.call().get(), 1000), "us"))
    mib = b"x" * (1 << 20)
    rows.append(("call_one with a 1 MiB bytes argument", "<= 600", _median_us(lambda: one.nbytes.call_one(mib).get(), 200), "us"))
    rows.append(("call_one echoing a 1 MiB bytes argument (1 MiB each way)", "<= 600", _median_us(lambda: one.ping.call_one(mib).get(), 200), "us"))
    try:
        import torch
    except ImportError:
        pass
    else:
        tensor = torch.ones(1 << 20)  # 4 MiB of float32
        rows.append(("call_one echoing a 4 MiB CPU tensor", "", _median_us(lambda: one.ping.call_one(tensor).get(), 30) / 1000, "ms"))
    procs.stop().get(30)

    def spawn_until_first_reply() -> float:
        t0 = time.perf_counter()
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        pm.spawn("e", Echo).ping.call().get(30)
        elapsed = time.perf_counter() - t0
        pm.stop().get(30)
        return elapsed

    spawn_until_first_reply()
    rows.append(("spawn_procs of 2 procs until first reply", "<= 0.15", statistics.median(spawn_until_first_reply() for _ in range(5)), "s"))
    rows.append(("first spawn_procs of 2 procs in a fresh interpreter, until first reply", "<= 0.09", statistics.median(_cold_start() for _ in range(5)), "s"))
    return rows


_COLD = """
import os, sys, time
from regency.actor import Actor, endpoint, this_host
class Echo(Actor):
    @endpoint
    def ping(self) -> None:
        pass
t0 = time.perf_counter()
this_host().spawn_procs(per_host={"gpus": 2}).spawn("e", Echo).ping.call().get(60)
print(time.perf_counter() - t0, flush=True)
os._exit(0)
"""


def _cold_start() -> float:
    """A fresh ``python -c`` that imports regency.actor, then times its first spawn_procs
    until the first reply (each run its own interpreter: nothing warm but the OS caches)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.setdefault("REGENCY_SECRET", "regency-benchmark-job-secret")
    done = subprocess.run(
        [sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"cold-start run failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    for figure, target, value, unit in run():
        print(f"{figure:45s} {value:12,.3f} {unit:8s} target {target}")
