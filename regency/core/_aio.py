"""asyncio inside async endpoints, on the runtime's own trio loop.

Monarch runs async endpoints on asyncio, so Monarch code (and libraries built on asyncio)
uses ``asyncio.sleep``, ``create_task``, ``gather``, ``wait_for``, ``Queue``, ``Condition``...
Regency's runtime is trio. Each runtime gets one asyncio event loop that runs *on* its trio
loop (trio-asyncio), opened the first time an async endpoint runs, so actors that never use
async endpoints never pay for it. The loop's clock is trio's clock: in the simulator
``asyncio.sleep(3600)`` takes virtual time only, and the asyncio callbacks are scheduled by
trio, so a seed still replays.

An endpoint coroutine is driven by :func:`drive`, a trio coroutine that steps it by hand:
what it yields is either one of trio's traps (passed up to trio unchanged, so trio code keeps
working) or an asyncio future (waited for through the asyncio loop), so one endpoint may mix
both. A bare ``yield`` (``asyncio.sleep(0)``) becomes a trio checkpoint.

The asyncio loop never holds the trio loop: trio-asyncio takes each callback (a task's step,
a ``call_soon``) from a trio memory channel, a checkpoint each, so trio polls the runtime's
sockets (reads, acknowledgements, heartbeats) between any two, however many are ready (a
task looping on ``await asyncio.sleep(0)`` included; tests/core/test_busy_loop.py). What
could hold it is a step that never yields: an await that finds its value ready, which is
why awaiting a resolved Regency Future is still a turn of the loop (``_future.py``).

Tasks an endpoint starts with ``asyncio.create_task`` live on after it returns (as in
Monarch) until the runtime stops; one that fails with nobody retrieving its exception is
reported in the proc's log at once, naming the task, instead of when it is garbage collected.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Coroutine, Generator
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    import asyncio  # imported where used: 20-30 ms of every start, for async endpoints only

log = logging.getLogger("regency.asyncio")


@types.coroutine
def _trio_trap(value: Any) -> Generator[Any, Any, Any]:
    return (yield value)


class AsyncioBridge:
    """One runtime's asyncio loop, running on its trio loop in ``nursery`` once opened."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: trio.Event | None = None

    async def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, opened on first use (concurrent first users share one opening)."""
        if self._loop is not None:
            return self._loop
        if self._opening is None:
            self._opening = trio.Event()
            self._loop = await self._nursery.start(self._run)
            self._opening.set()
        else:
            await self._opening.wait()
        assert self._loop is not None
        return self._loop

    async def _run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        import trio_asyncio  # imported on first use: it costs ~30 ms of cold start

        _keep_stock_asyncio_outside_trio()
        async with trio_asyncio.open_loop() as loop:
            loop.set_exception_handler(_report_loop_error)
            loop.set_task_factory(_reporting_task_factory)
            task_status.started(loop)
            await trio.sleep_forever()


def _keep_stock_asyncio_outside_trio() -> None:
    """Importing trio-asyncio makes ``asyncio.new_event_loop()`` (and so ``asyncio.run``)
    build trio-asyncio loops in every thread of the process, also outside trio, where the
    program (a notebook kernel, a library calling ``asyncio.run``) expects stock asyncio.
    Outside trio, hand those calls back to the policy that was in force before the import
    (a per-thread ``set_event_loop_policy`` still wins); inside trio nothing changes."""
    from trio_asyncio import _loop

    faked = type(_loop._faked_policy)
    if getattr(faked, "policy", None) is None:
        faked.policy = _loop._original_policy


async def drive(coro: Coroutine[Any, Any, Any], bridge: AsyncioBridge) -> Any:
    """Run an endpoint's coroutine to completion in the current trio task, with ``bridge``'s
    asyncio loop as the running loop for it and for the tasks it starts."""
    import trio_asyncio

    loop = await bridge.loop()
    # trio-asyncio finds the running loop in the trio task's context; this task may have
    # been started before the loop existed, so tell it.
    token = trio_asyncio.current_loop.set(loop)
    try:
        to_send: Any = None
        to_throw: BaseException | None = None
        # A trio cancellation that reached the coroutine as asyncio.CancelledError (it was
        # waiting on an asyncio future, where asyncio code expects that type); re-raised as
        # itself if the CancelledError comes back out.
        cancelled: trio.Cancelled | None = None
        while True:
            try:
                if to_throw is not None:
                    exc, to_throw = to_throw, None
                    yielded = coro.throw(exc)
                else:
                    yielded = coro.send(to_send)
            except StopIteration as stop:
                return stop.value
            except BaseException as exc:
                if cancelled is not None and _is_asyncio_cancel(exc):
                    raise cancelled from None
                raise
            to_send = None
            try:
                if getattr(yielded, "_asyncio_future_blocking", None) is not None:
                    yielded._asyncio_future_blocking = False
                    try:
                        to_send = await trio_asyncio.run_aio_future(yielded)
                    except trio.Cancelled as exc:
                        cancelled = exc
                        to_throw = sys.modules["asyncio"].CancelledError()
                elif yielded is None:  # asyncio's bare yield: let others run
                    await trio.lowlevel.checkpoint()
                else:
                    to_send = await _trio_trap(yielded)
            except BaseException as exc:
                to_throw = exc
    finally:
        coro.close()
        trio_asyncio.current_loop.reset(token)


def _is_asyncio_cancel(exc: BaseException) -> bool:
    """``exc`` is asyncio's CancelledError (asyncio is not imported until an endpoint uses
    it: without it, no asyncio future was awaited, so there is no such error)."""
    aio = sys.modules.get("asyncio")
    return aio is not None and isinstance(exc, aio.CancelledError)


def _report_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exc = context.get("exception")
    message = context.get("message", "asyncio error")
    log.error("%s", message, exc_info=exc if isinstance(exc, BaseException) else None)


#: Tasks started on our loops and not yet done. asyncio keeps only weak references to tasks,
#: so a fire-and-forget ``create_task`` (common in Monarch code) could be collected mid-run;
#: here it lives until it finishes.
_running: set[asyncio.Task[Any]] = set()


def _reporting_task_factory(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
) -> asyncio.Task[Any]:
    import asyncio

    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
    _running.add(task)
    task.add_done_callback(_running.discard)
    task.add_done_callback(_report_if_unretrieved)
    return task


def _report_if_unretrieved(task: asyncio.Task[Any]) -> None:
    if task.cancelled() or task._exception is None:
        return

    def check() -> None:
        # ``_log_traceback`` is cleared when someone retrieves the exception (await,
        # .result(), .exception()); whoever awaited the task has had one turn of the loop.
        if getattr(task, "_log_traceback", False):
            task._log_traceback = False  # reported here, not at GC
            exc = task._exception
            log.error(
                "asyncio task %s started by an endpoint failed and nobody awaited it",
                task.get_name(),
                exc_info=exc,
            )

    task.get_loop().call_soon(check)
