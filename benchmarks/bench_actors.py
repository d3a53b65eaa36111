"""Actor figures of issues #2 and #13, measured end to end with real processes.

Run through ``make bench`` (``benchmarks/run.py``), or directly:
``python -m benchmarks.bench_actors``. ``python -m benchmarks.bench_actors --compare [BLOCKS]``
measures threads reading their own messages against the loop reading everything, in one
process against the same procs, in alternating short blocks (docs/performance.md);
``--compare-spin`` and ``--compare-hold`` do the same for spinning before sleeping and for
holding connections between waits.
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

    @endpoint
    def switch(self, on: bool, switch: str = "thread_reads") -> None:
        _switch(on, switch)


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


def _switch(on: bool, switch: str = "thread_reads") -> None:
    """Turn ``switch`` on or off in this process's runtime (a proc's, through
    :meth:`Echo.switch`): ``"thread_reads"`` (``--compare``), threads reading their own
    messages; ``"spin"`` (``--compare-spin``), their spinning before they sleep, at the
    default ``spin_us``; ``"hold"`` (``--compare-hold``), their setting connections aside
    between waits (``Leader.holding``) instead of giving them back."""
    from regency.core._config import Config
    from regency.core._controller import current_runtime
    from regency.core._spin import spin_limit

    leader = current_runtime().leader
    if leader is None:
        raise RuntimeError("this runtime has no leader: thread_reads was off at its start")
    if switch == "spin":
        leader.spin = spin_limit(Config().spin_us) if on else 0.0
    elif switch == "hold":
        leader.holding = on
    else:
        leader.enabled = on


def compare(blocks: int, switch: str = "thread_reads") -> None:
    """Threads reading their own messages, on and off, in one process against the same procs:
    short blocks of each figure, alternating (the order flips every block), so that the
    machine's load drifts over both settings alike. Prints the median and the quartiles of
    the blocks, per figure and setting."""
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    echo = procs.spawn("echo", Echo)
    one = echo.slice(gpus=0)
    only_async = procs.slice(gpus=1).spawn("aecho", AsyncEcho)
    echo.ping.call().get(30)
    only_async.ping.call_one().get(30)

    def pipelined(n: int = 5000) -> float:
        t0 = time.perf_counter()
        futs = [one.ping.call_one() for _ in range(n)]
        for f in futs:
            f.get()
        return n / (time.perf_counter() - t0)

    def per_call_us(fn: Callable[[], object], n: int) -> Callable[[], float]:
        def block() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n * 1e6

        return block

    figures: list[tuple[str, str, Callable[[], float]]] = [
        ("call_one round trip, sync endpoint", "us", per_call_us(lambda: one.ping.call_one().get(), 300)),
        ("call_one round trip, all-async actor", "us", per_call_us(lambda: only_async.ping.call_one().get(), 300)),
        ("call_one round trip, async endpoint of a threaded actor", "us", per_call_us(lambda: one.aping.call_one().get(), 300)),
        ("call over a 4-process mesh", "us", per_call_us(lambda: echo.ping.call().get(), 150)),
        ("pipelined call_one, 5,000 calls", "calls/s", pipelined),
    ]
    seen: dict[tuple[str, bool], list[float]] = {}
    for b in range(blocks + 1):
        for on in (False, True) if b % 2 else (True, False):
            _switch(on, switch)
            echo.switch.call(on, switch).get(30)
            for name, _unit, block in figures:
                value = block()
                if b:  # the first round warms up
                    seen.setdefault((name, on), []).append(value)
    _switch(True, switch)
    procs.stop().get(30)
    print(f"{'figure (median, quartiles of ' + str(blocks) + ' blocks)':58s} {switch + ' off':>24s} {switch + ' on':>24s}")
    for name, unit, _ in figures:
        cells = []
        for on in (False, True):
            q = statistics.quantiles(seen[(name, on)], n=4)
            cells.append(f"{statistics.median(seen[(name, on)]):,.0f} ({q[0]:,.0f}-{q[2]:,.0f})")
        print(f"{name:58s} {cells[0]:>24s} {cells[1]:>24s} {unit}")


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
    if root not in sys.path:  # (run as a script: benchmarks/ is not a package on the path)
        sys.path.insert(0, root)
    from benchmarks._bytecode import compile_regency

    compile_regency()  # as an installed package has it (benchmarks/_bytecode.py)
    done = subprocess.run(
        [sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"cold-start run failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if "--compare-hold" in sys.argv:
        tail = sys.argv[sys.argv.index("--compare-hold") + 1 :]
        compare(int(tail[0]) if tail else 20, "hold")
    elif "--compare-spin" in sys.argv:
        tail = sys.argv[sys.argv.index("--compare-spin") + 1 :]
        compare(int(tail[0]) if tail else 20, "spin")
    elif "--compare" in sys.argv:
        tail = sys.argv[sys.argv.index("--compare") + 1 :]
        compare(int(tail[0]) if tail else 20)
    elif "--json" in sys.argv:
        print(json.dumps(run()))
    else:
        for figure, target, value, unit in run():
            print(f"{figure:45s} {value:12,.3f} {unit:8s} target {target}")
