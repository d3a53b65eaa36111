"""Actor deaths inside a real Jupyter kernel: the kernel stays; the cell hears of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .kernel import Kernel, run_async

pytestmark = pytest.mark.slow

SETUP = """
import os
from regency.actor import Actor, SupervisionError, UnhandledFault, endpoint, proc_mesh

class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        os._exit(3)

    @endpoint
    def echo(self, x):
        return x

pm = await proc_mesh(gpus=2)
workers = await pm.spawn("workers", Worker)
print(sorted((await workers.pid.call()).values()))
"""


def test_actor_deaths_leave_the_kernel_alive(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Kernel(tmp_path) as k:
            setup = await k.run(SETUP)
            assert setup.error is None, setup
            kernel_pid = k.pid

            # A death the cell catches: the call fails with SupervisionError, the unhandled
            # mesh failure is reported (in this cell or the next), the kernel lives on.
            caught = await k.run(
                "try:\n"
                "    await workers.slice(gpus=0).die.call_one()\n"
                "except SupervisionError as e:\n"
                "    print('caught:', e)\n"
            )
            assert caught.error is None, caught
            assert "caught: Endpoint call workers.die() failed, The actor <" in caught.stdout
            after = await k.run("print(await pm.slice(gpus=1).spawn('more', Worker).echo.call_one(5))")
            assert after.stdout == "5\n", after
            report = caught.stderr + after.stderr
            assert "actor mesh workers failed at rank(s) 0" in report
            assert "exited with status 3" in report or "status=3" in report
            assert await k.alive() and k.pid == kernel_pid

            # A death nobody waits for, while the cell waits on something else: the cell
            # gets UnhandledFault from its wait, with the report; the kernel lives on.
            # (A receiver nobody sends to: only the fault can end these waits.)
            for style, wait in (("await", "await receiver.recv()"), ("get", "receiver.recv().get()")):
                uncaught = await k.run(
                    "from regency.actor import Channel\n"
                    "port, receiver = Channel.open()\n"
                    f"fresh = await pm.slice(gpus=1).spawn('fresh_{style}', Worker)\n"
                    "fresh.die.broadcast()\n"
                    f"{wait}\n"
                )
                assert uncaught.error is not None, uncaught
                assert uncaught.error[0] == "UnhandledFault", uncaught
                assert "an actor failure reached the root unhandled" in uncaught.error[1]
                assert f"actor mesh fresh_{style} failed at rank(s) 0" in uncaught.stderr
                assert await k.alive() and k.pid == kernel_pid
                # The proc that died is replaced for the next round.
                pm = "pm = await proc_mesh(gpus=2)"
                assert (await k.run(pm)).error is None

            # Nothing is left over for later cells, and new meshes work.
            later = await k.run(
                "pm2 = await proc_mesh(gpus=2)\n"
                "w2 = await pm2.spawn('w2', Worker)\n"
                "print(sorted((await w2.echo.call(7)).values()))\n"
                "print(w2.slice(gpus=0).echo.call_one(8).get())\n"
            )
            assert later.error is None, later
            assert later.stdout == "[7, 7]\n8\n", later

    run_async(scenario())
