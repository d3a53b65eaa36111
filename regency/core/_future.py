"""Futures that any thread and any event loop can wait on.

A Regency future is resolved exactly once, usually on a runtime's trio thread when a reply
arrives, and can be observed from:

* a plain thread: ``fut.get(timeout=...)`` blocks that thread only;
* trio code: ``await fut``;
* asyncio code (Jupyter): ``await fut``.

The result or exception is cached, so every observer sees the same outcome.
"""

from __future__ import annotations

import _thread
import contextlib
import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

import sniffio
import trio

from ..transports._answering import answering

R = TypeVar("R")
_PENDING = object()

#: Thread ids that run a runtime's trio loop: blocking there would freeze message delivery.
runtime_threads: set[int] = set()

#: ``blocking.wait(fut, timeout)``, when set on a thread, is how that thread waits in
#: ``Future.get`` instead of on a lock: the simulator's lockstep threads hand control back to
#: its loop.
blocking = threading.local()

#: Set when the controller runs inside a Jupyter kernel (``core/_notebook.py``): waits that
#: would block consult it, so an unhandled fault ends the running cell's wait instead of
#: being raised in the kernel's own code. ``before_wait()`` may raise; ``watch(waiter)``
#: tracks an asyncio future awaited on the main thread (returns its forget function).
notebook: Any = None

#: Set by a production runtime (``core/_leader.py``): ``reader(fut, timeout)`` waits for
#: ``fut`` on the calling thread by reading the runtime's inbound connections itself, so the
#: reply wakes this thread directly instead of the loop, which would then wake this thread.
#: Returns False when it cannot (the loop is reading, no connection to lead...): the thread
#: then waits on a lock as before.
reader: Callable[[Future[Any], float | None], bool] | None = None

#: Set with ``reader``: ``with loop_waiting():`` around a wait in which the loop resolves the
#: future (an ``await``), so that connections a thread set aside for its next wait
#: (``Leader.sending``) go back to the loop for its duration.
loop_waiting: Callable[[], contextlib.AbstractContextManager[None]] | None = None


