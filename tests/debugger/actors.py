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
