"""asyncio inside async endpoints, as Monarch code writes it: real procs and the simulator."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from regency.actor import ActorError, ProcMesh, this_host
from regency.sim import simulate

from ..conftest import RootFailures
from .actors import AsyncioWorker

T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def workers() -> Iterator[Any]:
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield procs.spawn("aio", AsyncioWorker)
    finally:
        procs.stop().get(T)


@pytest.mark.slow
def test_asyncio_primitives_in_real_procs(workers: Any) -> None:
    one = workers.slice(gpus=0)
    assert workers.sleep_then.call(0.01, 7).get(T).values() == [7, 7]
    assert one.gather.call_one(5).get(T) == [0, 1, 4, 9, 16]
    one.produce_later.call_one(42, 0.05).get(T)
    assert one.consume.call_one(5.0).get(T) == 42
    one.set_ready_later.call_one(0.05).get(T)
    assert one.wait_ready.call_one().get(T) == "ready"
    assert one.mixed.call_one().get(T) >= 0.03
    assert one.to_thread.call_one(1).get(T) == 2
    assert one.cancelled_wait.call_one().get(T) == "timed out"


@pytest.mark.slow
def test_background_task_lives_on(workers: Any) -> None:
    one = workers.slice(gpus=1)
    one.start_ticker.call_one().get(T)
    assert one.ticks_after.call_one(0.2).get(T) > 0


@pytest.mark.slow
def test_asyncio_error_reaches_caller(workers: Any) -> None:
    with pytest.raises(ActorError, match="from asyncio code"):
        workers.slice(gpus=0).raises.call_one().get(T)


@pytest.mark.slow
def test_failed_background_task_is_reported() -> None:
    """A task started with asyncio.create_task that fails is reported in the proc's log,
    naming the task, and the actor goes on serving."""
    script = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(stream=sys.stderr, level=logging.ERROR)
        from regency.actor import this_host
        from tests.compat.actors import AsyncioWorker
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        w = procs.spawn("aio", AsyncioWorker)
        w.start_failing_task.call_one().get(30)
        print("after", w.sleep_then.call_one(0.05, 3).get(30), flush=True)
        procs.stop().get(30)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "after 3" in done.stdout
    assert "doomed-task" in done.stderr
    assert "the background task failed on purpose" in done.stderr


def test_asyncio_in_the_simulator_takes_virtual_time() -> None:
    def program(hosts: Any) -> tuple[int, int, list[int], str]:
        w = hosts.spawn_procs(per_host={"gpus": 1}).spawn("aio", AsyncioWorker)
        one = w.slice(hosts=0)
        one.set_ready_later.call_one(30.0).get()
        waiting = one.wait_ready.call_one()
        slept = one.sleep_then.call_one(3600.0, 5).get()
        one.start_ticker.call_one().get()  # after the hour: 100 ticks per virtual second
        return (
            slept,
            one.ticks_after.call_one(1.0).get(),
            one.gather.call_one(3).get(),
            waiting.get(),
        )

    start = time.monotonic()
    first = simulate(program, seed=3, hosts=1)
    second = simulate(program, seed=3, hosts=1)
    value = first.value
    assert value[0] == 5 and value[2] == [0, 1, 4] and value[3] == "ready"
    assert 90 <= value[1] <= 100  # ticks every 10 ms of virtual time
    assert first.virtual_time >= 3601
    assert first.trace_hash == second.trace_hash
    assert time.monotonic() - start < 20


@pytest.mark.slow
def test_supervise_runs_while_an_async_endpoint_waits() -> None:
    from .actors import WaitingOwner

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("owner", WaitingOwner)
        failures = owner.spawn_child_and_wait_for_its_death.call_one().get(T)
    finally:
        procs.stop().get(T)
    assert len(failures) == 1 and "doomed" in failures[0]


@pytest.mark.slow
@pytest.mark.parametrize("raises", [False, True], ids=["returns-false", "raises"])
def test_an_owner_that_does_not_handle_fails_at_its_await_point(
    raises: bool, roots: RootFailures
) -> None:
    """Monarch's ``test_supervise_callback_unhandled`` and ``test_supervise_callback_raising``:
    the owner's ``__supervise__`` gives up while an endpoint of it sleeps 60 s after its
    child died. The owner fails at once: the endpoint's caller gets ``SupervisionError``
    naming the owner and the child (Monarch's message), within seconds, and the owner
    takes no more calls. Before, the failure waited for the endpoint to return."""
    import re

    from regency.actor import SupervisionError

    from .actors import UnhandlingOwner

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("unhandling", UnhandlingOwner, raises)
        start = time.monotonic()
        with pytest.raises(SupervisionError) as caught:
            owner.spawn_child_and_outlive_it.call_one(60.0).get(T)
        assert time.monotonic() - start < T
        report = str(caught.value)
        assert re.search(
            r"The actor.*doomed.*and all its descendants have failed", report, re.DOTALL
        ), report
        assert "unhandling" in report, report
        if raises:
            assert UnhandlingOwner.SUPERVISE_MESSAGE in report, report
        with pytest.raises(SupervisionError):
            owner.alive.call_one().get(T)
        roots.wait_for("unhandling")
    finally:
        procs.stop().get(T)


def test_asyncio_run_in_the_controller_stays_stock_asyncio() -> None:
    """Once an async endpoint ran in the controller's own process (trio-asyncio imported), a
    program's ``asyncio.run`` (a notebook kernel's loop, a library) still gets stock asyncio."""
    script = textwrap.dedent(
        """
        import asyncio
        from regency.actor import this_proc
        from tests.compat.actors import AsyncioWorker
        w = this_proc().spawn("aio", AsyncioWorker)
        print("endpoint", w.sleep_then.call_one(0.01, 4).get(30))
        async def main():
            return type(asyncio.get_running_loop()).__name__
        print("loop", asyncio.run(main()))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "endpoint 4" in done.stdout
    assert "loop _UnixSelectorEventLoop" in done.stdout