class Future(Generic[R]):
    """The eventual value of a remote call (Monarch's ``Future``)."""

    __slots__ = ("_bell", "_callbacks", "_event", "_exception", "_explain", "_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: Any = _PENDING
        self._exception: BaseException | None = None
        # A lock held while a thread waits in get(); the resolver releases it. Cheaper to wake
        # than threading.Event, which matters on the round-trip path.
        self._event: Any = None
        self._callbacks: list[Callable[[], None]] | None = None  # allocated on first use
        # The doorbell of a thread that waits for this future while it reads sockets
        # (``reader``): resolving rings it, as releasing ``_event`` wakes a lock waiter.
        self._bell: Any = None
        #: Makes the error a timed-out ``get`` raises (a call's: which ranks are late and
        #: what they are doing, core/_introspect.py); None: a plain ``TimeoutError``.
        self._explain: Callable[[float | None], BaseException] | None = None

    # -- resolution (runtime side) -------------------------------------------------------

    def set_result(self, value: R) -> None:
        self._resolve(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._resolve(None, exc)

    def _resolve(self, value: Any, exc: BaseException | None) -> None:
        with self._lock:
            if self._value is not _PENDING or self._exception is not None:  # done()
                return
            self._exception = exc
            self._value = value
            event, callbacks, bell = self._event, self._callbacks, self._bell
            self._callbacks = None
        if event is not None:
            event.release()
        if bell is not None:
            bell.ring()
        if callbacks:
            for callback in callbacks:
                callback()

    def done(self) -> bool:
        return self._value is not _PENDING or self._exception is not None

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once resolved, on the resolving thread (now, if already done)."""
        with self._lock:
            if not self.done():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()

    # -- observation ---------------------------------------------------------------------

    def _outcome(self) -> R:
        if self._exception is not None:
            raise self._exception
        value: R = self._value
        return value

    def get(self, timeout: float | None = None) -> R:
        """Block this thread until resolved; ``TimeoutError`` after ``timeout`` seconds.

        A timeout does not cancel the call: ``get`` may be called again later. How the
        thread waits is the thread's own (``blocking.wait``): on a lock in production, by
        handing the baton back to the loop on a simulator's lockstep thread; the rest of
        this method is the same for both.
        """
        if self._value is _PENDING and self._exception is None:  # not done()
            wait: Callable[[Future[Any], float | None], None] = getattr(
                blocking, "wait", _wait_on_lock
            )
            try:
                if notebook is not None:
                    notebook.before_wait()
                    if notebook.is_main_thread():
                        with notebook.interruptible():
                            wait(self, timeout)
                        return self._outcome()
                wait(self, timeout)
            except TimeoutError:
                explain = self._explainer()
                if explain is None or self.done():
                    raise
                raise explain(timeout) from None
        # _outcome(), inlined: get() of a done future is most of a pipelined caller's gets.
        if self._exception is not None:
            raise self._exception
        value: R = self._value
        return value

    def _explainer(self) -> Callable[[float | None], BaseException] | None:
        """What makes this future's timeout error (see ``_explain``)."""
        return self._explain

    def result(self, timeout: float | None = None) -> R:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except TimeoutError:
            raise
        except BaseException as exc:
            return exc
        return None

    def __await__(self) -> Generator[Any, None, R]:
        if self.done():
            # Resolved already: still one turn of the running loop, as trio gives at every
            # await of its own (a checkpoint: a cancel point too). A loop that keeps finding
            # its values ready (``await receiver.recv()`` over a channel that fast senders
            # flood, ``await`` on replies that came meanwhile) would otherwise hold its loop
            # for as long as they keep coming: the runtime's sockets unread, no
            # acknowledgements, no heartbeats, until its senders give the proc up as lost.
            if sniffio.thread_local.name == "trio":  # a trio task, or an endpoint's driver
                yield from trio.lowlevel.checkpoint().__await__()
            else:
                yield  # asyncio's (a task on the runtime's asyncio loop, Jupyter's): sleep(0)
            return self._outcome()
        if notebook is not None:
            notebook.before_wait()
        # A simulation's lockstep thread (the program's main thread) hands the baton back
        # to the simulator while it awaits, as it does while it blocks in get().
        async_wait = getattr(blocking, "async_wait", None)
        try:
            if async_wait is not None:
                yield from async_wait(self).__await__()
            else:
                yield from self.wait_on_loop().__await__()
        except KeyboardInterrupt as exc:
            # An interrupted wait (Jupyter's Interrupt): show the user's line, not ours.
            raise exc.with_traceback(None) from None
        return self._outcome()

    async def wait_on_loop(self) -> None:
        """Wait for resolution on the running trio or asyncio loop (no lockstep)."""
        library = sniffio.current_async_library()
        waiting = loop_waiting
        with contextlib.nullcontext() if waiting is None else waiting():
            if library == "trio":
                await self._wait_trio()
            elif library == "asyncio":
                await self._wait_asyncio()
            else:  # pragma: no cover
                raise RuntimeError(f"cannot await a Regency Future from {library}")

    async def _wait_trio(self) -> None:
        token = trio.lowlevel.current_trio_token()
        thread = threading.get_ident()
        event = trio.Event()

        def wake() -> None:
            if threading.get_ident() == thread:
                event.set()
            else:
                try:
                    token.run_sync_soon(event.set)
                except trio.RunFinishedError:
                    pass

        self.add_done_callback(wake)
        await event.wait()

    async def _wait_asyncio(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            def settle() -> None:
                if not waiter.done():
                    waiter.set_result(None)

            loop.call_soon_threadsafe(settle)

        self.add_done_callback(wake)
        forget = notebook.watch(waiter) if notebook is not None else None
        try:
            await waiter
        finally:
            if forget is not None:
                forget()

    def as_asyncio(self) -> Any:
        """Return an asyncio awaitable (Monarch compatibility)."""
        return self._wait_then_outcome()

    async def _wait_then_outcome(self) -> R:
        return await self

    def __repr__(self) -> str:
        if not self.done():
            return "<Future pending>"
        if self._exception is not None:
            return f"<Future failed: {self._exception!r}>"
        return f"<Future done: {self._value!r}>"


def _wait_on_lock(fut: Future[Any], timeout: float | None) -> None:
    """How a plain thread waits for ``fut``: reading its reply itself where the runtime
    lets it (``reader``), else on a lock the resolver releases."""
    if threading.get_ident() in runtime_threads:
        raise RuntimeError(
            "Future.get() would block the runtime's event loop; "
            "use `await fut` inside async endpoints"
        )
    answering.waited = True  # what this thread sends next answers this (_answering.py)
    lead = reader
    if lead is not None and lead(fut, timeout):
        return
    block(fut, timeout)


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
blocked_in: set[Any] = {_wait_on_lock.__code__, block.__code__}


def resolved(value: R) -> Future[R]:
    fut: Future[R] = Future()
    fut.set_result(value)
    return fut
