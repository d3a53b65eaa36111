"""Periodic work of a runtime (heartbeats, the watchdog), behind one injected interface.

Production runs each periodic job as a loop of ``trio.sleep(interval)`` and a call
(:class:`TrioTicker`). The simulator runs every periodic job of a cluster from one scheduler
(``regency.sim._ticker.SimTicker``) that can skip idle stretches of virtual time: while nothing
but heartbeats happen, their outcome is known, so hours of virtual time need not cost one event
per proc per second. The jobs themselves, what a tick does, are the same code in both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import trio

#: What a tick does, given the time; returning False ends the job.
Tick = Callable[[float], "bool | None"]


class Ticker(Protocol):
    async def every(
        self,
        interval: Callable[[], float],
        tick: Tick,
        *,
        owner: Any,
        kind: str,
        target: str | None = None,
    ) -> None:
        """Call ``tick(now)`` every ``interval()`` seconds until it returns False (or the
        calling task is cancelled). ``owner`` is the runtime the job belongs to, ``kind``
        names the job (``"heartbeat"`` to ``target``, ``"watchdog"``); a simulator uses them
        to know what a skipped tick would have done."""
        ...


class TrioTicker:
    """Production: a loop of sleeps, one per job."""

    async def every(
        self,
        interval: Callable[[], float],
        tick: Tick,
        *,
        owner: Any,
        kind: str,
        target: str | None = None,
    ) -> None:
        while True:
            await trio.sleep(interval())
            if tick(trio.current_time()) is False:
                return
