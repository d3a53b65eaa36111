"""Log forwarding: what it costs.

* lines per second from 4 procs to the controller's sink (each proc prints as fast as it
  can; timed until the flush barrier confirms every line was printed at the controller);
* ``call_one`` round trips with forwarding on and off, nothing printed (target: no
  measurable change); on and off alternate, several rounds, to even out the machine's load;
* the greenlet driver every async endpoint runs under (so a ``breakpoint()`` in one waits
  off the loop): end to end (procs whose bootstrap swaps it out) and per await in one
  process.

The procs' host output is /dev/null here: each measurement runs in a child controller whose
fds 1 and 2 point there (its procs inherit them), and which writes its figures to a file.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import io, json, os, statistics, sys, time
result_path = sys.argv[1]
import regency
from regency import _logs
from regency.actor import Actor, endpoint, this_host

class Chatty(Actor):
    @endpoint
    def chat(self, n: int) -> None:
        for i in range(n):
            print(f"training step {i} finished; loss is 0.{i % 97:02d}; all is well")

    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    async def aping(self) -> None:
        return None

def median_us(fn, n=1000, repeats=5):
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)

def without_driver():
    # Await async endpoints directly, as before the debugger's greenlet driver.
    import regency._debugger._remote as remote
    remote.drive = lambda coro: coro

out = {}
meshes = {}
for variant in ("off", "on", "nodriver"):
    regency.configure(enable_log_forwarding=variant == "on")
    boot = without_driver if variant == "nodriver" else None
    pm = this_host().spawn_procs(per_host={"gpus": 4}, bootstrap=boot)
    actors = pm.spawn("chatty", Chatty)
    actors.ping.call().get(60)
    if variant == "on":
        pm.logging_option(stream_to_client=True, aggregate_window_sec=None).get(30)
    meshes[variant] = (pm, actors)

for pm, actors in meshes.values():
    one = actors.slice(gpus=0)
    for _ in range(1000):
        one.ping.call_one().get()
rounds = {v: {"sync": [], "async": []} for v in meshes}
for _ in range(4):
    for variant, (pm, actors) in meshes.items():
        one = actors.slice(gpus=0)
        rounds[variant]["sync"].append(median_us(lambda: one.ping.call_one().get()))
        rounds[variant]["async"].append(median_us(lambda: one.aping.call_one().get()))
for variant in meshes:
    for kind in ("sync", "async"):
        out[f"{kind}_{variant}"] = statistics.median(rounds[variant][kind])

pm, actors = meshes["on"]
sink_out = io.StringIO()
real_stdout = sys.stdout
per_proc = 50_000
rates = []
for _ in range(3):
    sys.stdout = sink_out
    t0 = time.perf_counter()
    actors.chat.call(per_proc).get(300)
    _logs.flush(pm).get(300)
    elapsed = time.perf_counter() - t0
    sys.stdout = real_stdout
    lines = sink_out.getvalue().count("training step")
    assert lines == 4 * per_proc, lines
    sink_out.seek(0); sink_out.truncate()
    rates.append(4 * per_proc / elapsed)
out["lines_per_s"] = statistics.median(rates)
for pm, _ in meshes.values():
    pm.stop().get(60)
with open(result_path, "w") as f:
    json.dump(out, f)
"""


def _driver_overhead_us() -> tuple[float, float]:
    """(plain await, greenlet-driven await) of a trivial coroutine, per call, in us."""
    import trio

    from regency._debugger import drive

    async def body() -> int:
        await trio.lowlevel.checkpoint()
        return 1

    async def measure() -> tuple[float, float]:
        n = 20_000
        plain, driven = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                await body()
            plain.append((time.perf_counter() - t0) / n * 1e6)
            t0 = time.perf_counter()
            for _ in range(n):
                await drive(body())
            driven.append((time.perf_counter() - t0) / n * 1e6)
        return statistics.median(plain), statistics.median(driven)

    return trio.run(measure)


def run() -> list[tuple[str, str, float, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        with open(os.devnull, "w") as devnull:
            subprocess.run(
                [sys.executable, "-c", CHILD, result],
                stdout=devnull,
                stderr=devnull,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": ROOT},
                check=True,
                timeout=600,
            )
        with open(result) as f:
            figures = json.load(f)
    plain, driven = _driver_overhead_us()
    return [
        ("forwarded lines/s, 4 procs -> controller (no window)", "", figures["lines_per_s"], "lines/s"),
        ("call_one sync endpoint, forwarding off", "", figures["sync_off"], "us"),
        ("call_one sync endpoint, forwarding on, nothing printed", "= off", figures["sync_on"], "us"),
        ("call_one async endpoint, forwarding off", "", figures["async_off"], "us"),
        ("call_one async endpoint, forwarding on, nothing printed", "= off", figures["async_on"], "us"),
        ("call_one async endpoint, forwarding off, without the greenlet driver", "", figures["async_nodriver"], "us"),
        ("await of a one-checkpoint coroutine, plain", "", plain, "us"),
        ("same, through the debugger's greenlet driver", "", driven, "us"),
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
