"""Blocking user code inside a simulation, run in lockstep with the simulator's loop.

Sync endpoints, and programs in the blocking ``.get()`` style, need threads: they block. In a
simulation a thread running freely next to the trio loop would make the run depend on the
operating system's scheduling. So these threads and the loop take turns holding one baton:
exactly one of them runs at any time, and the loop's virtual clock cannot move while a thread
runs user code. A thread gives the baton back when its job ends or when it waits on a
``Future`` (its waiter, ``core/_waiting.py``, is :class:`LockstepWaiter`); the loop hands it
back, at a deterministic point, when that future resolves.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ..core import _waiting
from ..core._executor import Mailbox
from ..core._future import Future

if TYPE_CHECKING:
    from ..core._runtime import Runtime

T = TypeVar("T")


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
        #: Its job's task was cancelled (its proc died): the loop never hands it the baton
        #: again during the run, as a killed process's threads never run again.
        self.frozen = False
        #: Set by :meth:`Lockstep.close`: every wait raises ``trio.RunFinishedError``.
        self.abandoned = False
        #: Waiting for its actor's next message (no user code on its stack).
        self.in_mailbox = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        lockstep._workers.append(self)

    def _main(self) -> None:
        _here.worker = self
        _waiting.bind(LockstepWaiter(self.lockstep, self))
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
        self._workers: list[_Worker] = []
        self._count = 0
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        #: The program's main thread, once adopted (:meth:`adopt_current_thread`).
        self._main_worker: _Worker | None = None

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

        The simulator runs blocking jobs (a program, a bounded cleanup) through it.
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
            try:
                await job.done.wait()
            except trio.Cancelled:
                worker.frozen = True
                raise
        if job.error is not None:
            raise job.error
        return job.result

    def close(self) -> None:
        """After the run (its loop is gone): let every thread still inside a job unwind, one
        at a time (each wait raises ``trio.RunFinishedError``, as blocking on a finished
        trio run does), then end every thread. A thread of a proc that was killed while it
        ran user code stays blocked for good: a killed process's threads run no ``finally``
        (it is a daemon thread, and holds little)."""
        for worker in self._workers:
            if worker.frozen and not worker.in_mailbox:
                continue
            if worker.job is not None and worker.thread.is_alive() and worker is not self._main_worker:
                worker.abandoned = True
                worker.turn.release()
                self._loop_turn.acquire(timeout=5.0)
        for worker in self._idle:
            worker.job = None
            worker.turn.release()
        self._idle.clear()

    def adopt_current_thread(self) -> Callable[[], None]:
        """Make the calling thread (a program's main thread) a lockstep thread that runs
        between loop turns; return the function that waits for its first turn."""
        worker = _Worker(self, threading.current_thread().name)
        worker.job = _Job(lambda: None)  # a job that never "finishes" while the program runs
        _here.worker = worker
        _waiting.bind(LockstepWaiter(self, worker, main=True))
        self._main_worker = worker

        def wait_for_first_turn() -> None:
            worker.turn.acquire()

        return wait_for_first_turn

    def start_main(self) -> None:
        """On the loop: give the adopted main thread its first turn."""
        worker = self._main_worker
        assert worker is not None and worker.job is not None
        self._hand(worker, worker.job)

    def _wait(self, worker: _Worker, fut: Future[Any], timeout: float | None) -> None:
        """On ``worker``'s lockstep thread: give the baton back until ``fut`` resolves (or
        ``timeout`` virtual seconds pass: ``TimeoutError``)."""
        if worker.abandoned:
            raise trio.RunFinishedError("the simulation has ended")
        if fut.done():
            return
        job = worker.job
        assert job is not None and self._token is not None and self._nursery is not None
        state = {"woken": False}
        token, nursery = self._token, self._nursery

        def resume() -> None:  # on the loop
            if not state["woken"] and not worker.frozen:
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
        if worker.abandoned:
            raise trio.RunFinishedError("the simulation ended while this thread waited")
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


class LockstepWaiter:
    """The waiter of a lockstep thread (``core/_waiting.py``): a wait gives the baton back
    to the simulation's loop until the future resolves. On the program's main thread an
    ``await`` does the same (``main``); on an actor's thread the actor's own loop awaits."""

    serves_any_thread = False
    runs_freely = False

    def __init__(self, lockstep: Lockstep, worker: _Worker, *, main: bool = False) -> None:
        self.lockstep, self.worker, self.main = lockstep, worker, main

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        self.lockstep._wait(self.worker, fut, timeout)

    def wait_async(self, fut: Future[Any]) -> Awaitable[None]:
        if self.main:
            return self.lockstep._wait_async(fut)
        return fut.wait_on_loop()

    def sending(self, send: Callable[[], None]) -> None:
        send()


class _Here(threading.local):
    worker: _Worker | None = None


_here = _Here()


def current_worker() -> _Worker | None:
    """The lockstep thread the caller runs on, if any."""
    return _here.worker


def lockstep_leader(lockstep: Lockstep, rt: Runtime) -> Any:
    """A simulated runtime's waiter (``Environment.waiter``): production's leader on the
    simulation's lockstep I/O (sim/_leading.py)."""
    from ..core._leader import Leader
    from ._leading import LockstepPolling

    return Leader(rt, LockstepPolling(lockstep, rt.env.clock))


