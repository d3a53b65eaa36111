"""Futures that any thread and any event loop can wait on.

A Regency future is resolved exactly once, usually on a runtime's trio thread when a reply
arrives, and can be observed from:

* a plain thread: ``fut.get(timeout=...)`` blocks that thread only;
* trio code: ``await fut``;
* asyncio code (Jupyter): ``await fut``.

The result or exception is cached, so every observer sees the same outcome.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

import sniffio
import trio

from ._waiting import here as _here
from ._waiting import served as _served

R = TypeVar("R")
_PENDING = object()


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
        thread waits is its waiter's (``core/_waiting.py``): reading its reply itself or on
        a lock in production, by handing the baton back to the loop on a simulator's
        lockstep thread; the rest of this method is the same for all.
        """
        if self._value is _PENDING and self._exception is None:  # not done()
            waiter = _here.waiter or _served.waiter
            try:
                notebook = _served.notebook
                if notebook is not None:
                    notebook.before_wait()
                    if notebook.is_main_thread():
                        with notebook.interruptible():
                            waiter.wait(self, timeout)
                        return self._outcome()
                waiter.wait(self, timeout)
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
        notebook = _served.notebook
        if notebook is not None:
            notebook.before_wait()
        try:
            yield from (_here.waiter or _served.waiter).wait_async(self).__await__()
        except KeyboardInterrupt as exc:
            # An interrupted wait (Jupyter's Interrupt): show the user's line, not ours.
            raise exc.with_traceback(None) from None
        return self._outcome()

    async def wait_on_loop(self) -> None:
        """Wait for resolution on the running trio or asyncio loop (no lockstep)."""
        library = sniffio.current_async_library()
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

            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:
                pass  # the loop has closed (asyncio.run ended by Ctrl-C): nobody waits

        self.add_done_callback(wake)
        notebook = _served.notebook
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


def resolved(value: R) -> Future[R]:
    fut: Future[R] = Future()
    fut.set_result(value)
    return fut
