"""How a thread waits for a :class:`~regency.core._future.Future`: the waiting seam.

A future knows nothing of the world it waits in. Every wait goes through a :class:`Waiter`,
and the world decides which: the :class:`~regency.core._environment.Environment` gives each
runtime one (``Environment.waiter``):

* production, ``thread_reads`` on: the runtime's :class:`~regency.core._leader.Leader`, a
  thread that waits reads its reply off the sockets itself, spinning first where that pays
  (``core/_spin.py``);
* production, ``thread_reads`` off: :class:`LockWaiter`, a lock the resolver releases;
* the simulator: its lockstep waiter (``regency.sim._lockstep``), which hands the baton back
  to the simulation's loop until the future resolves, in virtual time.

Which waiter a thread uses:

* a thread a runtime started (an actor thread, a simulator's lockstep thread, the runtime's
  own loop thread) is *bound* to its runtime's waiter (:func:`bind`); the loop thread's
  refuses to block (:class:`LoopThread`);
* any other thread (a program's, a notebook's) uses the waiter of the runtime that serves
  this process (:func:`serve`: the first runtime whose waiter serves any thread, the
  controller's; a simulator's lockstep waiter serves only its own threads); with none, a
  lock.

A wait also leaves a mark on its thread (``here.waited``): the next frame the thread sends
answers what it waited for, and the outbox passes that to the transport, which sends it at
once instead of batching it with a burst (``send_nowait(frame, answer)``;
transports/_sockets.py's burst window).
"""

from __future__ import annotations

import _thread
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._future import Future


@runtime_checkable
class Waiter(Protocol):
    """How threads wait for futures. Implementations: :class:`LockWaiter`,
    :class:`LoopThread`, ``core._leader.Leader``, ``sim._lockstep.LockstepWaiter``; each
    passes ``tests/core/test_waiting.py``'s conformance check (``regency.testing``)."""

    #: Whether threads the runtime did not start may use it (:func:`serve`).
    serves_any_thread: bool
    #: Whether a thread blocked in the operating system stalls nothing but itself (False
    #: for a simulator's lockstep thread: the simulation waits for it to give its turn
    #: back, so an event loop this thread drives must wait through :meth:`wait` too).
    runs_freely: bool

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        """Block the calling thread until ``fut`` is done, or raise ``TimeoutError`` after
        ``timeout`` seconds (of the waiter's clock). Returns at once if ``fut`` is done."""
        ...

    def wait_async(self, fut: Future[Any]) -> Awaitable[None]:
        """``await fut`` on this thread's running event loop (trio's or asyncio's), which
        resolves it (the leader gives back the connections it set aside meanwhile)."""
        ...

    def sending(self, send: Callable[[], None]) -> None:
        """Run ``send()``, a call's fan-out to several ranks, whose replies this thread is
        about to wait for (the leader reads the first ones as they come)."""
        ...


class _Thread(threading.local):
    #: The waiter this thread is bound to (None: the process's, :func:`serve`).
    waiter: Waiter | None = None
    #: Runtimes whose loop this thread runs (a simulator runs them all on one).
    loops = 0
    #: The waiter it was bound to before it ran a loop.
    before_loop: Waiter | None = None
    #: This thread waited for a message since it last sent a frame.
    waited = False


here = _Thread()


class LockWaiter:
    """Waits on a lock the resolver releases; awaits on the running loop."""

    serves_any_thread = True
    runs_freely = True

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        here.waited = True
        block(fut, timeout)

    def wait_async(self, fut: Future[Any]) -> Awaitable[None]:
        return fut.wait_on_loop()

    def sending(self, send: Callable[[], None]) -> None:
        send()


class LoopThread:
    """The waiter of a runtime's own trio thread: blocking there would freeze the runtime's
    message delivery, so ``wait`` refuses with a clear error (``await`` the future there)."""

    serves_any_thread = False
    runs_freely = True

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        if fut.done():
            return
        raise RuntimeError(
            "Future.get() would block the runtime's event loop; "
            "use `await fut` inside async endpoints"
        )

    def wait_async(self, fut: Future[Any]) -> Awaitable[None]:
        return fut.wait_on_loop()

    def sending(self, send: Callable[[], None]) -> None:
        send()


