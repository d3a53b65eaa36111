"""Where an actor's blocking code runs: the executor a runtime is given.

An actor with a sync endpoint (or none) gets an *actor thread* that pops its mailbox and runs
its code (:meth:`regency.core._mailbox.ActorCell._thread_main`); its async endpoints run on the
runtime's trio loop while the thread waits. The mailbox code is the same in production and in
the simulator; only the primitives it blocks with come from the executor:

* :class:`ThreadExecutor` (production): a dedicated OS thread per actor, a
  ``queue.SimpleQueue`` mailbox, ``trio.from_thread`` to reach the loop;
* ``regency.sim._lockstep.LockstepExecutor``: the same thread code on threads that take turns
  with the simulation's loop, so a simulated run executes, line for line, what production runs.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from ._waiting import bind

if TYPE_CHECKING:
    from ._leader import Leader
    from ._runtime import Runtime

T = TypeVar("T")


class Mailbox(Protocol):
    """An actor's queue: ``put`` on the loop, ``get`` (blocking) on the actor thread."""

    def put(self, item: Any) -> None: ...

    def get(self) -> Any: ...

    def get_nowait(self) -> Any:
        """Raises ``queue.Empty`` when there is nothing."""
        ...

    def qsize(self) -> int:
        """How many items wait (introspection's mailbox depth)."""
        ...


class Executor(Protocol):
    """The blocking primitives of actor threads (see the module docstring)."""

    #: Whether its threads run beside the loop as the operating system schedules them
    #: (production): work that would hold the loop long (unpickling an actor's class, whose
    #: modules may import torch) then goes to a thread, and an idle actor may spin for its
    #: next call. False: they take turns with the loop (the simulator's lockstep threads).
    runs_freely: bool

    def start_thread(self, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` (an actor's mailbox loop) on a thread of its own. Called on the loop."""
        ...

    def mailbox(self) -> Mailbox: ...

    def to_loop(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """From an actor thread: run async ``fn(*args)`` on the loop; block until it returns.
        Raises ``trio.RunFinishedError`` once the loop is gone."""
        ...

    def to_loop_sync(self, fn: Callable[[], T]) -> T:
        """From an actor thread: run ``fn`` on the loop and block until it returns."""
        ...

    def run_bounded(self, fn: Callable[[], None], timeout: float) -> bool:
        """From an actor thread: run ``fn`` on another thread for at most ``timeout``
        seconds; False if it had not finished by then (it is abandoned)."""
        ...

    async def run(self, fn: Callable[[], T]) -> T:
        """From the loop: run blocking ``fn`` off the loop; cancelling abandons it."""
        ...

    def join_threads(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for every actor thread to end (after the
        runtime abandoned their mailboxes); False if some still run."""
        ...


class ThreadExecutor:
    """Production: real threads, real blocking."""

    runs_freely = True

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        #: The actor threads started and not yet collected (a finished thread drops out).
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    def start_thread(self, fn: Callable[[], None], name: str) -> None:
        waiter = self._rt.waiter

        def main() -> None:
            bind(waiter)  # it waits as its runtime's threads do (core/_waiting.py)
            fn()

        thread = threading.Thread(target=main, name=name, daemon=True)
        self._threads.add(thread)
        thread.start()

    def join_threads(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds in all for every actor thread to end (after the
        runtime abandoned their mailboxes); False if some still run. A proc calls this
        before it finalizes: an actor thread still running Python code when the interpreter
        finalizes can cost module-level ``__del__`` methods their run (seen 1 exit in 5)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads if t is not threading.current_thread())

    def mailbox(self) -> Mailbox:
        leader: Leader | None = self._rt.leader
        if leader is None:
            return queue.SimpleQueue()
        # Its get() reads the proc's sockets while empty (core/_leader.py): no hop.
        return leader.mailbox()

    def to_loop(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self._rt.token)

    def to_loop_sync(self, fn: Callable[[], T]) -> T:
        return trio.from_thread.run_sync(fn, trio_token=self._rt.token)

    def run_bounded(self, fn: Callable[[], None], timeout: float) -> bool:
        worker = threading.Thread(target=fn, daemon=True)
        worker.start()
        worker.join(timeout)
        return not worker.is_alive()

    async def run(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
