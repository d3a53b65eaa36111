"""Actors for the RDMA tests (importable by child procs)."""

from __future__ import annotations

import os
from typing import Any

from regency.actor import Actor, endpoint
from regency.rdma import RDMAAction, RDMABuffer, set_backend
from regency.rdma._state import current_state


def gpu_pattern(n: int, seed: int) -> Any:
    """``n`` pseudo-random bytes on the GPU, the same for the same ``seed`` in any process."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)


class Peer(Actor):
    """Owns memory (registered as RDMABuffers) and reads or writes other peers' buffers."""

    def __init__(self) -> None:
        self.memory: dict[str, Any] = {}
        self.buffers: dict[str, RDMABuffer] = {}

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def use_backend(self, name: str | None) -> None:
        set_backend(name)

    @endpoint
    def make(self, name: str, data: bytes, kind: str = "memoryview") -> RDMABuffer:
        """Register a copy of ``data`` as buffer ``name``; kind: memoryview, readonly, tensor,
        cuda (a GPU tensor)."""
        if kind in ("tensor", "cuda"):
            import torch

            mem: Any = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if kind == "cuda":
                mem = mem.cuda()
            view: Any = mem
        elif kind == "readonly":
            mem = bytes(data)
            view = memoryview(mem)
        else:
            mem = bytearray(data)
            view = memoryview(mem)
        self.memory[name] = mem
        self.buffers[name] = RDMABuffer(view)
        return self.buffers[name]

    @endpoint
    async def make_async(self, name: str, data: bytes) -> RDMABuffer:
        """Registration from the proc's trio loop (an async endpoint)."""
        self.memory[name] = bytearray(data)
        self.buffers[name] = RDMABuffer(memoryview(self.memory[name]))
        return self.buffers[name]

    @endpoint
    def make_gpu(self, name: str, n: int, seed: int, at: int = 0) -> RDMABuffer:
        """Register ``n`` bytes of :func:`gpu_pattern` ``seed`` that start ``at`` bytes into a
        larger CUDA tensor (a view with an offset), the bytes around it poisoned."""
        import torch

        whole = torch.full((at + n + 77,), 0xEE, dtype=torch.uint8, device="cuda")
        whole[at : at + n] = gpu_pattern(n, seed)
        self.memory[name] = whole
        self.buffers[name] = RDMABuffer(whole[at : at + n])
        return self.buffers[name]

    @endpoint
    def gpu_matches(self, name: str, n: int, seed: int, at: int = 0, flip: bool = False) -> bool:
        """Whether GPU buffer ``name`` holds pattern ``seed`` (reversed when ``flip``) and the
        poison around it is intact."""
        import torch

        whole = self.memory[name]
        want = gpu_pattern(n, seed)
        if flip:
            want = torch.flip(want, (0,))
        return bool(
            torch.equal(whole[at : at + n], want)
            and bool((whole[:at] == 0xEE).all())
            and bool((whole[at + n :] == 0xEE).all())
        )

    @endpoint
    def read_gpu(self, buf: RDMABuffer, seed: int, where: str = "cuda") -> bool:
        """Read ``buf`` into fresh memory on ``where`` here; whether it holds pattern ``seed``."""
        import torch

        dst = torch.zeros(buf.size(), dtype=torch.uint8, device=where)
        buf.read_into(dst).get(60)
        return bool(torch.equal(dst.cuda(), gpu_pattern(buf.size(), seed)))

    @endpoint
    def cuda_used(self) -> bool:
        """Whether this process has initialised CUDA."""
        import torch

        return bool(torch.cuda.is_initialized())

    @endpoint
    def mapped(self) -> int:
        """GPU buffers of other processes this process maps through CUDA IPC."""
        from regency.rdma._transfer import SAME_HOST

        return SAME_HOST.mapped()

    @endpoint
    def forget(self, name: str) -> int:
        """Drop buffer ``name`` and its memory; free what torch can. Returns the bytes
        torch's allocator still has allocated on the GPU."""
        import torch

        self.buffers.pop(name).drop().get(10)  # idempotent: another process may have dropped it
        del self.memory[name]
        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        return int(torch.cuda.memory_allocated())

    @endpoint
    def gpu_allocated(self) -> int:
        import torch

        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        return int(torch.cuda.memory_allocated())

    @endpoint
    def fill_late(self, name: str, value: int) -> None:
        """Queue, on a side stream, a long computation that ends by filling GPU buffer
        ``name`` with ``value``, and return without waiting for it."""
        import torch

        t = self.memory[name]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            m = torch.rand(4096, 4096, device="cuda")
            for _ in range(20):
                m = m @ m
                m = m / m.norm()
            t.fill_(value)
            t.add_((m.sum() * 0).to(torch.uint8))  # depends on the computation

    @endpoint
    def busy_then_fill(self, name: str, value: int, cycles: int) -> None:
        """Queue, on a side stream, ``cycles`` GPU clock cycles of spinning and then a fill
        of GPU buffer ``name`` with ``value``; return without waiting."""
        import torch

        t = self.memory[name]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
            t.fill_(value)

    @endpoint
    def contents(self, name: str) -> bytes:
        mem = self.memory[name]
        return bytes(mem.tolist()) if hasattr(mem, "tolist") else bytes(mem)

    @endpoint
    def drop(self, name: str) -> None:
        self.buffers[name].drop().get(10)

    @endpoint
    def leases(self, name: str) -> int:
        """Leases on ``name`` once the releases already sent have arrived (they travel on
        the data connections, unordered with this call)."""
        buf_id = self.buffers[name]._ref.buf_id
        registry = current_state().registry
        registry.wait_unleased(buf_id, 10)
        return registry.leases_of(buf_id)

    @endpoint
    def read(self, buf: RDMABuffer, n: int, timeout: float = 30.0) -> bytes:
        out = bytearray(n)
        buf.read_into(memoryview(out), timeout=timeout).get(60)
        return bytes(out)

    @endpoint
    async def read_async(self, buf: RDMABuffer, n: int) -> bytes:
        out = bytearray(n)
        await buf.read_into(memoryview(out))
        return bytes(out)

    @endpoint
    def write(self, buf: RDMABuffer, data: bytes) -> None:
        buf.write_from(memoryview(data)).get(60)

    @endpoint
    def batch(self, reads: list[RDMABuffer], writes: list[tuple[RDMABuffer, bytes]]) -> list[bytes]:
        action = RDMAAction()
        outs = [bytearray(b.size()) for b in reads]
        for buf, out in zip(reads, outs, strict=True):
            action.read_remote(memoryview(out), buf)
        for buf, data in writes:
            action.write_remote(buf, memoryview(data))
        action.submit().get(60)
        return [bytes(o) for o in outs]
