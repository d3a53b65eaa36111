"""Actors for tests/core/test_busy_loop.py (importable by child procs): the pattern of
Monarch's ``grpo_yield.py`` example, where actors keep their proc's loop busy.

Generators run ``asyncio.create_task`` loops (started from an async endpoint) that send to
one shared port as fast as they can, yielding only with ``await asyncio.sleep(0)``; a scorer
loops on ``await receiver.recv()`` over a channel; a trainer pushes weights with
``send(..., selection="choose")``. Nothing here ever waits for I/O of its own, so the procs'
trio loops see ready work at every turn: their acknowledgements and heartbeats must be
served anyway.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from regency.actor import Actor, ActorMesh, Channel, Port, current_rank, endpoint, send

#: What a generator sends when it stops, and the scorer's cue to return.
SENTINEL = "shutdown"


class Generator(Actor):
    """Rollouts as fast as the loop allows, to one shared port."""

    def __init__(self) -> None:
        self.version = 0
        self.sent = 0
        self.running = False
        self.port: Port[Any] | None = None
        self.task: asyncio.Task[None] | None = None

    @endpoint
    async def start(self, port: Port[Any], payload: int) -> None:
        self.running = True
        self.port = port
        self.task = asyncio.create_task(self._rollouts(port, b"x" * payload))

    async def _rollouts(self, port: Port[Any], blob: bytes) -> None:
        rank = current_rank().rank
        while self.running:
            port.send((rank, self.version, self.sent, blob))
            self.sent += 1
            await asyncio.sleep(0)

    @endpoint
    async def update_weights(self, version: int) -> None:
        self.version = version

    @endpoint
    async def stop_rollouts(self) -> int:
        """Stop the rollout loop and send the sentinel behind its values (one sender's
        messages arrive in order); how many values it sent."""
        self.running = False
        if self.task is not None and self.port is not None:
            await self.task
            self.port.send(SENTINEL)
        return self.sent


class Scorer(Actor):
    """Scores what comes through its channel until the sentinel does."""

    def __init__(self) -> None:
        self.port, self.receiver = Channel[Any].open()
        self.scored = 0

    @endpoint
    async def channel_port(self) -> Port[Any]:
        return self.port

    @endpoint
    async def run(self, senders: int, work_us: float = 0.0, in_task: bool = False) -> int:
        """Loop on ``await receiver.recv()`` until every sender's sentinel came, spending
        ``work_us`` of CPU on each value (scoring it); how many it scored. ``in_task``: the
        loop runs in an ``asyncio.create_task`` task, which the endpoint awaits."""
        if in_task:
            return await asyncio.create_task(self._score(senders, work_us))
        return await self._score(senders, work_us)

    async def _score(self, senders: int, work_us: float) -> int:
        stops = 0
        while stops < senders:
            item = await self.receiver.recv()
            if item == SENTINEL:
                stops += 1
                continue
            if work_us:
                _spin(work_us)
            self.scored += 1
        return self.scored


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


class Trainer(Actor):
    """Pushes new weights to one generator at a time, as the example's trainer does."""

    def __init__(self, generators: ActorMesh[Generator]) -> None:
        self.generators = generators
        self.version = 0

    @endpoint
    async def step(self) -> int:
        self.version += 1
        send(self.generators.update_weights, (self.version,), {}, selection="choose")
        await asyncio.sleep(0)
        return self.version


class Probe(Actor):
    """All async: a call to it is read, run and answered by its proc's trio loop, so how
    long one takes says how long that loop leaves its sockets unserved."""

    @endpoint
    async def ping(self) -> None:
        return None
