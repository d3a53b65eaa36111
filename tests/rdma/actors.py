"""Actors for the RDMA tests (importable by child procs)."""

from __future__ import annotations

import os
from typing import Any

from regency.actor import Actor, endpoint
from regency.rdma import RDMAAction, RDMABuffer, set_backend
from regency.rdma._state import current_state


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
