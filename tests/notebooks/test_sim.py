"""The simulated mode in a real Jupyter kernel, in the notebook's ``await`` style."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .kernel import Kernel

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
    async def nap(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return regency.sim.current_trace().hexdigest()

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
digest = await envs.slice(gpus=1).nap.call_one(60.0)
print("a minute of virtual time:", round(now() - before), "s")
print("at", now(), "trace", digest)
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
    first = asyncio.run(_run_all(tmp_path))
    assert first[1].splitlines()[1:] == [
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "controller sees None",
    ], first[1]
    assert "a minute of virtual time: 60 s" in first[2]
    # The same seed in a fresh kernel: the same virtual times and the same schedule.
    assert asyncio.run(_run_all(tmp_path)) == first
