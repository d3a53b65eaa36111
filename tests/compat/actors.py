"""Monarch-style actors for the compatibility tests (importable by child procs).

They are written the way Monarch code is: asyncio inside async endpoints.
"""

from __future__ import annotations

import asyncio
from typing import Any

import trio

from regency.actor import Actor, Port, concurrent_endpoint, endpoint


class AsyncioWorker(Actor):
    """Uses the asyncio primitives Monarch programs use, in async endpoints."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.cond = asyncio.Condition()
        self.ready = False
        self.background: asyncio.Task[None] | None = None
        self.ticks = 0

    @endpoint
    async def sleep_then(self, seconds: float, value: int) -> int:
        await asyncio.sleep(seconds)
        return value

    @endpoint
    async def gather(self, n: int) -> list[int]:
        async def one(i: int) -> int:
            await asyncio.sleep(0.001 * (n - i))
            return i * i

        return list(await asyncio.gather(*(one(i) for i in range(n))))

    @endpoint
    async def produce_later(self, value: int, delay: float) -> None:
        """A background producer: an actor handles one message at a time, so the consumer
        waits for a task, not for another message (as in Monarch)."""

        async def later() -> None:
            await asyncio.sleep(delay)
            await self.queue.put(value)

        asyncio.create_task(later())  # noqa: RUF006 (the runtime keeps it alive)

    @endpoint
    async def consume(self, timeout: float) -> int:
        return await asyncio.wait_for(self.queue.get(), timeout)

    @endpoint
    async def wait_ready(self) -> str:
        async with self.cond:
            await self.cond.wait_for(lambda: self.ready)
        return "ready"

    @endpoint
    async def set_ready_later(self, delay: float) -> None:
        async def later() -> None:
            await asyncio.sleep(delay)
            async with self.cond:
                self.ready = True
                self.cond.notify_all()

        asyncio.create_task(later())  # noqa: RUF006 (the runtime keeps it alive)

    @endpoint
    async def start_ticker(self) -> None:
        async def tick() -> None:
            while True:
                await asyncio.sleep(0.01)
                self.ticks += 1

        self.background = asyncio.create_task(tick())

    @endpoint
    async def ticks_after(self, seconds: float) -> int:
        before = self.ticks
        await asyncio.sleep(seconds)
        return self.ticks - before

    @endpoint
    async def start_failing_task(self) -> None:
        async def fail() -> None:
            await asyncio.sleep(0)
            raise ValueError("the background task failed on purpose")

        asyncio.create_task(fail(), name="doomed-task")  # noqa: RUF006

    @endpoint
    async def mixed(self) -> float:
        """trio and asyncio in one endpoint."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await trio.sleep(0.01)
        await asyncio.sleep(0.01)
        event = asyncio.Event()
        loop.call_later(0.01, event.set)
        await event.wait()
        return loop.time() - start

    @endpoint
    async def to_thread(self, x: int) -> int:
        return await asyncio.to_thread(lambda: x + 1)

    @endpoint
    async def cancelled_wait(self) -> str:
        try:
            await asyncio.wait_for(asyncio.sleep(10), 0.01)
        except TimeoutError:
            return "timed out"
        return "no timeout"

    @endpoint
    async def raises(self) -> Any:
        await asyncio.sleep(0)
        raise KeyError("from asyncio code")


class Named(Actor):
    """Reports who it is, and logs through Python's logging."""

    @endpoint
    def report(self) -> tuple[str, str, str]:
        import logging
        import sys

        from regency.actor import context, current_actor_name, current_rank

        handler = logging.StreamHandler(sys.stderr)
        logger = logging.getLogger("compat.named")
        logger.addHandler(handler)
        logger.error("hello from an actor")
        logger.removeHandler(handler)
        return str(context().actor_instance), current_actor_name(), str(current_rank())

    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()


class Finalized(Actor):
    """Leaves a module-level object whose ``__del__`` writes a file when the proc exits."""

    @endpoint
    def arm(self, path: str) -> int:
        import os

        global _witness
        _witness = _Witness(path)
        return os.getpid()


class _Witness:
    def __init__(self, path: str) -> None:
        # Opened now: ``open`` itself is gone by the time finalization reaches __del__.
        self.file = open(path, "w")  # noqa: SIM115

    def __del__(self) -> None:
        self.file.write("finalized")
        self.file.close()


_witness: _Witness | None = None


class Interpreter(Actor):
    @endpoint
    def executable(self) -> str:
        import sys

        return sys.executable


class Doomed(Actor):
    @endpoint
    def die(self) -> None:
        import os

        os._exit(3)


class WaitingOwner(Actor):
    """Awaits news of its child's death inside an endpoint, as Monarch allows: the owner's
    ``__supervise__`` runs at the endpoint's next await point, not after it returns."""

    def __init__(self) -> None:
        self.heard: asyncio.Event | None = None
        self.failures: list[str] = []

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(str(failure))
        if self.heard is not None:
            self.heard.set()
        return True

    @endpoint
    async def spawn_child_and_wait_for_its_death(self) -> list[str]:
        from regency.actor import this_host

        self.heard = asyncio.Event()
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        child = procs.spawn("doomed", Doomed)
        child.die.broadcast()
        await asyncio.wait_for(self.heard.wait(), 30)
        return self.failures