class _LockstepMailbox:
    """An actor's mailbox whose ``get`` gives the baton back while it is empty."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[tuple[Any, ...]] = deque()
        self._waiter: Future[None] | None = None

    def put(self, item: tuple[Any, ...]) -> None:  # on the loop
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set_result(None)

    def get(self) -> Any:  # on the actor's lockstep thread
        while not self._items:
            worker = current_worker()
            assert worker is not None, "a lockstep mailbox is read on its lockstep thread"
            waiter = self._waiter = Future()
            worker.in_mailbox = True
            try:
                waiter.get()
            finally:
                worker.in_mailbox = False
        return self._items.popleft()

    def get_nowait(self) -> tuple[Any, ...]:
        if not self._items:
            raise queue.Empty
        return self._items.popleft()

    def qsize(self) -> int:
        return len(self._items)


class LockstepExecutor:
    """The executor of a simulated runtime (see :mod:`regency.core._executor`): the same
    actor-thread code as production, on lockstep threads, so that it runs deterministically
    and virtual time stands still while it runs."""

    def __init__(self, lockstep: Lockstep, rt: Runtime) -> None:
        self._lockstep = lockstep
        self._rt = rt

    def start_thread(self, fn: Callable[[], None], name: str) -> None:
        waiter = self._rt.waiter

        def job() -> None:
            with _waiting.bound(waiter):  # it waits as its runtime's threads do
                fn()

        # The job belongs to the runtime's nursery: when the proc dies, its thread freezes.
        self._rt.nursery.start_soon(self._lockstep.run, job, name=name)

    def mailbox(self) -> Mailbox:
        leader = self._rt.leader
        if leader is None:
            return _LockstepMailbox()
        from ._leading import LeadingLockstepMailbox

        # Its get() leads the runtime's connections while empty, as production's does.
        return LeadingLockstepMailbox(leader, self._lockstep)

    def _submit(self, fn: Callable[[], Any], fut: Future[Any]) -> None:
        """Run ``fn`` on the loop, then resolve ``fut``, in the calling thread's context."""
        context = contextvars.copy_context()
        token = self._lockstep._token
        assert token is not None

        def on_loop() -> None:
            try:
                context.run(fn)
            except BaseException as exc:  # pragma: no cover - fn settles fut itself
                fut.set_exception(exc)

        token.run_sync_soon(on_loop)

    def to_loop(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        fut: Future[T] = Future()
        rt = self._rt

        async def task() -> None:
            try:
                result = await fn(*args)
            except trio.Cancelled:
                raise  # the proc is going away: its thread stays frozen
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        def start() -> None:
            try:
                rt.nursery.start_soon(task)
            except RuntimeError:  # its nursery has closed: the proc is gone
                pass

        self._submit(start, fut)
        return fut.get()

    def to_loop_sync(self, fn: Callable[[], T]) -> T:
        fut: Future[T] = Future()

        def call() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

        self._submit(call, fut)
        return fut.get()

    def run_bounded(self, fn: Callable[[], None], timeout: float) -> bool:
        done: Future[None] = Future()

        async def job() -> None:
            try:
                await self._lockstep.run(fn)
            finally:
                done.set_result(None)

        self._submit(lambda: self._rt.nursery.start_soon(job), done)
        try:
            done.get(timeout)
        except TimeoutError:
            return False
        return True

    async def run(self, fn: Callable[[], T]) -> T:
        result: T = await self._lockstep.run(fn)
        return result

    runs_freely = False

    def join_threads(self, timeout: float) -> bool:
        return True  # its threads take turns with the loop: none runs while this does
