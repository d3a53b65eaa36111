"""Regency in a real Jupyter kernel, driven through nbclient as JupyterLab drives
it. ``python -m benchmarks.bench_notebook`` (needs the ``dev`` extra: nbclient, ipykernel).

Times inside the kernel are taken by the cell itself (``time.perf_counter``); the interrupt
latency and the whole-cell figures from outside, as a user sees them.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETUP = """
import os, time, threading
from regency.actor import Actor, endpoint, proc_mesh

class Echo(Actor):
    def __init__(self):
        self.wake = threading.Event()
    @endpoint
    def ping(self, x=None):
        return x
    @endpoint
    def block(self, fifo):
        with open(fifo, "w") as f:
            f.write("blocked\\n")
        self.wake.wait()

t = time.perf_counter()
pm = await proc_mesh(gpus=2)
echo = await pm.spawn("echo", Echo)
await echo.ping.call()
time.perf_counter() - t
"""


class _Kernel:
    def __init__(self) -> None:
        import nbclient
        import nbformat

        self.nbformat = nbformat
        self.nb = nbformat.v4.new_notebook()
        self.client = nbclient.NotebookClient(
            self.nb, timeout=120, allow_errors=True, kernel_name="python3",
            resources={"metadata": {"path": ROOT}},
        )

    async def __aenter__(self) -> _Kernel:
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
        self._setup = self.client.async_setup_kernel(env={**os.environ, "PYTHONPATH": path})
        await self._setup.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._setup.__aexit__(*exc)

    async def run(self, code: str) -> Any:
        cell = self.nbformat.v4.new_code_cell(code)
        self.nb.cells.append(cell)
        await self.client.async_execute_cell(cell, len(self.nb.cells) - 1)
        for out in cell.outputs:
            if out["output_type"] == "error":
                raise RuntimeError(f"cell failed: {out['ename']}: {out['evalue']}")
            if out["output_type"] == "execute_result":
                return eval(out["data"]["text/plain"])
        return None


def _read_line(path: str) -> str:
    with open(path) as f:
        return f.readline()


async def _measure() -> list[tuple[str, str, float, str]]:
    first: list[float] = []
    spawns: list[float] = []
    cells: list[float] = []
    empty: list[float] = []
    interrupts: list[float] = []
    plain: list[float] = []
    fifo = os.path.join(ROOT, f".bench-notebook-{os.getpid()}.fifo")
    os.mkfifo(fifo)
    try:
        for kernel in range(3):
            async with _Kernel() as k:
                first.append(await k.run(SETUP))
                if kernel:
                    continue
                for _ in range(10):
                    spawns.append(await k.run(
                        "t = time.perf_counter()\n"
                        "await (await pm.spawn('e', Echo)).ping.call()\n"
                        "time.perf_counter() - t"
                    ))
                for _ in range(10):
                    t = time.perf_counter()
                    await k.run("_ = await echo.ping.call()")
                    cells.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    await k.run("None")
                    empty.append(time.perf_counter() - t)
                loop = asyncio.get_running_loop()
                for rank in range(2):
                    cell = asyncio.ensure_future(
                        k.run(f"await echo.slice(gpus={rank}).block.call_one({fifo!r})")
                    )
                    await loop.run_in_executor(None, _read_line, fifo)
                    t = time.perf_counter()
                    await k.client.km.interrupt_kernel()
                    try:
                        await cell
                    except RuntimeError:
                        pass  # KeyboardInterrupt in the cell: expected
                    interrupts.append(time.perf_counter() - t)
                for _ in range(2):  # the same path without Regency, for comparison
                    cell = asyncio.ensure_future(
                        k.run(f"open({fifo!r}, 'w').write('sleeping\\n'); time.sleep(100)")
                    )
                    await loop.run_in_executor(None, _read_line, fifo)
                    t = time.perf_counter()
                    await k.client.km.interrupt_kernel()
                    try:
                        await cell
                    except RuntimeError:
                        pass
                    plain.append(time.perf_counter() - t)
    finally:
        os.unlink(fifo)
    ms = 1000.0
    return [
        ("first cell: await proc_mesh(gpus=2), await spawn, first call (fresh kernel)", "",
         statistics.median(first), "s"),
        ("await pm.spawn(...) + first call, 2 ranks", "", statistics.median(spawns) * ms, "ms"),
        ("cell `await echo.ping.call()`, as nbclient sees it", "",
         statistics.median(cells) * ms, "ms"),
        ("empty cell, same kernel (Regency's end-of-cell drain included)", "",
         statistics.median(empty) * ms, "ms"),
        ("Interrupt to the end of a cell awaiting a call that never returns", "",
         statistics.median(interrupts) * ms, "ms"),
        ("Interrupt to the end of a cell in time.sleep (ipykernel alone, for comparison)", "",
         statistics.median(plain) * ms, "ms"),
    ]


def run() -> list[tuple[str, str, float, str]]:
    # A plain loop: once trio-asyncio has run in a process, asyncio.run builds its loops,
    # which pyzmq's asyncio sockets (nbclient's) do not work on.
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(_measure())


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    for figure, _target, value, unit in run():
        print(f"{figure:80s} {value:10,.3f} {unit}")
