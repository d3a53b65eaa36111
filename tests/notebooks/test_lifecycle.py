"""Restart, shutdown and a killed kernel leave no process and no job directory behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from regency.core._jobdir import remove_stale

from .kernel import Kernel, run_async, wait_exited

SETUP = """
import os
from regency.actor import Actor, endpoint, proc_mesh
from regency.core._controller import current_runtime

class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

pm = await proc_mesh(gpus=2)
pids = sorted((await pm.spawn("pids", Pid).pid.call()).values())
rt = current_runtime()
(os.getpid(), rt.launcher._popen.pid, pids, rt.jobdir)
"""


async def _start_procs(k: Kernel) -> tuple[list[int], str]:
    """Spawn two procs in the kernel; return every pid involved and the job directory."""
    run = await k.run(SETUP)
    assert run.error is None and run.result is not None, run
    kernel, zygote, pids, jobdir = eval(run.result)
    assert kernel == k.pid and os.path.isdir(jobdir)
    return [kernel, zygote, *pids], jobdir


@pytest.mark.slow
def test_restart_and_shutdown_leave_nothing_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Kernel(tmp_path) as k:
            # Restart as JupyterLab does it (jupyter_client interrupts first, then asks).
            pids, jobdir = await _start_procs(k)
            await k.km.restart_kernel(now=False)
            assert wait_exited(pids, timeout=15) == []
            assert not os.path.exists(jobdir)

            # The new kernel works, and shutting it down is as clean.
            assert k.pid != pids[0]
            pids, jobdir = await _start_procs(k)
            await k.km.shutdown_kernel(now=False)
            assert wait_exited(pids, timeout=15) == []
            assert not os.path.exists(jobdir)

    run_async(scenario())


@pytest.mark.slow
def test_a_killed_kernel_takes_its_procs_and_directory_with_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Kernel(tmp_path) as k:
            pids, jobdir = await _start_procs(k)
            os.kill(k.pid, signal.SIGKILL)  # no atexit, nothing: the zygote cleans up
            assert wait_exited(pids, timeout=15) == []
            left = os.listdir(jobdir) if os.path.exists(jobdir) else None
            assert left is None, f"{jobdir} left behind, holding {left}"

    run_async(scenario())


def test_stale_job_directories_are_removed_at_start(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"regency-{gone.pid}-abcd"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "c1.sock").write_text("")
    live = tmp_path / f"regency-{os.getpid()}-efgh"
    live.mkdir()
    unrelated = [tmp_path / "regency-worker-x", tmp_path / f"other-{gone.pid}-x"]
    for path in unrelated:
        path.mkdir()
    assert remove_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and all(p.exists() for p in unrelated)
