"""The simulated mode in a real Jupyter kernel, in the notebook's ``await`` style."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from .kernel import Kernel, run_async, wait_fifo

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
    async def nap(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return regency.sim.current_trace().hexdigest()

class Blocker(Actor):
    @endpoint
    async def block(self, fifo: str) -> None:
        with open(fifo, "w") as f:  # the test learns that the cell is in its wait now
            f.write("blocked\\n")
        await trio.sleep_forever()

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
    first = run_async(_run_all(tmp_path))
    assert first[1].splitlines()[1:] == [
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "[(0, 'sim-master'), (1, 'sim-master')]",
        "controller sees None",
    ], first[1]
    assert "a minute of virtual time: 60 s" in first[2]
    # The same seed in a fresh kernel: the same outputs at the same virtual times. (The
    # trace hash, printed too, hashes every task step; in about one two-kernel run in ten
    # on the loaded test machine it differed while every virtual time agreed: an open
    # question, see docs/notebooks.md. Scripts repeat it exactly, tests/sim checks that.)
    second = run_async(_run_all(tmp_path))
    assert [_without_trace(out) for out in second] == [_without_trace(out) for out in first]


def _without_trace(output: str) -> str:
    return output.split(" trace ")[0]


def test_interrupting_a_simulated_wait_keeps_the_simulation_in_step(tmp_path: Path) -> None:
    fifo = tmp_path / "waiting"
    os.mkfifo(fifo)

    async def scenario() -> None:
        async with Kernel(tmp_path) as k:
            for code in CELLS[:2]:
                assert (await k.run(code)).error is None
            # Waits that nothing will end (virtual time flies meanwhile): the interrupt must
            # hand the turn back to the notebook before the cell goes on. The blocker runs
            # only once the cell's wait has handed the turn to the simulation.
            for i, style in enumerate(("await {call}", "{call}.get()")):
                call = f"blockers{i}.slice(gpus=0).block.call_one({str(fifo)!r})"
                cell = asyncio.ensure_future(
                    k.run(f"blockers{i} = await pm.spawn('blockers{i}', Blocker)\n" + style.format(call=call))
                )
                assert await wait_fifo(fifo) == "blocked\n"
                interrupted = await k.interrupt_until_done(cell)
                assert interrupted.error is not None, interrupted
                assert interrupted.error[0] in ("KeyboardInterrupt", "CancelledError")
                after = await asyncio.wait_for(
                    k.run("print(sorted((await envs.where.call()).values()))\n"
                          "print(sorted(envs.where_sync.call().get().values()))"),
                    60,
                )
                assert after.error is None, after
                assert after.stdout.splitlines() == [
                    "[(0, 'sim-master'), (1, 'sim-master')]",
                    "[(0, 'sim-master'), (1, 'sim-master')]",
                ], after

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
