"""Tensor-engine figures, on real procs of this host (CPU, gloo).

* remote ops issued per second: a loop of small elementwise ops on 4 procs, counted at the
  controller (issue rate) and until the last result is fetched (completion rate);
* ``reduce_`` (in place) and ``reduce`` (a new result) of a 64 MiB float32 tensor on 4 procs,
  from issue to a fetched scalar, against a plain ``torch.distributed.all_reduce`` (gloo, in
  place) of the same size among 4 plain processes started by the benchmark, in the same run. gloo's allreduce is in place, so ``reduce`` copies its input first: one more pass
  over 64 MiB per proc.

Run through ``make bench`` (``benchmarks/run.py``) or ``python -m
benchmarks.bench_tensor_engine``. Medians of repeated runs after warm-up.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

MiB = 1 << 20


def _plain_rank(rank: int, n: int, port: int, nbytes: int, runs: int, out: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=timeout)
    t = torch.ones(nbytes // 4)
    samples = []
    for _ in range(runs + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        samples.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    if rank == 0:
        out.put(statistics.median(samples[1:]))


def plain_gloo_all_reduce(n: int, nbytes: int, runs: int) -> float:
    """Median seconds of ``torch.distributed.all_reduce`` (gloo, in place) of ``nbytes`` among
    ``n`` plain processes: the baseline, with no Regency in the way."""
    import multiprocessing

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_plain_rank, args=(r, n, store.port, nbytes, runs, out))
        for r in range(n)
    ]
    for p in procs:
        p.start()
    try:
        return float(out.get(timeout=300))
    finally:
        for p in procs:
            p.join(60)


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

        def engine_reduce(inplace: bool) -> float:
            t0 = time.perf_counter()
            with mesh.activate():
                if inplace:
                    big.reduce_("gpus", "sum")
                    first = big[0]
                else:
                    first = big.reduce("gpus", "sum")[0]
            regency.inspect(first)
            return time.perf_counter() - t0

        times: dict[str, list[float]] = {"inplace": [], "new": []}
        for _ in range(6):
            times["inplace"].append(engine_reduce(True))
            times["new"].append(engine_reduce(False))
        times["gloo"] = [plain_gloo_all_reduce(4, nbytes, 5)]
        gloo_s = times["gloo"][0]
        inplace_s, outplace_s = (statistics.median(times[k][1:]) for k in ("inplace", "new"))
        rows.append(
            ("plain torch.distributed gloo all_reduce 64 MiB, 4 procs", "", gloo_s * 1e3, "ms")
        )
        rows.append(
            ("reduce_ 64 MiB sum, 4 procs (engine, issue to fetch)", "", inplace_s * 1e3, "ms")
        )
        rows.append(("reduce_ / plain gloo", "<= 1.3", inplace_s / gloo_s, "x"))
        rows.append(
            ("reduce 64 MiB (new result: one more 64 MiB pass)", "", outplace_s * 1e3, "ms")
        )
        rows.append(("reduce / plain gloo", "<= 1.3", outplace_s / gloo_s, "x"))
    finally:
        mesh.stop().get(60)
    return rows


def _main() -> Any:
    for figure, target, value, unit in run():
        print(f"{figure:58s} {value:12,.2f} {unit:6s} target {target}")


if __name__ == "__main__":
    _main()
