"""A conformance check of the waiting seam (``regency.core._waiting.Waiter``).

Every waiter, production's and the simulator's, keeps the same contract, and
:func:`check_waiter` runs it against one in its own world. The world supplies ``later``:
``later(seconds)`` starts something that resolves a new future with ``seconds`` after that
many of the world's seconds (a call to an actor that sleeps: a reply over real sockets in
production, over the simulated network in virtual time in the simulator). The check runs on
a thread bound to the waiter.

The contract:

* ``wait`` on a done future returns at once;
* ``wait`` returns once the future is resolved, however it was resolved (by the runtime's
  loop, or by a frame the waiting thread read itself), with its outcome intact;
* ``wait(fut, t)`` raises ``TimeoutError`` when ``fut`` is not done within ``t`` seconds,
  leaves ``fut`` pending, and a later wait still sees it resolved;
* futures resolved in another order than they are waited for are all seen;
* ``sending(send)`` runs ``send`` exactly once, on the calling thread, and the replies to
  what it sent are waited for as any other;
* ``Future.get`` on the thread waits through it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..core import _waiting
from ..core._future import Future, resolved

#: Seconds any single wait of the check may take before the world is called broken.
PATIENCE = 60.0


def check_waiter(waiter: _waiting.Waiter, later: Callable[[float], Future[Any]]) -> None:
    """Check ``waiter`` against the contract above (AssertionError naming the broken rule).
    Run it on a thread bound to ``waiter`` (``regency.core._waiting.bound``)."""
    for attribute in ("serves_any_thread", "runs_freely"):
        value = getattr(waiter, attribute, None)
        assert isinstance(value, bool), (
            f"{type(waiter).__name__}.{attribute} must be a bool (got {value!r})"
        )

    done = resolved("ready")
    waiter.wait(done, 0.0)
    assert done.get() == "ready", "a done future keeps its value"

    fut = later(0.05)
    waiter.wait(fut, PATIENCE)
    assert fut.done(), "wait returned before the future was resolved"
    assert fut.get() == 0.05, f"the outcome changed on the way (got {fut.get()!r})"

    slow = later(0.5)
    try:
        waiter.wait(slow, 0.01)
    except TimeoutError:
        assert not slow.done() or slow.get() == 0.5
    else:
        raise AssertionError("wait(fut, 0.01) returned for a future resolved 0.5 s later")
    waiter.wait(slow, PATIENCE)
    assert slow.get() == 0.5, "a wait after a timed-out one sees the future resolved"

    first, second = later(0.2), later(0.01)
    waiter.wait(first, PATIENCE)
    assert second.done() or _wait_done(waiter, second), "a future resolved earlier was lost"
    assert (first.get(), second.get()) == (0.2, 0.01)

    for _ in range(20):  # back to back, as a caller's round trips
        quick = later(0.001)
        waiter.wait(quick, PATIENCE)
        assert quick.get() == 0.001

    sent: list[tuple[int, Future[Any]]] = []
    waiter.sending(lambda: sent.append((threading.get_ident(), later(0.01))))
    assert len(sent) == 1, f"sending ran send {len(sent)} times (expected once)"
    assert sent[0][0] == threading.get_ident(), "sending ran send on another thread"
    waiter.wait(sent[0][1], PATIENCE)
    assert sent[0][1].get() == 0.01

    with _waiting.bound(waiter):
        counted = _Counting(waiter)
        with _waiting.bound(counted):
            assert later(0.01).get(PATIENCE) == 0.01
        assert counted.waits == 1, "Future.get did not wait through the thread's waiter"


def _wait_done(waiter: _waiting.Waiter, fut: Future[Any]) -> bool:
    waiter.wait(fut, PATIENCE)
    return fut.done()


class _Counting:
    """A waiter that counts the waits it passes on."""

    def __init__(self, inner: _waiting.Waiter) -> None:
        self.inner = inner
        self.serves_any_thread = inner.serves_any_thread
        self.runs_freely = inner.runs_freely
        self.waits = 0

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        self.waits += 1
        self.inner.wait(fut, timeout)

    def wait_async(self, fut: Future[Any]) -> Any:
        return self.inner.wait_async(fut)

    def sending(self, send: Callable[[], None]) -> None:
        self.inner.sending(send)
