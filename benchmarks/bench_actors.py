"""Actor figures, measured end to end with real processes.

Run through ``make bench`` (``benchmarks/run.py``), or directly:
``python -m benchmarks.bench_actors``. ``python -m benchmarks.bench_actors --compare [BLOCKS]``
measures threads reading their own messages against the loop reading everything, in one
process against the same procs, in alternating short blocks (docs/performance.md);
``--compare-spin`` and ``--compare-hold`` do the same for spinning before sleeping and for
holding connections between waits. ``--compare-recorder [BLOCKS]`` measures the flight
recorder's cost the same way: an actor with it against one without it
(``bench_dispatch.no_recorder``), on the same procs (docs/performance.md, "What the
always-on introspection costs").
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
from typing import Any

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

    @endpoint
    def cpu(self) -> float:
        """This proc's CPU time (all its threads), in seconds."""
        return time.process_time()

    @endpoint
    def no_recorder(self, on: bool) -> None:
        """While on, actors made in this proc run without the flight recorder, and no
        mailbox stamps the time a call was queued (``bench_dispatch.no_recorder``)."""
        global _no_recorder
        from benchmarks.bench_dispatch import no_recorder

        if on and _no_recorder is None:
            _no_recorder = no_recorder()
            _no_recorder.__enter__()
        elif not on and _no_recorder is not None:
            _no_recorder.__exit__(None, None, None)
            _no_recorder = None


_no_recorder: Any = None


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


def _round_trip_us(ping: Any, n: int = 500) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        ping.call_one().get()
    return (time.perf_counter() - t0) / n * 1e6


def _pipelined_per_s(ping: Any, n: int = 5000) -> float:
    t0 = time.perf_counter()
    futs = [ping.call_one() for _ in range(n)]
    for f in futs:
        f.get()
    return n / (time.perf_counter() - t0)


def _pipelined_cpu_us(actor: Any, n: int = 5000) -> float:
    """The proc's CPU time (all its threads) per call of a pipelined block: less swayed by
    the machine's load than the wall clock."""
    before = actor.cpu.call_one().get()
    ping = actor.ping
    futs = [ping.call_one() for _ in range(n)]
    for f in futs:
        f.get()
    return (actor.cpu.call_one().get() - before) / n * 1e6


def compare_recorder(blocks: int) -> None:
    """The flight recorder on and off, in one process: two procs, each with one actor, one
    of them without the recorder (``bench_dispatch.no_recorder``: its mailbox loop without
    it, its mailbox stamping no call); short blocks of each figure, alternating (the order
    flips every block). Done twice, on fresh procs made in the other order. Prints the
    median and quartiles of the blocks, and the median ratio of adjacent blocks (recorder
    off over on for times, on over off for throughput: 1.000 is no cost)."""
    seen: dict[tuple[str, bool], list[float]] = {}
    ratios: dict[str, list[float]] = {}
    figures = [
        ("call_one round trip, sync endpoint", "us"),
        ("pipelined call_one, 5,000 calls", "calls/s"),
        ("the proc's CPU per pipelined call", "us"),
    ]
    for order in ((True, False), (False, True)):
        actors: dict[bool, Any] = {}
        meshes = []
        for on in order:
            procs = this_host().spawn_procs(per_host={"gpus": 1})
            meshes.append(procs)
            switch = procs.spawn("switch", Echo)  # (stopped below: one actor per proc)
            switch.no_recorder.call(not on).get(30)
            actors[on] = procs.spawn("echo", Echo)
            actors[on].ping.call().get(30)  # its mailbox loop is made
            switch.stop().get(30)

        blocks_of: dict[str, Callable[[Any], float]] = {
            figures[0][0]: lambda actor: _round_trip_us(actor.ping),
            figures[1][0]: lambda actor: _pipelined_per_s(actor.ping),
            figures[2][0]: _pipelined_cpu_us,
        }
        for b in range(blocks + 1):
            for name, unit in figures:
                pair = {}
                for on in (False, True) if b % 2 else (True, False):
                    pair[on] = blocks_of[name](actors[on])
                if b:  # the first round warms up
                    for on, value in pair.items():
                        seen.setdefault((name, on), []).append(value)
                    ratio = pair[False] / pair[True] if unit == "us" else pair[True] / pair[False]
                    ratios.setdefault(name, []).append(ratio)
        for procs in meshes:
            procs.stop().get(30)
    print(f"{'figure (median, quartiles of ' + str(2 * blocks) + ' blocks)':44s} "
          f"{'recorder off':>28s} {'recorder on':>28s} {'on/off (quartiles)':>22s}")
    for name, unit in figures:
        cells = []
        for on in (False, True):
            values = seen[(name, on)]
            q = statistics.quantiles(values, n=4)
            cells.append(f"{statistics.median(values):,.1f} ({q[0]:,.1f}-{q[2]:,.1f})")
        q = statistics.quantiles(ratios[name], n=4)
        ratio = f"{statistics.median(ratios[name]):.3f} ({q[0]:.3f}-{q[2]:.3f})"
        print(f"{name:44s} {cells[0]:>28s} {cells[1]:>28s} {ratio:>22s} {unit}")


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
    if "--compare-recorder" in sys.argv:
        tail = sys.argv[sys.argv.index("--compare-recorder") + 1 :]
        compare_recorder(int(tail[0]) if tail else 20)
    elif "--compare-hold" in sys.argv:
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
