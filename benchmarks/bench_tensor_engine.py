"""Tensor-engine figures of issue #14, on real procs of this host (CPU, gloo).

* remote ops issued per second: a loop of small elementwise ops on 4 procs, counted at the
  controller (issue rate) and until the last result is fetched (completion rate);
* ``reduce`` (sum over every dim) of a 64 MiB float32 tensor on 4 procs, from issue to a
  fetched scalar, against a plain gloo ``allreduce`` of the same size between the same procs
  (run inside a remote function, on the group the engine uses), in the same run.

Run through ``make bench`` (``benchmarks/run.py``) or ``python -m
benchmarks.bench_tensor_engine``. Medians of repeated runs after warm-up.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

MiB = 1 << 20


def plain_gloo_allreduce(group: tuple[int, ...], nbytes: int, runs: int) -> float:
    """Runs on a worker: median seconds of a gloo allreduce of ``nbytes`` over ``group``,
    directly on the process group (no engine in the way)."""
    import torch
    import torch.distributed as dist

    from regency._tensor_engine import _worker

    worker = _worker._running
    assert worker is not None
    pg = worker.comm._group(group)  # type: ignore[attr-defined]
    t = torch.ones(nbytes // 4)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]
    samples = []
    for _ in range(runs + 1):
        pg.barrier().wait()
        t0 = time.perf_counter()
        pg.allreduce([t], opts).wait()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[1:])


def run() -> list[tuple[str, str, float, str]]:
    """Return rows of (figure, target, measured, unit)."""
    import torch

    import regency
    from regency.actor import this_host

    rows: list[tuple[str, str, float, str]] = []
    mesh = this_host().spawn_procs({"gpus": 4})
    try:
        with mesh.activate():
            x = torch.ones(8)
        regency.inspect(x)  # workers up

        def ops(n: int) -> tuple[float, float]:
            with mesh.activate():
                y = x
                t0 = time.perf_counter()
                for _ in range(n):
                    y = y + 1
                issued = time.perf_counter() - t0
            regency.inspect(y)
            return n / issued, n / (time.perf_counter() - t0)

        ops(500)
        samples = [ops(2000) for _ in range(3)]
        rows.append(
            (
                "remote ops issued/s (y = y + 1, 4 procs)",
                "",
                statistics.median(s[0] for s in samples),
                "ops/s",
            )
        )
        rows.append(
            (
                "remote ops completed/s (same loop, to fetch)",
                "",
                statistics.median(s[1] for s in samples),
                "ops/s",
            )
        )

        nbytes = 64 * MiB
        with mesh.activate():
            big = torch.ones(nbytes // 4)

        def engine_reduce() -> float:
            t0 = time.perf_counter()
            with mesh.activate():
                r = big.reduce("gpus", "sum")
                first = r[0]
            regency.inspect(first)
            return time.perf_counter() - t0

        engine_reduce()
        engine_s = statistics.median(engine_reduce() for _ in range(5))
        gloo = regency.remote(plain_gloo_allreduce, propagate="inspect")
        with mesh.activate():
            per_rank = gloo.call((0, 1, 2, 3), nbytes, 5).get()
        gloo_s = max(per_rank.values())
        rows.append(
            ("reduce 64 MiB sum over 4 procs (engine, issue to fetch)", "", engine_s * 1e3, "ms")
        )
        rows.append(("plain gloo allreduce 64 MiB, same procs", "", gloo_s * 1e3, "ms"))
        rows.append(("engine reduce / plain gloo", "<= 1.3", engine_s / gloo_s, "x"))
    finally:
        mesh.stop().get(60)
    return rows


def _main() -> Any:
    for figure, target, value, unit in run():
        print(f"{figure:58s} {value:12,.2f} {unit:6s} target {target}")


if __name__ == "__main__":
    _main()
