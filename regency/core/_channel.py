"""Ports and channels: a picklable :class:`Port` any actor can send to, and the
receiving end (:class:`PortReceiver`) in the process that opened it."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Generator
from typing import Any, Generic, TypeVar

from . import _messages as M
from ._controller import current_runtime
from ._errors import ActorError, RemoteFailure
from ._future import Future
from ._ports import PortBase
from ._runtime import Runtime

T = TypeVar("T")


class Port(Generic[T]):
    """Where replies go: picklable, so it can be passed to any actor; in-order delivery.

    A reply port (explicit response port) carries the rank it answers for; a channel port
    (``Channel.open``) stamps each value with the sender's rank, which ``open_ranked`` shows.
    """

    __slots__ = ("_index", "_ref")

    def __init__(self, ref: tuple[str, int] | None, index: int | None = None) -> None:
        self._ref, self._index = ref, index

    def __reduce__(self) -> Any:
        return (Port, (self._ref, self._index))

    def _rank(self) -> int:
        if self._index is not None:
            return self._index
        from ._context import current

        ctx = current.get()
        return ctx.actor_instance.rank.rank if ctx is not None else 0

    def send(self, value: T) -> None:
        if self._ref is not None:
            current_runtime().send_port(self._ref, self._rank(), M.OK, value)

    def exception(self, exc: BaseException) -> None:
        if self._ref is not None:
            failure = RemoteFailure.capture(exc)
            current_runtime().send_port(self._ref, self._rank(), M.ERROR, failure)

    def __repr__(self) -> str:
        return f"<Port {self._ref}>"


class _Inbox(PortBase):
    dests: frozenset[str] = frozenset()

    def __init__(self, once: bool, ranked: bool) -> None:
        self.values: deque[tuple[int, int, Any]] = deque()
        self.waiters: deque[Future[Any]] = deque()
        self.once, self.ranked = once, ranked
        self.done = False

    def deliver(self, index: int, status: int, value: Any) -> bool:
        item = (index, status, value)
        if self.waiters:
            self._settle(self.waiters.popleft(), item)
        else:
            self.values.append(item)
        self.done = self.once
        return self.once

    def _settle(self, fut: Future[Any], item: tuple[int, int, Any]) -> None:
        index, status, value = item
        if status == M.OK:
            fut.set_result((index, value) if self.ranked else value)
        else:
            fut.set_exception(ActorError("sent to a channel", value, index))

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.failure = exc
        for fut in self.waiters:
            fut.set_exception(exc)
        self.waiters.clear()

    failure: BaseException | None = None

    def take(self) -> Future[Any]:
        fut: Future[Any] = _Received()
        if not self.values and self.failure is not None:
            fut.set_exception(self.failure)
        elif self.values:
            self._settle(fut, self.values.popleft())
        else:
            self.waiters.append(fut)
        return fut


#: A receiving loop may take values already queued without a turn of its event loop for at
#: most this long, or this many values, whichever comes first (a cooperative budget, as
#: tokio's): see :class:`_Received`.
BUDGET_S = 0.002
BUDGET_VALUES = 128


class _Budget(threading.local):
    def __init__(self) -> None:
        self.since = 0.0
        self.spent = 0

    def spend(self) -> bool:
        """True to take one more ready value without yielding."""
        if self.spent < BUDGET_VALUES and time.perf_counter() - self.since < BUDGET_S:
            self.spent += 1
            return True
        return False

    def renew(self) -> None:
        self.since, self.spent = time.perf_counter(), 0


_budget = _Budget()


class _Received(Future[T]):
    """What :meth:`PortReceiver.recv` returns. Awaiting a value that is already there takes
    it at once while the loop's budget lasts (``BUDGET_S``, ``BUDGET_VALUES``), and is a
    turn of the loop (``Future.__await__``) once it is spent. A receiver whose senders keep
    it busy thus still lets its proc read, acknowledge and send heartbeats every couple of
    milliseconds, yet does not take a single value per turn of the loop: on a loop whose
    socket readers decode many frames per turn, a receiver that took one value per turn
    fell ever further behind (Monarch's ``grpo_yield.py``: the trainer waited seconds for
    each of its first twenty values)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, T]:
        if self.done() and _budget.spend():
            return self._outcome()
        try:
            return (yield from Future.__await__(self))
        finally:
            _budget.renew()


class PortReceiver(Generic[T]):
    """The receiving end of a channel; lives in the process that opened it."""

    def __init__(self, rt: Runtime, inbox: _Inbox) -> None:
        self._rt, self._inbox = rt, inbox

    def recv(self) -> Future[T]:
        """The next value, in order: ``await recv.recv()`` or ``recv.recv().get()``.

        Awaiting it takes a value already queued at once for a couple of milliseconds at a
        time, then lets the loop turn (see :class:`_Received`), so a receiver that senders
        keep busy still lets its proc read, acknowledge and send heartbeats."""
        if self._rt.on_runtime_thread():  # (an async endpoint, an asyncio task): no hop
            return self._inbox.take()
        fut: Future[T] = Future()

        def take() -> None:
            inner = self._inbox.take()
            inner.add_done_callback(lambda: _copy(inner, fut))

        self._rt.call_soon(take)
        return fut


def _copy(src: Future[Any], dst: Future[Any]) -> None:
    try:
        dst.set_result(src.get())
    except BaseException as exc:
        dst.set_exception(exc)


class Channel(Generic[T]):
    """``port, receiver = Channel[int].open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[T], PortReceiver[T]]:
        rt = current_runtime()
        inbox = _Inbox(once, ranked=False)
        return Port(rt.open_port(inbox)), PortReceiver(rt, inbox)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[T], PortReceiver[tuple[int, T]]]:
        rt = current_runtime()
        inbox = _Inbox(once, ranked=True)
        return Port(rt.open_port(inbox)), PortReceiver(rt, inbox)
