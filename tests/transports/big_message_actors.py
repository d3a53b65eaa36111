"""Actors for tests/transports/test_big_message_memory.py (importable by procs)."""

from __future__ import annotations

import os

from regency.actor import Actor, endpoint


class SyncSink(Actor):
    """Sync endpoints only: driven by an actor thread (``ActorCell._thread_main``)."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def length(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def echo(self, data: bytes) -> bytes:
        return data


class AsyncSink(Actor):
    """Async endpoints only: driven by a trio task (``ActorCell._task_main``)."""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def length(self, data: bytes) -> int:
        return len(data)


class MixedSink(Actor):
    """A sync endpoint and an async one: an actor thread that awaits on the loop."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def length(self, data: bytes) -> int:
        return len(data)
