"""Drive a real Jupyter kernel (ipykernel) cell by cell through nbclient, as JupyterLab does.

Tests run each scenario with ``asyncio.run``: nbclient is asyncio code, and a cell can be
interrupted while it runs (a task executes it while the test sends the interrupt).
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need the dev extra")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need the dev extra")
pytest.importorskip("ipykernel", reason="the notebook tests need the dev extra")

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class CellRun:
    """What one executed cell showed."""

    def __init__(self, outputs: Iterable[Any]) -> None:
        self.outputs = list(outputs)

    def _stream(self, name: str) -> str:
        return "".join(
            o["text"] for o in self.outputs if o["output_type"] == "stream" and o["name"] == name
        )

    @property
    def stdout(self) -> str:
        return self._stream("stdout")

    @property
    def stderr(self) -> str:
        return self._stream("stderr")

    @property
    def error(self) -> tuple[str, str] | None:
        """(exception type name, message) when the cell raised."""
        for o in self.outputs:
            if o["output_type"] == "error":
                return (o["ename"], o["evalue"])
        return None

    @property
    def result(self) -> str | None:
        for o in self.outputs:
            if o["output_type"] == "execute_result":
                text: str = o["data"].get("text/plain", "")
                return text
        return None

    def __repr__(self) -> str:
        return f"CellRun(stdout={self.stdout!r}, stderr={self.stderr!r}, error={self.error!r})"


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a plain selector loop. Once trio-asyncio has run in a process (the
    suite's asyncio-in-endpoints tests), ``asyncio.run`` builds trio-asyncio loops, which
    pyzmq's asyncio sockets (nbclient's) do not work on."""
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(coro)


def kernel_env() -> dict[str, str]:
    """The test's environment, with this checkout first on the kernel's path, and without
    pytest's variables: ipykernel does not capture the output of subprocesses (procs) when
    it sees ``PYTEST_CURRENT_TEST``, and a user's kernel does."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return {**env, "PYTHONPATH": path}


class Kernel:
    """One ipykernel started by nbclient; ``async with Kernel(tmp_path) as k``."""

    def __init__(self, cwd: Path, timeout: float = 120) -> None:
        self.nb = nbformat.v4.new_notebook()
        self.client = nbclient.NotebookClient(
            self.nb,
            timeout=timeout,
            allow_errors=True,
            kernel_name="python3",
            resources={"metadata": {"path": str(cwd)}},
        )
        self._setup: Any = None

    async def __aenter__(self) -> Kernel:
        self._setup = self.client.async_setup_kernel(env=kernel_env())
        await self._setup.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._setup.__aexit__(*exc)

    @property
    def km(self) -> Any:
        return self.client.km

    @property
    def pid(self) -> int:
        pid: int = self.km.provisioner.pid
        return pid

    async def run(self, code: str) -> CellRun:
        cell = nbformat.v4.new_code_cell(code)
        self.nb.cells.append(cell)
        await self.client.async_execute_cell(cell, len(self.nb.cells) - 1)
        return CellRun(cell.outputs)

    async def value(self, expression: str) -> Any:
        """Evaluate ``expression`` in the kernel; its ``repr`` read back with ``eval``."""
        run = await self.run(expression)
        assert run.error is None and run.result is not None, run
        return eval(run.result)

    async def interrupt(self) -> None:
        """Jupyter's Interrupt button: SIGINT to the kernel's process group."""
        await self.km.interrupt_kernel()

    async def interrupt_until_done(self, cell: asyncio.Future[CellRun]) -> CellRun:
        """Interrupt until the running ``cell`` ends (a SIGINT that lands just before the
        cell's wait began is ipykernel's to handle, and it may act only later); return it."""
        for _ in range(5):
            await self.interrupt()
            done, _pending = await asyncio.wait({cell}, timeout=3)
            if done:
                return cell.result()
        raise AssertionError("five interrupts did not end the cell")

    async def alive(self) -> bool:
        alive: bool = await self.km.is_alive()
        return alive


async def wait_fifo(path: Path) -> str:
    """Block (in a thread) until someone writes a line into the FIFO at ``path``."""

    def read() -> str:
        with open(path) as f:
            return f.readline()

    return await asyncio.get_running_loop().run_in_executor(None, read)


def wait_exited(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait (pidfds, no polling) until every pid has exited; return those still running."""
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
    try:
        remaining = dict(fds)
        end = time.monotonic() + timeout
        while remaining:
            left = end - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(remaining.values()), [], [], left)
            for pid in [p for p, fd in remaining.items() if fd in ready]:
                del remaining[pid]
        return sorted(remaining)
    finally:
        for fd in fds.values():
            os.close(fd)
