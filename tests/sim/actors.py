"""Actors for the simulated-cluster tests."""

from __future__ import annotations

import os
from typing import Any

import trio

from regency.actor import Actor, ActorMesh, current_rank, endpoint


class Counter(Actor):
    def __init__(self, v: int = 0) -> None:
        self.v = v

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.v += by
        return self.v

    @endpoint
    async def value(self) -> int:
        return self.v

    @endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds


class Gossip(Actor):
    """Each rank calls its neighbours through a mesh it was given (blocking style)."""

    def __init__(self, peers: ActorMesh[Counter]) -> None:
        self.peers = peers

    @endpoint
    def poke_neighbours(self, rounds: int) -> list[int]:
        me = current_rank().rank
        n = len(self.peers)
        seen = []
        for r in range(rounds):
            target = self.peers.flatten("r").slice(r=(me + r + 1) % n)
            seen.append(target.incr.call_one().get())
        return seen


class Recorder(Actor):
    """Records what it receives, in order."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    async def record(self, item: int) -> None:
        self.seen.append(item)

    @endpoint
    async def log(self) -> list[int]:
        return self.seen

    @endpoint
    async def nap(self, seconds: float) -> None:
        await trio.sleep(seconds)


class CastLog(Actor):
    """What the casting-tree tests (real procs and simulated) cast to: it logs what it got."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def add(self, item: int) -> None:
        self.seen.append(item)

    @endpoint
    def log(self) -> list[int]:
        return list(self.seen)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

