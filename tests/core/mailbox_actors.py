"""Actors of the mailbox tests (importable by real procs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from regency.actor import Actor, endpoint


class Overlap(Actor):
    """Sync and async endpoints that record whether two handlers ever ran at once."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.order: list[int] = []

    def _enter(self, i: int) -> None:
        self.active += 1
        self.most = max(self.most, self.active)
        self.order.append(i)

    @endpoint
    def sync_step(self, i: int) -> None:
        self._enter(i)
        self.active -= 1

    @endpoint
    async def async_step(self, i: int) -> None:
        self._enter(i)
        await trio.sleep(0.01)  # a handler that yields must still block the next one
        self.active -= 1

    @endpoint
    def report(self) -> tuple[int, list[int]]:
        return self.most, self.order


class FailsInit(Actor):
    def __init__(self) -> None:
        raise ValueError("init refused")

    @endpoint
    def hello(self) -> str:
        return "hello"


class Mortal(Actor):
    """Dies of a BaseException; writes a line in __cleanup__."""

    def __init__(self, log: str) -> None:
        self.log = log

    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def die(self) -> None:
        raise SystemExit("mortal")

    def __cleanup__(self, exc: BaseException | None) -> None:
        with Path(self.log).open("a") as f:
            f.write(f"cleanup {type(exc).__name__ if exc else None}\n")


class AsyncMortal(Actor):
    """All async (a trio task): the loop path of the same behaviour."""

    def __init__(self, log: str) -> None:
        self.log = log

    @endpoint
    async def ok(self) -> str:
        return "ok"

    @endpoint
    async def die(self) -> None:
        raise SystemExit("mortal")

    async def __cleanup__(self, exc: BaseException | None) -> None:
        with Path(self.log).open("a") as f:
            f.write(f"cleanup {type(exc).__name__ if exc else None}\n")


def nothing(*_: Any) -> None:
    return None


class Plain(Actor):
    """A threaded actor whose plain methods (no ``@endpoint``) are called through
    ``as_endpoint``: an async one, and a sync one that hands back a coroutine."""

    @endpoint
    def where(self) -> tuple[int, int | None]:
        """This actor's rank, and its rank along ``gpus`` in the slice called."""
        from regency.actor import context

        ctx = context()
        return ctx.actor_instance.rank.rank, dict(ctx.message_rank).get("gpus")

    async def later(self, x: int) -> int:
        await trio.sleep(0)
        if x < 0:
            raise ValueError(f"later({x})")
        return x

    def hands_back(self, x: int) -> Any:
        return self.later(x)  # a coroutine, awaited by the mailbox

    @endpoint
    def frozen(self) -> int:
        import gc

        return gc.get_freeze_count()
