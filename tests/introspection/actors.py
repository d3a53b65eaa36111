"""Actors for the introspection tests: each hangs until a file exists (the test creates it),
so a test decides when a stuck rank lets go."""

from __future__ import annotations

import asyncio
import os
import threading

import trio

from regency.actor import Actor, current_rank, endpoint


class Stuck(Actor):
    """``hang(path, rank)`` blocks the actor's thread (a sync wait) on rank ``rank`` only."""

    @endpoint
    def hang(self, path: str, rank: int) -> int:
        if current_rank().rank == rank:
            event = threading.Event()
            while not os.path.exists(path):
                event.wait(0.02)  # the stuck line
        return current_rank().rank

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def fail(self) -> None:
        raise ValueError("bad value 42")


class TrioStuck(Actor):
    @endpoint
    async def hang(self, path: str) -> str:
        while not os.path.exists(path):
            await trio.sleep(0.02)  # the trio await
        return "done"


class AsyncioStuck(Actor):
    @endpoint
    async def hang(self, path: str) -> str:
        while not os.path.exists(path):
            await asyncio.sleep(0.02)  # the asyncio await
        return "done"


class Forever(Actor):
    """For the simulator: an endpoint that awaits forever."""

    @endpoint
    async def wait(self) -> None:
        await trio.sleep_forever()

    @endpoint
    async def ok(self) -> int:
        return 1
