"""Blocking user code inside a simulation, run in lockstep with the simulator's loop.

Sync endpoints, and programs in the blocking ``.get()`` style, need threads: they block. In a
simulation a thread running freely next to the trio loop would make the run depend on the
operating system's scheduling. So these threads and the loop take turns holding one baton:
exactly one of them runs at any time, and the loop's virtual clock cannot move while a thread
runs user code. A thread gives the baton back when its job ends or when it waits on a
``Future`` (``Future.get`` consults :data:`regency.core._future.blocking`); the loop hands it
back, at a deterministic point, when that future resolves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trio

from ..core._future import Future, blocking


class _Job:
    __slots__ = ("done", "error", "finished", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.done = trio.Event()


class _Worker:
    def __init__(self, lockstep: Lockstep, name: str) -> None:
        self.turn = threading.Semaphore(0)
        self.job: _Job | None = None
        self.lockstep = lockstep
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        blocking.wait = self.lockstep._wait
        blocking.worker = self
        while True:
            self.turn.acquire()
            job = self.job
            if job is None:
                return  # asked to exit
            try:
                job.result = job.fn()
            except BaseException as exc:
                job.error = exc
            job.finished = True
            self.job = None
            self.lockstep._idle.append(self)
            self.lockstep._loop_turn.release()


class Lockstep:
    """The baton between one simulation's trio loop and its user-code threads."""

    def __init__(self) -> None:
        self._loop_turn = threading.Semaphore(0)
        self._idle: list[_Worker] = []
        self._count = 0
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._nursery = nursery

    def _hand(self, worker: _Worker, job: _Job) -> None:
        """On the loop: let ``worker`` run until it finishes ``job`` or waits; the loop (and
        virtual time) stands still meanwhile."""
        worker.turn.release()
        self._loop_turn.acquire()
        if job.finished:
            job.done.set()

    async def run(self, fn: Callable[[], Any]) -> Any:
        """Run blocking ``fn`` on a lockstep thread; its result or exception comes back here.

        This is the runtime's ``sync_runner`` inside a simulation.
        """
        if self._idle:
            worker = self._idle.pop()
        else:
            self._count += 1
            worker = _Worker(self, f"regency-sim-thread-{self._count}")
            worker.thread.start()
        job = _Job(fn)
        worker.job = job
        self._hand(worker, job)
        if not job.finished:
            await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def adopt_current_thread(self) -> Callable[[], None]:
        """Make the calling thread (a program's main thread) a lockstep thread that runs
        between loop turns; return the function that waits for its first turn."""
        worker = _Worker(self, threading.current_thread().name)
        worker.job = _Job(lambda: None)  # a job that never "finishes" while the program runs
        blocking.wait = self._wait
        blocking.async_wait = self._wait_async
        blocking.worker = worker
        self._main_worker = worker

        def wait_for_first_turn() -> None:
            worker.turn.acquire()

        return wait_for_first_turn

    def start_main(self) -> None:
        """On the loop: give the adopted main thread its first turn."""
        worker = self._main_worker
        assert worker.job is not None
        self._hand(worker, worker.job)

    def _wait(self, fut: Future[Any], timeout: float | None) -> None:
        """On a lockstep thread: give the baton back until ``fut`` resolves (or ``timeout``
        virtual seconds pass: ``TimeoutError``)."""
        if fut.done():
            return
        worker: _Worker = blocking.worker
        job = worker.job
        assert job is not None and self._token is not None and self._nursery is not None
        state = {"woken": False}
        token, nursery = self._token, self._nursery

        def resume() -> None:  # on the loop
            if not state["woken"]:
                state["woken"] = True
                self._hand(worker, job)

        fut.add_done_callback(lambda: token.run_sync_soon(resume))
        if timeout is not None:

            async def expire() -> None:
                await trio.sleep(timeout)
                resume()

            token.run_sync_soon(lambda: nursery.start_soon(expire))
        self._loop_turn.release()
        try:
            worker.turn.acquire()
        except BaseException:
            # Interrupted (KeyboardInterrupt in a notebook cell): take the baton back before
            # user code goes on, so the program and the simulation never run at once.
            token.run_sync_soon(resume)
            while True:
                try:
                    worker.turn.acquire()
                    break
                except BaseException:
                    continue
            raise
        if not fut.done():
            raise TimeoutError(f"future not resolved within {timeout} virtual s")

    async def _wait_async(self, fut: Future[Any]) -> None:
        """On the adopted main thread, from asyncio or trio code (``await fut`` in a notebook
        cell or an ``async def main``): give the baton back until ``fut`` resolves, as
        :meth:`_wait` does for ``fut.get()``, without blocking the thread's own loop.

        When ``fut`` resolves the simulator's loop stands still (virtual time too) until this
        thread waits again. A cancelled wait (Jupyter's Interrupt) takes the baton back before
        user code goes on, so the program and the simulation never run at once."""
        if fut.done():
            return
        assert self._token is not None
        token = self._token
        handed: Future[None] = Future()  # resolved on the loop when the baton is ours again
        baton = threading.Event()
        state = {"woken": False}

        def resume() -> None:  # on the loop
            if state["woken"]:
                return
            state["woken"] = True
            baton.set()
            handed.set_result(None)
            self._loop_turn.acquire()  # until this thread waits again

        fut.add_done_callback(lambda: token.run_sync_soon(resume))
        self._loop_turn.release()
        try:
            await handed.wait_on_loop()
        except BaseException:
            if not baton.is_set():
                token.run_sync_soon(resume)
                while not baton.is_set():
                    try:
                        baton.wait()
                    except BaseException:
                        continue  # a second interrupt: the baton must still come back
            raise