class UnhandlingOwner(Actor):
    """Monarch's ``test_supervise_callback_unhandled``/``_raising``: an owner whose
    ``__supervise__`` does not handle its child's death (returns False, or raises) while an
    endpoint of it is suspended long after the death: the owner fails at that await point,
    and the endpoint's caller gets its death, not a reply 60 s later."""

    SUPERVISE_MESSAGE = "the owner's handler gave up on purpose"

    def __init__(self, raises: bool) -> None:
        self.raises = raises
        self.cleaned_up = False

    def __supervise__(self, failure: Any) -> bool:
        if self.raises:
            raise RuntimeError(self.SUPERVISE_MESSAGE)
        return False

    @endpoint
    async def spawn_child_and_outlive_it(self, sleep: float) -> str:
        from regency.actor import SupervisionError, this_host

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        child = procs.spawn("doomed", Doomed)
        try:
            await child.die.call()
        except SupervisionError:
            pass  # the owner's __supervise__ is told too
        await asyncio.sleep(sleep)
        return "outlived"

    @endpoint
    async def alive(self) -> bool:
        return True


class Finisher(Actor):
    """Stops itself when its work is done (Monarch's actor_instance.stop())."""

    def __init__(self) -> None:
        self.done = 0

    @endpoint
    def work(self) -> int:
        self.done += 1
        return self.done

    @endpoint
    def finish(self) -> str:
        from regency.actor import context

        context().actor_instance.stop("work done")
        return "stopping"


class Gate(Actor):
    """Monarch's concurrent-endpoint pattern: a call that waits for a later call."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self.ready = asyncio.Event()
        self.unblock = asyncio.Event()

    def _log(self, line: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    @concurrent_endpoint
    async def wait(self) -> str:
        self.ready.set()
        await self.unblock.wait()
        return "done"

    @endpoint
    async def release_when_ready(self) -> str:
        await self.ready.wait()
        self.unblock.set()
        return "released"

    @concurrent_endpoint(explicit_response_port=True)
    async def hang(self, port: Port[str]) -> None:
        port.send("started")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self._log("hang cancelled")
            raise

    @concurrent_endpoint(explicit_response_port=True)
    async def answer_then_raise(self, port: Port[str]) -> None:
        port.send("answered")
        raise ValueError("after the answer")

    @concurrent_endpoint(explicit_response_port=True)
    async def raise_unanswered(self, port: Port[str]) -> None:
        raise ValueError("explicit boom")

    async def __cleanup__(self, exc: BaseException | None) -> None:
        self._log("cleanup")


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()


class Parent(Actor):
    """Owns a two-rank mesh on procs of its own, and has no ``__supervise__``."""

    def __init__(self) -> None:
        from regency.actor import this_host

        self.children = this_host().spawn_procs(per_host={"a_dim": 2}).spawn("nested", Pid)

    @endpoint
    def kill_child(self, rank: int) -> None:
        import os
        import signal

        os.kill(self.children.slice(a_dim=rank).pid.call_one().get(), signal.SIGKILL)


class FileLogger(Actor):
    """Logs through the root logger to a file, as Monarch's logging test does."""

    def __init__(self, path: str) -> None:
        import logging

        self.handler = logging.FileHandler(path)
        logging.getLogger().addHandler(self.handler)

    @endpoint
    def log(self, level: int, text: str) -> None:
        import logging

        logging.getLogger().log(level, text)
        self.handler.flush()


class Environ(Actor):
    @endpoint
    def get(self, name: str) -> str:
        import os

        return os.environ.get(name, "")


_booted: list[str] = []


def boot_with_actor() -> None:
    """A proc's bootstrap that uses the runtime: spawns an actor on its own proc, calls it."""
    from regency.actor import this_proc

    pid = this_proc().spawn("boot_helper", Pid).pid.call_one().get(30)
    _booted.append(f"sync {pid}")


async def boot_with_actor_async() -> None:
    import asyncio

    from regency.actor import this_proc

    await asyncio.sleep(0)
    pid = await this_proc().spawn("boot_helper", Pid).pid.call_one()
    _booted.append(f"async {pid}")


class Booted(Actor):
    @endpoint
    def booted(self) -> list[str]:
        import os

        return [entry.replace(str(os.getpid()), "self") for entry in _booted]


class Aborter(Actor):
    @endpoint
    def abort(self, reason: str | None) -> str:
        from regency.actor import context

        context().actor_instance.abort(reason)
        return "aborting"


# -- Monarch 0.7's bootstrap tests (test_bootstrap_07.py) ----------------------------------------


class Hello(Actor):
    @endpoint
    def doit(self) -> str:
        return "hello!"


class RankActor(Actor):
    @endpoint
    async def get_rank(self) -> int:
        from regency.actor import context

        rank: int = context().actor_instance.rank.rank
        return rank


class WrapperMarkerActor(Actor):
    """Returns the PID stamped by the wrapper executable."""

    @endpoint
    def get_wrapper_pid(self) -> str:
        import os

        return os.environ.get("PYTHON_WRAPPER_PID", "")

    @endpoint
    def spawn_inner(self) -> WrapperMarkerActor:
        """Spawns a new proc via this_host() to test recursive propagation."""
        from regency.actor import this_host

        return (
            this_host()
            .spawn_procs(per_host={"procs": 1})
            .spawn("inner_marker", WrapperMarkerActor)
        )


class Affinity(Actor):
    @endpoint
    def cpus(self) -> list[int]:
        import os

        return sorted(os.sched_getaffinity(0))
