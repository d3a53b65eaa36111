"""Actors for the debugger tests (importable by child procs)."""

from __future__ import annotations

import trio

from regency.actor import Actor, endpoint


class Debugee(Actor):
    @endpoint
    def compute(self, x: int) -> int:
        y = x * 2
        breakpoint()
        z = y + 1
        return z

    @endpoint
    async def acompute(self, x: int) -> int:
        y = x + 100
        breakpoint()
        await trio.sleep(0)
        return y + 1

    @endpoint
    async def aio_compute(self, x: int) -> int:
        import asyncio

        y = x + 7
        breakpoint()
        await asyncio.sleep(0)  # an asyncio await, through the runtime's asyncio bridge
        return y + 1

    @endpoint
    def boom(self, x: int) -> int:
        v = x + 40
        breakpoint()
        raise ValueError(f"boom {v}")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Bystander(Actor):
    @endpoint
    async def ping(self) -> str:
        return "pong"