LOCK = LockWaiter()
LOOP_THREAD = LoopThread()


class Interrupts(Protocol):
    """What a Jupyter kernel adds to the waits of its main thread (``core/_notebook.py``):
    an unhandled fault ends the running cell's wait instead of surfacing in the kernel's own
    code, and Interrupt ends a blocked wait."""

    def before_wait(self) -> None:
        """At the start of a wait: raise what the running cell has not raised yet."""

    def is_main_thread(self) -> bool: ...

    def interruptible(self) -> contextlib.AbstractContextManager[None]:
        """Around a blocking wait on the main thread: SIGINT raises there."""
        ...

    def watch(self, waiter: Any) -> Callable[[], None] | None:
        """Track an asyncio future the main thread awaits; returns its forget function."""
        ...


class _Served:
    """What the process gives threads no runtime bound: the first runtime whose waiter
    serves any thread sets ``waiter`` while it runs (one per process: the controller's, or
    a proc's); a Jupyter kernel sets ``notebook`` (:func:`in_notebook`)."""

    __slots__ = ("notebook", "waiter")

    def __init__(self) -> None:
        self.waiter: Waiter = LOCK
        self.notebook: Interrupts | None = None


served = _Served()


def serve(waiter: Waiter) -> bool:
    """While a runtime runs: make ``waiter`` the waiter of threads no runtime bound, unless
    another runtime's serves already or it serves only its own threads. Returns whether it
    did (then :func:`unserve` it when the runtime ends)."""
    if not waiter.serves_any_thread or served.waiter is not LOCK:
        return False
    served.waiter = waiter
    return True


def unserve(waiter: Waiter) -> None:
    if served.waiter is waiter:
        served.waiter = LOCK


def in_notebook(interrupts: Interrupts) -> None:
    """Inside a Jupyter kernel: its main thread's waits follow ``interrupts``."""
    served.notebook = interrupts


def bind(waiter: Waiter | None) -> None:
    """Bind the calling thread to ``waiter`` (None: unbind it)."""
    here.waiter = waiter


def current() -> Waiter:
    """The calling thread's waiter."""
    return here.waiter or served.waiter


@contextlib.contextmanager
def bound(waiter: Waiter) -> Iterator[None]:
    """Bind the calling thread to ``waiter`` for the block."""
    before = here.waiter
    here.waiter = waiter
    try:
        yield
    finally:
        here.waiter = before


def enter_loop() -> None:
    """The calling thread starts running a runtime's event loop: it may not block in a wait
    until :func:`leave_loop` (as many times as it entered)."""
    t = here
    if t.loops == 0:
        t.before_loop = t.waiter
        t.waiter = LOOP_THREAD
    t.loops += 1


def leave_loop() -> None:
    t = here
    t.loops -= 1
    if t.loops == 0:
        t.waiter, t.before_loop = t.before_loop, None


def would_block_loop() -> bool:
    """Whether the calling thread runs a runtime's event loop (a blocking wait there would
    freeze it)."""
    return here.loops > 0


def block(fut: Future[Any], timeout: float | None) -> None:
    """Wait for ``fut`` on a lock its resolver releases (``TimeoutError`` after
    ``timeout`` seconds)."""
    with fut._lock:
        if fut._event is None:
            fut._event = _thread.allocate_lock()
            if not fut.done():
                fut._event.acquire()
        event = fut._event
    if not event.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
        raise TimeoutError(f"future not resolved within {timeout} s")
    event.release()  # let every other waiting thread through too


#: The code of the functions in which a thread blocks in ``Future.get`` (a signal handler
#: that may raise only there, ``core/_notebook.py``, checks its frame against these).
blocked_in: set[Any] = {block.__code__, LockWaiter.wait.__code__}
