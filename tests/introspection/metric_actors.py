"""Actors for the metrics tests (tests/introspection/test_metrics.py)."""

from __future__ import annotations

import trio

from regency.actor import Actor, concurrent_endpoint, endpoint


class Mixed(Actor):
    """Sync endpoints (it has a thread) and a concurrent one (its calls run on the loop):
    its calls are recorded from two threads."""

    @endpoint
    def ping(self) -> str:
        return "pong"

    @concurrent_endpoint
    async def nap(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return "rested"


class AllAsync(Actor):
    """Only async endpoints: its mailbox loop runs on the proc's trio loop."""

    @endpoint
    async def ping(self) -> str:
        return "pong"

    @endpoint
    async def fail(self) -> None:
        raise RuntimeError("async failure")
