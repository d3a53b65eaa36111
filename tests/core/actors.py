"""Actor classes used by the runtime tests (importable by child procs)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import trio

from regency.actor import (
    Actor,
    ActorMesh,
    Port,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
)


class Counter(Actor):
    def __init__(self, v: int = 0) -> None:
        self.v = v

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.v += by

    @endpoint
    async def value(self) -> int:
        return self.v

    def plain(self) -> int:
        return -1


class Recorder(Actor):
    """Records what it receives, in order."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    @endpoint
    def record(self, item: Any) -> None:
        self.seen.append(item)

    @endpoint
    def log(self) -> list[Any]:
        return self.seen


class Where(Actor):
    @endpoint
    def where(self) -> dict[str, Any]:
        ctx = context()
        return {
            "rank": dict(current_rank()),
            "flat": current_rank().rank,
            "size": current_size(),
            "name": current_actor_name(),
            "message_rank": dict(ctx.message_rank),
            "pid": os.getpid(),
            "env": os.environ.get("REGENCY_TEST_ENV"),
        }


class Mixed(Actor):
    """Sync and async endpoints in one actor; one message at a time."""

    def __init__(self) -> None:
        self.active = 0
        self.overlaps = 0

    def _enter(self) -> None:
        self.active += 1
        if self.active > 1:
            self.overlaps += 1

    @endpoint
    def slow_sync(self, seconds: float) -> str:
        self._enter()
        time.sleep(seconds)
        self.active -= 1
        return "sync"

    @endpoint
    async def slow_async(self, seconds: float) -> str:
        self._enter()
        await trio.sleep(seconds)
        self.active -= 1
        return "async"

    @endpoint
    def overlap_count(self) -> int:
        return self.overlaps


class Raiser(Actor):
    @endpoint
    def boom(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    async def aboom(self, message: str) -> None:
        raise KeyError(message)

    @endpoint
    def ok(self) -> str:
        return "still alive"

    @endpoint
    def unpicklable_result(self) -> Any:
        return threading.Lock()


class Caller(Actor):
    """Talks to another mesh directly, from its own process."""

    def __init__(self, peers: ActorMesh[Counter]) -> None:
        self.peers = peers

    @endpoint
    def peer_value_sync(self) -> int:
        # A sync endpoint blocking on another actor must not deadlock its proc.
        me = current_rank()
        return int(self.peers.slice(**dict(me)).value.call_one().get(timeout=10))

    @endpoint
    async def peer_value_async(self) -> int:
        me = current_rank()
        return int(await self.peers.slice(**dict(me)).value.call_one())

    @endpoint
    def incr_peers(self) -> None:
        self.peers.incr.call().get(timeout=10)

    @endpoint
    def get_on_loop_thread(self) -> str:
        return "unused"


class AsyncCaller(Actor):
    @endpoint
    async def get_blocking(self, peers: ActorMesh[Counter]) -> int:
        # .get() on the trio loop would freeze the proc: it must raise instead.
        return int(peers.value.call().get())


class Producer(Actor):
    @endpoint
    def produce(self, port: Port[int], n: int) -> None:
        base = current_rank().rank * 1000
        for i in range(n):
            port.send(base + i)


class Ported(Actor):
    @endpoint(explicit_response_port=True)
    def answer_later(self, port: Port[str], x: int) -> None:
        threading.Timer(0.01, port.send, args=(f"answer {x}",)).start()


_RELEASE = threading.Event()


class Blocker(Actor):
    """Blocks until a *different* actor in the same proc releases it."""

    @endpoint
    def wait_for_release(self) -> bool:
        return _RELEASE.wait(10)


class Releaser(Actor):
    @endpoint
    def release(self) -> None:
        _RELEASE.set()


class Bad(Actor):
    def __init__(self) -> None:
        raise RuntimeError("init exploded")

    @endpoint
    def never(self) -> None:
        pass


class Exiter(Actor):
    @endpoint
    def exit_sync(self) -> None:
        raise SystemExit(3)

    @endpoint
    def ok(self) -> str:
        return "ok"


class AsyncExiter(Actor):
    @endpoint
    async def exit_async(self) -> None:
        raise KeyboardInterrupt

    @endpoint
    async def ok(self) -> str:
        return "ok"


class TwiceAnswering(Actor):
    @endpoint(explicit_response_port=True)
    def answer(self, port: Port[str]) -> None:
        port.send(f"first {current_rank().rank}")
        port.send("second")


class Shadowed(Actor):
    @endpoint
    def size(self) -> int:
        return 7


class Stoppable(Actor):
    """Has an endpoint named ``stop``, as Monarch's GRPO example's Scorer does."""

    def __init__(self) -> None:
        self.running = True

    @endpoint
    def stop(self) -> str:
        self.running = False
        return "endpoint stop"

    @endpoint
    def is_running(self) -> bool:
        return self.running


class Asker(Actor):
    """Calls a sibling mesh at once, possibly before its procs listen."""

    def __init__(self, peers: ActorMesh[Counter]) -> None:
        self.peers = peers

    @endpoint
    def ask(self) -> list[int]:
        return list(self.peers.value.call().get(timeout=20).values())
