"""No proc outlives its controller, and bad input to a proc loses nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import trio

from regency.actor import ProcMesh, SupervisionError, this_host
from regency.core import current_runtime
from regency.transports import AuthenticationError, Connection, open_transport

from ..conftest import SpawnProcs
from ..conftest import pid_alive as _alive
from .actors import Counter

#: Real processes: the slow tier (pytest -m "not slow" skips it).
pytestmark = pytest.mark.slow


T = 30

CONTROLLER = textwrap.dedent(
    """
    import os, sys, time
    from regency.actor import this_host
    from tests.core.actors import Where
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    pids = [v["pid"] for v in pm.spawn("w", Where).where.call().get(30).values()]
    print(" ".join(map(str, pids)), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(600)
    """
)




def _start_controller(mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2, f"controller printed {line!r}"
    return proc, pids


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_procs_exit_within_5s_of_controller_sigkill() -> None:
    proc, pids = _start_controller("sleep")
    assert all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_gone(pids, 5.0) == []


def test_procs_exit_when_controller_returns() -> None:
    proc, pids = _start_controller("exit")
    assert proc.wait(timeout=T) == 0
    assert _wait_gone(pids, 5.0) == []


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        pm.initialized.get(T)
        yield pm
    finally:
        pm.stop().get(T)


class _Quiet:
    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        pass

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


async def test_bad_frames_close_one_connection_and_the_proc_keeps_serving(
    procs: ProcMesh,
) -> None:
    counters = procs.spawn("survivor", Counter, 1)
    address = procs._procs[0][1]
    rt = current_runtime()
    async with open_transport(rt.secret) as transport:
        for garbage in (b"", b"\x00" * 3, b"\xff\xff\xff\x7f" + b"x" * 10, b"\x05\x00\x00\x00notapickle"):
            conn = await transport.connect(address, _Quiet())
            conn.send_nowait(garbage)
            with trio.fail_after(T):
                while not conn.closed:
                    await trio.sleep(0.01)
        async with open_transport(b"not the job secret!!") as impostor:
            with pytest.raises(AuthenticationError):
                await impostor.connect(address, _Quiet())
    assert await counters.value.call() is not None
    assert (await counters.value.call()).values() == [1, 1]


def test_calls_to_a_killed_proc_fail_instead_of_hanging(spawn_procs: SpawnProcs) -> None:
    from .actors import Mixed, Where

    pm = spawn_procs(per_host={"gpus": 2})
    where = pm.spawn("where", Where).where.call().get(T)
    victim = where.values()[1]["pid"]
    slow = pm.spawn("slow", Mixed)
    in_flight = slow.slice(gpus=1).slow_sync.call_one(60)
    survivor = slow.slice(gpus=0).slow_sync.call_one(0.01)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(
        SupervisionError, match=r"slow.slow_sync\(\) failed, The actor <.*> at rank 1 .*: proc \S+ was killed by signal 9"
    ):
        in_flight.get(10)
    with pytest.raises(SupervisionError):
        slow.slice(gpus=1).slow_sync.call_one(0).get(10)
    # The other proc is unaffected.
    assert survivor.get(T) == "sync"
    assert slow.slice(gpus=0).slow_sync.call_one(0).get(T) == "sync"
    pm.stop().get(T)
