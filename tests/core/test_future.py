"""Future: resolved once, observed from plain threads, trio and asyncio."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio
import trio.testing

from regency.core import Future, _waiting
from regency.core._future import resolved


def test_the_first_resolution_wins_and_every_observer_sees_it() -> None:
    fut: Future[int] = Future()
    assert not fut.done() and repr(fut) == "<Future pending>"
    fut.set_result(1)
    fut.set_result(2)
    fut.set_exception(ValueError("late"))
    assert fut.get() == 1 and fut.result() == 1 and fut.exception() is None
    assert repr(fut) == "<Future done: 1>"


def test_an_exception_is_raised_to_every_observer() -> None:
    fut: Future[int] = Future()
    fut.set_exception(KeyError("k"))
    for _ in range(2):
        with pytest.raises(KeyError):
            fut.get()
    assert isinstance(fut.exception(), KeyError)
    assert repr(fut).startswith("<Future failed: KeyError")


def test_get_times_out_without_cancelling_and_can_be_called_again() -> None:
    fut: Future[str] = Future()
    with pytest.raises(TimeoutError, match=r"not resolved within 0\.01 s"):
        fut.get(timeout=0.01)
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0)
    fut.set_result("later")
    assert fut.get(timeout=0) == "later"


def test_threads_waiting_are_all_woken_by_a_resolution_from_another_thread() -> None:
    fut: Future[int] = Future()
    started = threading.Barrier(4)
    results: list[int] = []

    def wait() -> None:
        started.wait()
        results.append(fut.get(timeout=10))

    waiters = [threading.Thread(target=wait) for _ in range(3)]
    for t in waiters:
        t.start()
    started.wait()
    fut.set_result(7)
    for t in waiters:
        t.join(10)
    assert results == [7, 7, 7]


def test_callbacks_run_once_on_the_resolving_thread_or_at_once_when_done() -> None:
    fut: Future[int] = Future()
    calls: list[str] = []
    fut.add_done_callback(lambda: calls.append(threading.current_thread().name))
    resolver = threading.Thread(target=fut.set_result, args=(1,), name="resolver")
    resolver.start()
    resolver.join()
    fut.set_result(2)
    fut.add_done_callback(lambda: calls.append("after"))
    assert calls == ["resolver", "after"]


def test_blocking_on_a_runtime_thread_is_refused() -> None:
    fut: Future[int] = Future()
    _waiting.enter_loop()
    try:
        with pytest.raises(RuntimeError, match="would block the runtime's event loop"):
            fut.get()
        assert resolved(3).get() == 3  # a resolved future never blocks, anywhere
    finally:
        _waiting.leave_loop()


def test_await_from_trio_resolved_on_the_loop_and_from_a_thread() -> None:
    async def main() -> list[int]:
        here: Future[int] = Future()
        there: Future[int] = Future()
        got = []
        async with trio.open_nursery() as nursery:

            async def waiter(fut: Future[int]) -> None:
                got.append(await fut)

            nursery.start_soon(waiter, here)
            nursery.start_soon(waiter, there)
            await trio.testing.wait_all_tasks_blocked()
            here.set_result(1)
            await trio.to_thread.run_sync(there.set_result, 2)
        got.append(await resolved(3))
        return got

    assert sorted(trio.run(main)) == [1, 2, 3]


def test_await_from_asyncio_resolved_from_a_thread() -> None:
    async def main() -> int:
        fut: Future[int] = Future()
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: threading.Thread(target=fut.set_result, args=(5,)).start())
        value = await fut
        again = await fut.as_asyncio()
        return value + again

    assert asyncio.run(main()) == 10


def test_resolving_after_the_awaiting_asyncio_loop_closed_raises_nothing() -> None:
    # Ctrl-C in ``asyncio.run(main())`` while main awaits a call: the loop closes with the
    # wait pending, and the runtime fails the call later, from its own thread.
    fut: Future[int] = Future()
    loop = asyncio.new_event_loop()
    task = loop.create_task(fut.wait_on_loop())
    loop.run_until_complete(asyncio.sleep(0))
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        loop.run_until_complete(task)
    loop.close()
    fut.set_exception(RuntimeError("the runtime stopped"))  # the call fails: wakes nobody
    assert isinstance(fut.exception(), RuntimeError)


def test_await_raises_the_exception() -> None:
    async def main() -> None:
        fut: Future[int] = Future()
        fut.set_exception(ValueError("nope"))
        await fut

    with pytest.raises(ValueError, match="nope"):
        trio.run(main)
