"""Background tasks owned by one actor, for the job helpers' actors (port forwarding, shell).

An endpoint that starts work which outlives it (a listener, a relay per connection) needs a
nursery that outlives the endpoint: :class:`Background` opens one on the proc's runtime
nursery the first time it is used, and its ``aclose`` (called from ``__cleanup__``) cancels
every task in it and waits for them to finish, so nothing an actor started survives its stop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..core._controller import current_runtime

log = logging.getLogger("regency.job")


class Background:
    """A nursery for one actor's background tasks (see the module docstring)."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._closed = trio.Event()
        self._closing = False

    async def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the background until it returns or :meth:`aclose`."""
        if self._closing:
            raise RuntimeError("this actor is stopping: no new background tasks")
        if self._nursery is None:
            self._nursery = await current_runtime().nursery.start(self._hold)
        self._nursery.start_soon(_logged, fn, args, name=fn)

    async def _hold(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(nursery)
                await trio.sleep_forever()
        finally:
            self._closed.set()

    async def aclose(self) -> None:
        """Cancel every background task and wait until they have all finished."""
        self._closing = True
        if self._nursery is None:
            return
        self._nursery.cancel_scope.cancel()
        await self._closed.wait()


async def _logged(fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
    # A failing task is reported and ends alone: it must not take the proc's runtime with it.
    try:
        await fn(*args)
    except Exception:
        log.exception("background task %s failed", getattr(fn, "__qualname__", fn))
