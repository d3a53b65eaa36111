"""RDMA-buffer figures, measured between real processes of one host.

Run through ``make bench`` (``benchmarks/run.py``), or directly: ``python -m
benchmarks.bench_rdma``. The owner of each buffer is a spawned proc; the reader or writer is
the controller. Memory is plain bytearrays (no torch needed), touched before timing so that
page faults are not counted. Every figure is the median of several timed runs after warm-up.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from regency.actor import Actor, ActorMesh, endpoint, this_host
from regency.rdma import RDMABuffer, set_backend

MiB = 1 << 20
GiB = 1 << 30


class Holder(Actor):
    """Owns registered memory."""

    def __init__(self) -> None:
        self.memory: dict[int, bytearray] = {}

    @endpoint
    def register(self, nbytes: int) -> RDMABuffer:
        self.memory[nbytes] = bytearray(b"\x5a") * nbytes  # every page touched
        return RDMABuffer(memoryview(self.memory[nbytes]))

    @endpoint
    def release(self, nbytes: int) -> None:
        self.memory.pop(nbytes, None)


def _gbps(nbytes: int, fn: Callable[[], object], runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(samples)


def _us(fn: Callable[[], object], n: int) -> float:
    for _ in range(n // 5):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def _same_machine(holder: ActorMesh[Holder], rows: list[tuple[str, str, float, str]]) -> None:
    n = 64 * MiB
    buf = holder.register.call_one(n).get(60)
    local = memoryview(bytearray(b"\x00") * n)

    def read() -> None:
        buf.read_into(local).get(60)

    def write() -> None:
        buf.write_from(local).get(60)

    rows.append(("read_into 64 MiB, two procs, one host", ">= 8", _gbps(n, read, 9), "GB/s"))
    rows.append(("write_from 64 MiB, two procs, one host", ">= 8", _gbps(n, write, 9), "GB/s"))
    set_backend("tcp")
    try:
        rows.append(("read_into 64 MiB, TCP fallback forced", ">= 2", _gbps(n, read, 7), "GB/s"))
        rows.append(("write_from 64 MiB, TCP fallback forced", ">= 2", _gbps(n, write, 7), "GB/s"))
    finally:
        set_backend(None)
    holder.release.call_one(n).get(60)

    small = holder.register.call_one(4096).get(60)
    dst = memoryview(bytearray(4096))
    rows.append(
        ("read_into 4 KiB round trip, same host", "-",
         _us(lambda: small.read_into(dst).get(60), 1000), "us")
    )


def _one_gib(holder: ActorMesh[Holder], rows: list[tuple[str, str, float, str]]) -> None:
    big = holder.register.call_one(GiB).get(120)
    sink = memoryview(bytearray(b"\x00") * GiB)
    rows.append(
        ("read_into 1 GiB, same host", ">= 8",
         _gbps(GiB, lambda: big.read_into(sink).get(120), 5, warmup=1), "GB/s")
    )
    holder.release.call_one(GiB).get(60)


def run() -> list[tuple[str, str, float, str]]:
    """Return rows of (figure, target, measured, unit)."""
    rows: list[tuple[str, str, float, str]] = []
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    holder = procs.spawn("holder", Holder)
    try:
        _same_machine(holder, rows)
        _one_gib(holder, rows)
    finally:
        holder.stop().get(60)
        procs.stop().get(60)
    return rows


if __name__ == "__main__":
    for figure, target, value, unit in run():
        print(f"{figure:45s} {value:12,.2f} {unit:6s} target {target}")
