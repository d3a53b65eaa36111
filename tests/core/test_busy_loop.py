"""A busy actor must never starve its proc's own I/O (Monarch's ``grpo_yield.py`` pattern).

Four generators flood one scorer's channel from ``asyncio.create_task`` loops that yield
only with ``await asyncio.sleep(0)``, while the scorer, slower than they are, loops on
``await receiver.recv()`` (in its endpoint, or in an asyncio task): a value is queued at
nearly every turn. Before an await of a resolved Future was a turn of the loop, the scorer
went through tens of thousands of values without its loop serving a socket: no heartbeats
("busy, not stuck"), no acknowledgements, so each generator closed its link as stalled and
could not reconnect either (``UndeliverableError``), and a call to an actor beside the
scorer took 1.3-1.5 s. Timeouts here are a tenth of the defaults, so a starved loop shows
within the test's few seconds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
import trio

from regency.actor import ProcMesh, this_host
from regency.core._aio import AsyncioBridge, drive
from regency.core._config import overridden
from regency.core._future import resolved

from .busy_actors import Generator, Probe, Scorer, Trainer

T = 60  # generous timeout for .get(): a hang fails the test instead of the suite
GENERATORS = 4
RUN_S = 1.5  # how long the generators flood the scorer
WORK_US = 20.0  # the scorer's CPU per value: it cannot keep up with four generators


# -- an await of a resolved Future is a turn of the loop (fast tier) -----------------------


async def _awaits_resolved(n: int, turns: list[int]) -> int:
    """Await a resolved Future ``n`` times; how many turns another task had meanwhile."""
    before = len(turns)
    fut = resolved(1)
    total = 0
    for _ in range(n):
        total += await fut
    assert total == n
    return len(turns) - before


def test_trio_task_awaiting_resolved_futures_lets_others_run() -> None:
    async def main() -> int:
        turns: list[int] = []
        async with trio.open_nursery() as nursery:

            async def other() -> None:
                while True:
                    turns.append(1)
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()
            got = await _awaits_resolved(100, turns)
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(main) >= 90


def test_await_of_a_resolved_future_is_a_cancel_point_in_trio() -> None:
    async def main() -> bool:
        with trio.CancelScope() as scope:
            scope.cancel()
            await resolved(1)
        return scope.cancelled_caught

    assert trio.run(main)


def test_asyncio_task_awaiting_resolved_futures_lets_others_run() -> None:
    async def main() -> int:
        turns: list[int] = []

        async def other() -> None:
            while True:
                turns.append(1)
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        got = await _awaits_resolved(100, turns)
        task.cancel()
        return got

    assert asyncio.run(main()) >= 90


@pytest.mark.parametrize("in_task", [False, True], ids=["endpoint", "asyncio_task"])
def test_endpoint_driver_awaiting_resolved_futures_lets_the_loop_run(in_task: bool) -> None:
    """Through ``drive`` (how an async endpoint runs), in the endpoint's coroutine and in an
    asyncio task it starts: a trio task beside it (the runtime's readers, heartbeats) runs."""

    async def main() -> int:
        turns: list[int] = []
        async with trio.open_nursery() as nursery:

            async def other() -> None:
                while True:
                    turns.append(1)
                    await trio.lowlevel.checkpoint()

            async def endpoint() -> int:
                if in_task:
                    return await asyncio.create_task(_awaits_resolved(100, turns))
                return await _awaits_resolved(100, turns)

            nursery.start_soon(other)
            got: int = await drive(endpoint(), AsyncioBridge(nursery))
            nursery.cancel_scope.cancel()
        return got

    assert trio.run(main) >= 90


# -- the pattern, with real processes ------------------------------------------------------


@pytest.fixture
def meshes() -> Iterator[tuple[ProcMesh, ProcMesh, ProcMesh]]:
    # Children take these settings (spawn_procs hands them today's configuration): a loop
    # silent for a second is reported, and a link unacknowledged for a second is closed.
    with overridden(heartbeat_interval=0.1, heartbeat_timeout=1.0, delivery_timeout=1.0):
        gens = this_host().spawn_procs(per_host={"gpus": GENERATORS})
        scorer = this_host().spawn_procs(per_host={"gpus": 1})
        trainer = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        yield gens, scorer, trainer
    finally:
        for pm in (gens, scorer, trainer):
            pm.stop().get(T)


@pytest.mark.slow
@pytest.mark.parametrize("in_task", [False, True], ids=["endpoint", "asyncio_task"])
def test_flooded_scorer_keeps_its_links_and_heartbeats(
    meshes: tuple[ProcMesh, ProcMesh, ProcMesh], in_task: bool, caplog: pytest.LogCaptureFixture
) -> None:
    gen_procs, scorer_procs, trainer_procs = meshes
    caplog.set_level(logging.WARNING)
    generators = gen_procs.spawn("generators", Generator)
    scorer = scorer_procs.spawn("scorer", Scorer)
    trainer = trainer_procs.spawn("trainer", Trainer, generators)
    # All-async actors beside them: the procs' loops read and answer their calls.
    scorer_probe = scorer_procs.spawn("probe", Probe)
    generator_probes = gen_procs.spawn("probes", Probe)
    port = scorer.channel_port.call_one().get(T)
    scored = scorer.run.call_one(GENERATORS, WORK_US, in_task)
    generators.start.call(port, 100).get(T)
    slowest = {"scorer": 0.0, "generators": 0.0}
    end = time.monotonic() + RUN_S
    while time.monotonic() < end:
        trainer.step.call_one().get(T)  # pushes weights to one generator at a time
        for name, call in (
            ("scorer", scorer_probe.ping.call_one),
            ("generators", generator_probes.ping.call),
        ):
            t0 = time.monotonic()
            call().get(T)
            slowest[name] = max(slowest[name], time.monotonic() - t0)
        time.sleep(0.02)
    sent = sum(generators.stop_rollouts.call().get(T).values())  # each sends its sentinel last
    assert scored.get(T) == sent > 0  # every value, then every sentinel
    # Busy loops still served their sockets: a call through them took a fraction of a
    # second (before: seconds for the scorer's), and no proc's heartbeats lapsed.
    print(f"slowest call through each loop: {slowest}")
    assert slowest["scorer"] < 0.5 and slowest["generators"] < 0.5, slowest
    verdicts = [  # the watchdog's (regency.stall's earlier notices aside)
        r.getMessage()
        for r in caplog.records
        if r.name == "regency.runtime" and "has sent no heartbeat" in r.getMessage()
    ]
    assert verdicts == []
