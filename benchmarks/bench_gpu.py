"""GPU figures of ``regency.rdma``: ``RDMABuffer.read_into`` / ``write_from`` of GPU memory
between two processes of one host, per size and path.

``python -m benchmarks.bench_gpu [--sizes 4K,1M,64M,1G] [--runs N]``. Without torch or a CUDA
device it prints "no GPU" and exits 0. The owner of each buffer is a spawned proc holding a CUDA
tensor of random bytes; the reader or writer is the controller. Paths:

* ``ipc gpu->gpu``: the controller's memory is a CUDA tensor, the copy goes through the CUDA
  IPC mapping of the owner's allocation (the ``auto`` path on one host);
* ``ipc gpu->cpu``: the controller's memory is a CPU tensor (pageable, as a user's would be);
* ``tcp gpu->gpu`` / ``tcp gpu->cpu``: the TCP fallback forced: the owner stages through
  pinned host memory, the bytes cross a loopback socket;
* ``cpu->gpu``: the owner's buffer is CPU memory, the controller's a CUDA tensor (same-host
  copy into pinned staging, then one host-to-device copy).

Each figure is the median over ``runs`` timed transfers after warm-up, each one from the call
to the resolved Future (so it includes the lease round trip and the device synchronisation).
``torch`` copies inside one process (device to device, device to pageable host) are printed as
the ceiling each path is bounded by.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from regency.actor import Actor, ActorMesh, endpoint, this_host
from regency.rdma import RDMABuffer, set_backend

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SIZES = "4K,256K,1M,16M,64M,256M,1G"


def parse_size(text: str) -> int:
    units = {"K": KiB, "M": MiB, "G": GiB}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def label(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


class Holder(Actor):
    """Owns registered GPU (or CPU) memory."""

    def __init__(self) -> None:
        self.memory: dict[tuple[int, str], Any] = {}
        self.buffers: dict[tuple[int, str], RDMABuffer] = {}

    @endpoint
    def register(self, nbytes: int, device: str) -> RDMABuffer:
        import torch

        t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
        if device != "cpu":
            torch.cuda.synchronize()
        self.memory[(nbytes, device)] = t
        self.buffers[(nbytes, device)] = RDMABuffer(t)
        return self.buffers[(nbytes, device)]

    @endpoint
    def ping(self) -> None:
        """Nothing: an actor round trip, the reference for a transfer's fixed cost."""

    @endpoint
    def release(self, nbytes: int, device: str) -> None:
        import torch

        buf = self.buffers.pop((nbytes, device), None)
        if buf is not None:
            buf.drop().get(60)
        self.memory.pop((nbytes, device), None)
        if device != "cpu":
            torch.cuda.synchronize()
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()


def _median_s(fn: Callable[[], object], runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _transfer_s(buf: RDMABuffer, local: Any, write: bool, runs: int) -> float:
    """Median seconds of one whole transfer (call to resolved Future)."""
    if write:
        return _median_s(lambda: buf.write_from(local).get(120), runs, 2)
    return _median_s(lambda: buf.read_into(local).get(120), runs, 2)


def _runs_for(n: int, runs: int) -> int:
    return max(3, runs if n <= 64 * MiB else runs // 4)


def _local_ceiling(torch: Any, n: int, runs: int) -> tuple[float, float]:
    """GB/s of a device-to-device copy and a device-to-pageable-host copy in one process."""
    a = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    h = torch.empty(n, dtype=torch.uint8)

    def d2d() -> None:
        b.copy_(a)
        torch.cuda.synchronize()

    def d2h() -> None:
        h.copy_(a)
        torch.cuda.synchronize()

    r = _runs_for(n, runs)
    return n / _median_s(d2d, r, 2) / 1e9, n / _median_s(d2h, r, 2) / 1e9


def measure(holder: ActorMesh[Holder], sizes: list[int], runs: int) -> list[list[str]]:
    import torch

    rows: list[list[str]] = []
    for n in sizes:
        r = _runs_for(n, runs)
        row = [label(n)]
        gpu_buf = holder.register.call_one(n, "cuda").get(120)
        local_gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
        local_cpu = torch.empty(n, dtype=torch.uint8)
        local_cpu.fill_(1)  # pages touched
        first_read = 0.0
        for backend in ("same_host", "tcp"):
            set_backend(backend)
            try:
                for local in (local_gpu, local_cpu):
                    read = _transfer_s(gpu_buf, local, False, r)
                    write = _transfer_s(gpu_buf, local, True, r)
                    first_read = first_read or read
                    row += [f"{n / read / 1e9:.2f}", f"{n / write / 1e9:.2f}"]
            finally:
                set_backend(None)
        holder.release.call_one(n, "cuda").get(120)
        cpu_buf = holder.register.call_one(n, "cpu").get(120)
        read = _transfer_s(cpu_buf, local_gpu, False, r)
        row.append(f"{n / read / 1e9:.2f}")
        holder.release.call_one(n, "cpu").get(120)
        d2d, d2h = _local_ceiling(torch, n, runs)
        row += [f"{d2d:.1f}", f"{d2h:.1f}", f"{first_read * 1e6:.0f}"]
        rows.append(row)
        del local_gpu, local_cpu
        torch.cuda.empty_cache()
        print(" | ".join(row), flush=True)
    return rows


HEADER = [
    "size",
    "ipc gpu->gpu read", "ipc gpu->gpu write", "ipc gpu->cpu read", "ipc cpu->gpu write",
    "tcp gpu->gpu read", "tcp gpu->gpu write", "tcp gpu->cpu read", "tcp cpu->gpu write",
    "cpu buf -> gpu read", "torch d2d", "torch d2h", "ipc gpu->gpu read, us",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES, help=f"comma-separated (default {SIZES})")
    parser.add_argument("--runs", type=int, default=12, help="timed transfers per figure")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no GPU: torch is not installed; nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False; nothing to measure")
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print("GB/s, median of timed transfers, each from the call to the resolved Future")
    print(" | ".join(HEADER))
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    holder = procs.spawn("holder", Holder)
    try:
        ping = _median_s(lambda: holder.ping.call_one().get(60), 200, 20)
        cpu_small = holder.register.call_one(4 * KiB, "cpu").get(60)
        sink = torch.empty(4 * KiB, dtype=torch.uint8)
        small = _median_s(lambda: cpu_small.read_into(sink).get(60), 200, 20)
        holder.release.call_one(4 * KiB, "cpu").get(60)
        print(f"reference: actor call_one round trip {ping * 1e6:.0f} us; read_into of a 4 KiB "
              f"CPU buffer (data connection) {small * 1e6:.0f} us")
        rows = measure(holder, sizes, args.runs)
    finally:
        holder.stop().get(60)
        procs.stop().get(60)
    print()
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
