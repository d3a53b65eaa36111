"""The simulated mode in a real Jupyter kernel, in the notebook's ``await`` style."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .kernel import Kernel, run_async

pytestmark = pytest.mark.slow

CELLS = [
    """
import os
import regency, regency.sim, trio
from regency.actor import Actor, endpoint, proc_mesh, current_rank
regency.configure(runtime="sim", seed=7)

class Env(Actor):
    @endpoint
    async def where(self) -> tuple[int, str | None]:
        return (current_rank().rank, os.environ.get("MASTER_ADDR"))

    @endpoint
    def where_sync(self) -> tuple[int, str | None]:
        return (current_rank().rank, os.environ.get("MASTER_ADDR"))

    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")

    @endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return trio.current_time()

def now() -> float:
    return regency.sim.current().now()

pm = await proc_mesh(gpus=2, env={"MASTER_ADDR": "sim-master"})
print("procs up at", now())
""",
    """
envs = await pm.spawn("envs", Env)
print("spawned at", now())
print(sorted((await envs.where.call()).values()))
print(sorted(envs.where_sync.call().get().values()))
print(sorted((await envs.where_sync.call()).values()))
print("controller sees", os.environ.get("MASTER_ADDR"))
""",
    """
before = now()
woke = await envs.slice(gpus=1).nap.call_one(60.0)
print("a minute of virtual time:", round(now() - before), "s")
print("at", now(), "the actor woke at", woke)
""",
]


async def _run_all(tmp_path: Path) -> list[str]:
    async with Kernel(tmp_path) as k:
        outputs = []
        for code in CELLS:
            run = await asyncio.wait_for(k.run(code), 60)
            assert run.error is None, run
            outputs.append(run.stdout)
        return outputs


def test_simulated_mode_with_await_is_deterministic(tmp_path: Path) -> None:
    first = run_async(_run_all(tmp_path))
    assert first[1].splitlines()[1:] == [
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "controller sees None",
    ], first[1]
    assert "a minute of virtual time: 60 s" in first[2]
    # The same seed in a fresh kernel: the same outputs at the same virtual times. (The
    # simulation's trace hash was seen to differ between kernels in about one run in ten,
    # every virtual time agreeing: an open question, see docs/notebooks.md.)
    assert run_async(_run_all(tmp_path)) == first


def test_an_actor_failure_in_a_simulated_notebook_is_reported_with_its_replay(
    tmp_path: Path,
) -> None:

    async def scenario() -> None:
        async with Kernel(tmp_path) as k:
            for code in CELLS[:2]:
                assert (await k.run(code)).error is None
            # An actor failure in the simulation: reported in the cell, with how to replay.
            failed = await asyncio.wait_for(
                k.run(
                    "from regency.actor import Channel\n"
                    "port, receiver = Channel.open()\n"
                    "envs.slice(gpus=1).boom.broadcast()\n"
                    "await receiver.recv()\n"
                ),
                60,
            )
            assert failed.error is not None and failed.error[0] == "UnhandledFault", failed
            assert "actor mesh envs failed at rank(s) 1" in failed.stderr
            assert (
                "replay this simulation: run the same cells in a fresh kernel after "
                "regency.configure(runtime='sim', seed=7)" in failed.stderr
            ), failed.stderr
            assert await k.alive()

    run_async(scenario())
