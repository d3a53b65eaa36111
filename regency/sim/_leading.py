"""Threads that read their own replies, in a simulation: production's leader, lockstep I/O.

A production thread that waits for a reply takes over reading its runtime's connections
(``core/_leader.py``, the ``Leader``): it leads them, polls them and a doorbell, reads what
comes, and gives them back or sets them aside for its next wait, which the loop reclaims if
no thread comes. The simulator runs that very code. Only its I/O differs, injected as the
leader's :class:`~regency.core._leader.Polling`:

* the connections are the simulated network's (:class:`~regency.sim._network.SimConnection`
  implements the transports' ``ThreadReadable`` seam with the same baton state machine as
  the sockets, ``transports/_baton.py``): a frame for a connection a thread leads or set
  aside waits in it, unread, until that thread reads it or the loop takes it back;
* a poll gives the lockstep baton back to the simulation's loop until one of the polled
  connections has something to read, the doorbell rings, or the timeout passes, in virtual
  time (:class:`SimPoller`);
* the doorbell is a flag (:class:`SimBell`), and a thread never spins.

So a simulated run interleaves leads, holds, reclaims and the loop's reads in an order drawn
from its seed, and replays it.
"""

from __future__ import annotations

import itertools
import select
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..core._future import Future
from ..core._leader import Leader, LeadingMailbox, _rest_nowhere
from ..core._waiting import here

#: Descriptors for the simulation's pollable things (never real ones: far above any).
_fds = itertools.count(1 << 40)


def new_fd() -> int:
    return next(_fds)


class Pollable(Protocol):
    def ready(self) -> bool: ...

    def watch(self, wake: Future[None]) -> None: ...

    def unwatch(self, wake: Future[None]) -> None: ...


#: What each simulated descriptor stands for (a connection's end, a doorbell).
_pollables: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def register(fd: int, pollable: Pollable) -> None:
    _pollables[fd] = pollable


class Watched:
    """A pollable's waiting pollers, woken when it becomes ready."""

    __slots__ = ("_wakes",)

    def __init__(self) -> None:
        self._wakes: list[Future[None]] = []

    def watch(self, wake: Future[None]) -> None:
        self._wakes.append(wake)

    def unwatch(self, wake: Future[None]) -> None:
        try:
            self._wakes.remove(wake)
        except ValueError:
            pass

    def wake(self) -> None:
        wakes, self._wakes = self._wakes, []
        for wake in wakes:
            wake.set_result(None)


class SimBell:
    """A lockstep thread's doorbell: rung by whoever resolves what it waits for."""

    __slots__ = ("__weakref__", "_watched", "fd", "owner", "rung")

    def __init__(self) -> None:
        self.fd = new_fd()
        self.owner = threading.get_ident()
        self.rung = False
        self._watched = Watched()
        register(self.fd, self)

    def ring(self) -> None:
        if threading.get_ident() != self.owner:  # the owner is awake: it checks the future
            self.rung = True
            self._watched.wake()

    def drain(self) -> None:
        self.rung = False

    def ready(self) -> bool:
        return self.rung

    def watch(self, wake: Future[None]) -> None:
        self._watched.watch(wake)

    def unwatch(self, wake: Future[None]) -> None:
        self._watched.unwatch(wake)


class SimPoller:
    """``select.poll`` over simulated descriptors: a wait hands the lockstep baton back."""

    def __init__(self, block: Callable[[Future[Any], float | None], None]) -> None:
        self._block = block
        self._polled: dict[int, Pollable] = {}

    def register(self, fd: int, mask: int = select.POLLIN) -> None:
        pollable = _pollables.get(fd)
        if pollable is None:
            raise ValueError(f"descriptor {fd} is not one of the simulation's")
        self._polled[fd] = pollable

    def unregister(self, fd: int) -> None:
        del self._polled[fd]

    def _ready(self) -> list[tuple[int, int]]:
        return [(fd, select.POLLIN) for fd, pollable in self._polled.items() if pollable.ready()]

    def poll(self, ms: float | None = None) -> list[tuple[int, int]]:
        ready = self._ready()
        if ready or ms == 0:
            return ready
        wake: Future[None] = Future()
        polled = list(self._polled.values())
        for pollable in polled:
            pollable.watch(wake)
        try:
            self._block(wake, None if ms is None or ms < 0 else ms / 1000)
        except TimeoutError:
            pass
        finally:
            for pollable in polled:
                pollable.unwatch(wake)
        return self._ready()


class LockstepPolling:
    """The leader's I/O in a simulation (see the module docstring)."""

    spins = False
    runs_freely = False

    def __init__(self, lockstep: Any, clock: Callable[[], float]) -> None:
        self._lockstep = lockstep
        self.monotonic = clock

    def _worker(self) -> Any:
        from ._lockstep import current_worker

        worker = current_worker()
        if worker is None:
            raise RuntimeError(
                "a simulated runtime's thread waited outside the simulation's lockstep "
                f"threads ({threading.current_thread().name!r})"
            )
        return worker

    def bell(self) -> SimBell:
        return SimBell()

    def poller(self) -> SimPoller:
        return SimPoller(self.block)

    def block(self, fut: Future[Any], timeout: float | None) -> None:
        self._lockstep._wait(self._worker(), fut, timeout)

    def wait_on_loop(self, fut: Future[Any]) -> Awaitable[None]:
        if self._worker() is self._lockstep._main_worker:
            # The program's own thread: its loop (a notebook's, an ``async def main``)
            # waits by giving the baton back, as its ``get()`` does.
            result: Awaitable[None] = self._lockstep._wait_async(fut)
            return result
        return fut.wait_on_loop()



class LeadingLockstepMailbox(LeadingMailbox):
    """An actor thread's mailbox in a simulation: production's ``LeadingMailbox``, whose
    ``get`` leads the runtime's connections while it is empty (so a call may be read by the
    actor's own thread, as in production), and waits in lockstep for a ``put`` when it
    could lead nothing."""

    __slots__ = ("_filled", "_lockstep")

    def __init__(self, leader: Leader, lockstep: Any) -> None:
        super().__init__(leader)
        self._lockstep = lockstep
        self._filled: Future[None] | None = None

    def put(self, item: Any) -> None:
        super().put(item)
        filled = self._filled
        if filled is not None:
            self._filled = None
            filled.set_result(None)

    def get(self) -> Any:
        if not self._queue.empty():
            return self._get()
        from ._lockstep import current_worker

        worker = current_worker()
        assert worker is not None, "a simulated mailbox is read on its lockstep thread"
        worker.in_mailbox = True
        try:
            while self._queue.empty():
                here.waited = True
                self._lead(self._nonempty, self._arm, None, _rest_nowhere, callee=True)
                if self._queue.empty():
                    filled = self._filled = Future()
                    self._lockstep._wait(worker, filled, None)
        finally:
            worker.in_mailbox = False
        return self._get()
