"""Monarch's ``returns_future``: an ``async def`` that returns a Future, run when observed."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import warnings

import pytest

from regency.actor import Actor, ActorMesh, Future, endpoint, returns_future, this_proc

T = 30
who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@returns_future
async def add(a: int, b: int, log: list[str] | None = None) -> tuple[int, str]:
    if log is not None:
        log.append(threading.current_thread().name)
    await asyncio.sleep(0.001)
    return a + b, who.get()


def test_calling_starts_nothing_and_get_runs_the_body_once() -> None:
    log: list[str] = []
    fut = add(1, 2, log)
    assert isinstance(fut, Future)
    assert log == [] and not fut.done()
    assert "not started" in repr(fut)
    assert fut.get(T) == (3, "nobody")
    assert fut.get(T) == (3, "nobody")  # cached: the body ran once
    assert log == [threading.current_thread().name]  # on the caller's thread


def test_the_body_sees_the_callers_context_variables_at_call_time() -> None:
    token = who.set("caller")
    try:
        fut = add(1, 1)
    finally:
        who.reset(token)
    assert fut.get(T) == (2, "caller")


def test_await_from_asyncio_runs_a_task_that_survives_a_cancelled_await() -> None:
    done: list[int] = []

    @returns_future
    async def slow() -> int:
        await asyncio.sleep(0.05)
        done.append(1)
        return 7

    async def main() -> int:
        fut = slow()
        waiter = asyncio.ensure_future(fut.as_asyncio())
        await asyncio.sleep(0.01)
        waiter.cancel()  # cancels this observer only
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return await fut

    assert asyncio.run(main()) == 7
    assert done == [1]


def test_a_timed_out_get_cancels_the_body_and_every_observer_sees_the_timeout() -> None:
    cleaned: list[str] = []

    @returns_future
    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append("cleanup ran")

    fut = forever()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.05 s"):
        fut.get(0.05)
    assert cleaned == ["cleanup ran"]
    with pytest.raises(TimeoutError):
        fut.get(T)  # the first outcome stands


def test_exceptions_reach_every_observer() -> None:
    @returns_future
    async def fails() -> None:
        raise KeyError("nope")

    fut = fails()
    with pytest.raises(KeyError, match="nope"):
        fut.get(T)
    with pytest.raises(KeyError):
        asyncio.run(_await(fut))


async def _await(fut: Future[object]) -> object:
    return await fut


def test_an_unobserved_future_never_runs_its_body_and_warns_nothing() -> None:
    log: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fut = add(1, 2, log)
        del fut
        gc.collect()
    assert log == []


def test_get_inside_a_running_loop_runs_the_body_on_a_helper_thread() -> None:
    log: list[str] = []

    async def main() -> tuple[int, str]:
        return add(2, 3, log).get(T)

    assert asyncio.run(main()) == (5, "nobody")
    assert log and log[0] != threading.current_thread().name


def test_get_inside_a_body_it_drives_is_refused() -> None:
    @returns_future
    async def inner() -> int:
        return 1

    @returns_future
    async def outer() -> int:
        return inner().get(T)

    with pytest.raises(RuntimeError, match="await the Future instead"):
        outer().get(T)


def test_arguments_are_checked_at_the_call() -> None:
    with pytest.raises(TypeError):
        add(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        add(1, 2, 3, 4)  # type: ignore[call-arg]


def test_only_async_functions() -> None:
    def plain() -> int:
        return 1

    with pytest.raises(TypeError, match="requires an async function"):
        returns_future(plain)  # type: ignore[arg-type]


class Bodies(Actor):
    """A body awaited inside an async endpoint mixes asyncio and trio, as the endpoint may."""

    @endpoint
    async def mixed(self, x: int) -> tuple[int, str]:
        import trio

        from regency.actor import context

        @returns_future
        async def body() -> tuple[int, str]:
            await asyncio.sleep(0.001)
            await trio.sleep(0.001)
            return x * 2, context().actor_instance.name

        return await body()

    @endpoint
    def blocking(self, x: int) -> tuple[int, str]:
        return add(x, x).get(T)


def test_inside_endpoints_async_and_sync() -> None:
    bodies = this_proc().spawn("returns_future_bodies", Bodies)
    try:
        assert bodies.mixed.call_one(21).get(T) == (42, "returns_future_bodies")
        assert bodies.blocking.call_one(4).get(T) == (8, "nobody")
    finally:
        ActorMesh.stop(bodies).get(T)  # type: ignore[arg-type]


class Answer(Actor):
    @endpoint
    def value(self) -> int:
        return 41


class Asks(Actor):
    """Bodies that await another actor's reply, observed by ``.get()`` on the actor's thread
    and by ``await`` in an async endpoint."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    @endpoint
    def by_get(self) -> int:
        @returns_future
        async def body() -> int:
            await asyncio.sleep(0)
            return await self.answer.value.call_one() + 1

        return body().get(T)

    @endpoint
    async def by_await(self) -> int:
        @returns_future
        async def body() -> int:
            await asyncio.sleep(1)  # virtual time in the simulator
            return await self.answer.value.call_one() + 2

        return await body()


def test_bodies_awaiting_replies_in_the_simulator() -> None:
    from regency.sim import simulate

    def program(hosts: object) -> tuple[int, int, int]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})  # type: ignore[attr-defined]
        answer = procs.spawn("answer", Answer)
        asks = procs.spawn("asks", Asks, answer)

        @returns_future
        async def from_main() -> int:
            return await answer.value.call_one()

        return (
            from_main().get(T),
            asks.by_get.call_one().get(T),
            asks.by_await.call_one().get(T),
        )

    first = simulate(program, seed=3, hosts=1)
    assert first.value == (41, 42, 43)
    assert simulate(program, seed=3, hosts=1).trace_hash == first.trace_hash
