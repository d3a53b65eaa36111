"""Introspection figures: how long ``regency.stacks()`` of a 64-proc job takes (target under
1 s on this machine), and how long a timed-out call takes to explain itself.
``python -m benchmarks.bench_introspection``."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time

import regency
from regency.actor import Actor, current_rank, endpoint, this_host

Row = tuple[str, str, float, str]


class Held(Actor):
    """Rank 0 waits for a file; the others are idle."""

    @endpoint
    def hold(self, path: str) -> None:
        if current_rank().rank == 0:
            event = threading.Event()
            while not os.path.exists(path):
                event.wait(0.01)

    @endpoint
    def ping(self) -> int:
        return current_rank().rank


def run(procs: int = 64, repeats: int = 7) -> list[Row]:
    pm = this_host().spawn_procs(per_host={"gpus": procs})
    try:
        mesh = pm.spawn("held", Held)
        mesh.ping.call().get(120)
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "release")
            fut = mesh.hold.call(path)
            regency.stacks(timeout=30)  # warm: every proc has answered once
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                stacks = regency.stacks(timeout=30)
                times.append(time.perf_counter() - start)
                assert len(stacks.procs) == procs and not stacks.unanswered
            explain = []
            for _ in range(3):
                start = time.perf_counter()
                try:
                    fut.get(timeout=0.1)
                except TimeoutError:
                    pass
                explain.append(time.perf_counter() - start - 0.1)
            open(path, "w").close()
            fut.get(60)
    finally:
        pm.stop().get(60)
    return [
        (f"stacks() of {procs} procs (median of {repeats})", "< 1", statistics.median(times), "s"),
        ("a timed-out call's explanation, beyond its timeout", "", statistics.median(explain), "s"),
    ]


if __name__ == "__main__":
    procs = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    for figure, target, value, unit in run(procs):
        print(f"{figure}: {value:.3f} {unit} (target {target} {unit})")
