"""Actors for the singleton-controller and concurrent-endpoint tests (importable by procs)."""

from __future__ import annotations

import os

import trio

from regency.actor import Actor, concurrent_endpoint, endpoint, get_or_spawn_controller


class Tally(Actor):
    def __init__(self, start: int = 0) -> None:
        self.total = start

    @endpoint
    async def add(self, n: int) -> int:
        self.total += n
        return self.total

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Broken(Actor):
    def __init__(self) -> None:
        raise RuntimeError("this controller cannot start")

    @endpoint
    async def hello(self) -> str:
        return "hello"


class Client(Actor):
    """Finds the job's Tally from inside a proc."""

    @endpoint
    def add_from_proc(self, n: int) -> tuple[str, int]:
        tally = get_or_spawn_controller("tally", Tally, 100).get(30)
        return tally._key, tally.add.call_one(n).get(30)

    @endpoint
    async def add_from_async(self, n: int) -> tuple[str, int]:
        tally = await get_or_spawn_controller("tally", Tally, 100)
        return tally._key, await tally.add.call_one(n)


class Gate(Actor):
    def __init__(self) -> None:
        self.opened = trio.Event()
        self.log: list[str] = []

    @concurrent_endpoint
    async def wait(self, tag: str) -> str:
        self.log.append(f"waiting {tag}")
        await self.opened.wait()
        return f"passed {tag}"

    @endpoint
    async def open(self) -> list[str]:
        self.opened.set()
        return list(self.log)

    @concurrent_endpoint
    async def fail(self) -> None:
        raise KeyError("no such thing")
