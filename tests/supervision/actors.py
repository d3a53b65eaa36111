"""Actors for the supervision tests (importable by child procs)."""

from __future__ import annotations

import ctypes
import os
import time

import trio

from regency.actor import Actor, ActorMesh, MeshFailure, ProcMesh, current_rank, endpoint, this_host

_CLEANUPS: list[str] = []


class Worker(Actor):
    def __init__(self, fail_init: bool = False) -> None:
        if fail_init:
            raise ValueError("worker refused to start")
        self.calls = 0

    @endpoint
    def work(self, seconds: float = 0.0) -> int:
        self.calls += 1
        if seconds:
            time.sleep(seconds)
        return current_rank().rank

    @endpoint
    def explode_if(self, rank: int) -> None:
        if current_rank().rank == rank:
            raise RuntimeError(f"rank {rank} exploded")

    @endpoint
    def exit_process(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def segfault(self) -> None:
        ctypes.string_at(0)

    @endpoint
    async def hang_the_loop(self, seconds: float) -> None:
        time.sleep(seconds)  # blocks the proc's trio loop: its heartbeats stop

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Manager(Actor):
    """Owns a worker mesh on its own procs; handles, ignores or fails on their failures."""

    def __init__(self, policy: str, procs: int = 2) -> None:
        self.policy = policy
        self.procs = this_host().spawn_procs(per_host={"w": procs})
        self.workers = self.procs.spawn("workers", Worker)
        self.seen: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(f"{failure.mesh_name}:{list(failure.ranks)}:{failure.cause.summary}")
        if self.policy == "raise":
            raise RuntimeError("supervisor gave up")
        if self.policy == "exit":
            raise SystemExit(5)
        return self.policy == "handle"

    @endpoint
    def break_worker(self, rank: int) -> None:
        self.workers.explode_if.broadcast(rank)

    @endpoint
    def seen_failures(self) -> list[str]:
        return self.seen

    @endpoint
    def worker_ranks(self) -> list[int]:
        return list(self.workers.work.call().get(timeout=20).values())

    @endpoint
    def worker_pids(self) -> list[int]:
        return list(self.workers.pid.call().get(timeout=20).values())


class AsyncManager(Actor):
    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"w": 1})
        self.workers = self.procs.spawn("aworkers", Worker)
        self.seen: list[int] = []

    async def __supervise__(self, failure: MeshFailure) -> bool:
        await trio.sleep(0)
        self.seen.extend(failure.ranks)
        return True

    @endpoint
    async def break_worker(self) -> None:
        self.workers.explode_if.broadcast(0)

    @endpoint
    async def seen_failures(self) -> list[int]:
        return self.seen


class Level(Actor):
    """A chain of owners: each level spawns its own proc and the next level on it."""

    def __init__(self, depth: int) -> None:
        self.child: ActorMesh[Level] | None = None
        if depth > 1:
            procs: ProcMesh = this_host().spawn_procs(per_host={"p": 1})
            self.child = procs.spawn(f"level{depth - 1}", Level, depth - 1)

    @endpoint
    def fail_at_bottom(self) -> None:
        if self.child is None:
            raise RuntimeError("the bottom level failed")
        self.child.fail_at_bottom.broadcast()

    @endpoint
    def pids(self) -> list[int]:
        below = self.child.pids.call_one().get(timeout=20) if self.child is not None else []
        return [os.getpid(), *below]


class Tidy(Actor):
    """Records __cleanup__ calls in a file, since the proc may be gone by the time we look."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.path, "a") as f:
            f.write(f"cleanup {current_rank().rank} {type(exc).__name__ if exc else None}\n")

    @endpoint
    def fail(self) -> None:
        raise KeyError("tidy failure")

    @endpoint
    def ok(self) -> str:
        return "ok"


