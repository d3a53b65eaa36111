"""Actor figures of issues #2 and #13, measured end to end with real processes.

Run through ``make bench`` (``benchmarks/run.py``), or directly:
``python -m benchmarks.bench_actors``. ``python -m benchmarks.bench_actors --compare [ROUNDS]``
runs the figures in fresh interpreters with ``thread_reads`` on and off, alternately (same
run, same load): the effect of threads reading their own messages (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
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


class AsyncEcho(Actor):
    """Only async endpoints: driven by a trio task in the proc, no actor thread."""

    @endpoint
    async def ping(self, x: object = None) -> object:
        return x


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
    rows.append(("call_one round trip, sync endpoint", "<= 110", _median_us(lambda: one.ping.call_one().get(), 2000), "us"))
    rows.append(("call_one round trip, async endpoint", "<= 100", _median_us(lambda: one.aping.call_one().get(), 2000), "us"))
    only_async = procs.slice(gpus=1).spawn("aecho", AsyncEcho)
    only_async.ping.call_one().get(30)
    rows.append(("call_one round trip, all-async actor", "", _median_us(lambda: only_async.ping.call_one().get(), 2000), "us"))
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
    rows.append(("pipelined call_one, 20,000 calls", ">= 77,000", statistics.median(pipelined() for _ in range(5)), "calls/s"))
    rows.append(("call over a 4-process mesh", "<= 200", _median_us(lambda: echo.ping.call().get(), 1000), "us"))
    mib = b"x" * (1 << 20)
    rows.append(("call_one with a 1 MiB bytes argument", "<= 600", _median_us(lambda: one.nbytes.call_one(mib).get(), 200), "us"))
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
    return rows


def compare(rounds: int) -> None:
    """``run()`` in fresh interpreters, ``thread_reads`` on and off alternately; prints the
    range of each figure per setting."""
    seen: dict[tuple[str, str], list[float]] = {}
    units: dict[str, str] = {}
    for _ in range(rounds):
        for setting in ("0", "1"):
            env = {**os.environ, "REGENCY_THREAD_READS": setting}
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_actors", "--json"],
                env=env, capture_output=True, text=True, check=True, timeout=600,
            ).stdout
            for figure, _target, value, unit in json.loads(out.splitlines()[-1]):
                seen.setdefault((figure, setting), []).append(value)
                units[figure] = unit
    print(f"{'figure':62s} {'thread_reads=False':>22s} {'thread_reads=True':>22s}")
    for figure, unit in units.items():
        cells = []
        for setting in ("0", "1"):
            values = seen[(figure, setting)]
            fmt = "{:,.3f}" if unit == "s" else "{:,.0f}"
            cells.append(f"{fmt.format(min(values))}-{fmt.format(max(values))} {unit}")
        print(f"{figure:62s} {cells[0]:>22s} {cells[1]:>22s}")


if __name__ == "__main__":
    if "--compare" in sys.argv:
        tail = sys.argv[sys.argv.index("--compare") + 1 :]
        compare(int(tail[0]) if tail else 3)
    elif "--json" in sys.argv:
        print(json.dumps(run()))
    else:
        for figure, target, value, unit in run():
            print(f"{figure:45s} {value:12,.3f} {unit:8s} target {target}")
