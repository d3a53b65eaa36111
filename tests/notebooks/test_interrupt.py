"""Jupyter's Interrupt (SIGINT to the kernel's process group) in a real kernel: it ends the
running cell's wait and nothing else; procs and meshes live on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from .kernel import Kernel, run_async, wait_fifo

pytestmark = pytest.mark.slow


def test_interrupt_ends_the_cells_wait_and_nothing_else(tmp_path: Path) -> None:
    fifo = tmp_path / "waiting"
    os.mkfifo(fifo)

    async def scenario() -> None:
        async with Kernel(tmp_path) as k:
            setup = await k.run(
                "import os, threading\n"
                "from regency.actor import Actor, endpoint, proc_mesh, current_rank\n"
                "class Napper(Actor):\n"
                "    def __init__(self):\n"
                "        self.wake = threading.Event()\n"
                "    @endpoint\n"
                "    def nap(self, fifo: str) -> str:\n"
                "        with open(fifo, 'w') as f:\n"
                "            f.write('napping\\n')\n"
                "        self.wake.wait()\n"
                "        return 'woke'\n"
                "class Other(Actor):\n"
                "    @endpoint\n"
                "    def pid(self) -> int:\n"
                "        return os.getpid()\n"
                "import asyncio\n"
                "pm = await proc_mesh(gpus=3)\n"
                "nappers = await pm.spawn('nappers', Napper)\n"
                "others = await pm.spawn('others', Other)\n"
                "pids = sorted((await others.pid.call()).values())\n"
                "from regency.core._controller import current_runtime\n"
                "zygote = current_runtime().launcher._popen.pid\n"
                "print(pids, zygote)\n"
            )
            assert setup.error is None, setup
            pids, zygote = await k.value("(pids, zygote)")
            # Procs and the zygote are out of the kernel's process group and session.
            for pid in [*pids, zygote]:
                assert os.getpgid(pid) != os.getpgid(k.pid)
                assert os.getsid(pid) != os.getsid(k.pid)

            # Each style on its own rank: an interrupted call goes on at the actor, whose
            # rank stays busy with it.
            # The third: a blocking get in a cell that also awaits (an async cell, where
            # ipykernel's own handler would only cancel a task that cannot run).
            styles = ("await {call}", "{call}.get()", "await asyncio.sleep(0)\n{call}.get()")
            for rank, style in enumerate(styles):
                call = f"nappers.slice(gpus={rank}).nap.call_one({str(fifo)!r})"
                cell = asyncio.ensure_future(k.run(style.format(call=call)))
                assert await wait_fifo(fifo) == "napping\n"  # the cell waits on the call now
                # (A SIGINT that lands before the cell's wait began, between sending the call
                # and waiting for it, is ipykernel's to handle: a second one ends the wait.)
                interrupted = await k.interrupt_until_done(cell)
                assert interrupted.error is not None, interrupted
                # Regency's KeyboardInterrupt, or ipykernel's own cancellation of an async
                # cell when its loop happened to wake first; either way the wait (which
                # nothing else would end: the actor never returns) is over.
                expected = ("KeyboardInterrupt", "CancelledError") if rank == 0 else ("KeyboardInterrupt",)
                assert interrupted.error[0] in expected, interrupted

                # The kernel, the procs, the zygote and the meshes are all still there.
                assert await k.alive()
                answers = await k.value("sorted((await others.pid.call()).values())")
                assert answers == pids
                assert await k.value("zygote") == zygote

            # Interrupt while idle: nothing happens at all.
            await k.interrupt()
            assert await k.alive()
            assert await k.value("sorted(others.pid.call().get().values())") == pids
            for pid in [*pids, zygote]:
                os.kill(pid, 0)  # still running

    run_async(scenario())
