"""Monarch 0.7's HostMesh life cycle on real workers (``ProcessJob``: one
``run_worker_loop_forever`` process per host on this machine): ``async with``, ``initialized``,
``stop()`` that stops only its own mesh's procs and lets the hosts spawn again, unpickled
meshes as references, ``proc_bind`` applied by the worker, and a failed attach that
surfaces on ``initialized`` and first use, as Monarch's test_host_mesh.py and
test_python_actors.py expect."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

from regency.actor import Actor, endpoint
from regency.job import ProcessJob

from ..conftest import pid_alive

ROOT = Path(__file__).resolve().parents[2]
T = 60

pytestmark = pytest.mark.slow


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))


def _pids(mesh: object) -> list[int]:
    return list(mesh.pid.call().get(T).values())  # type: ignore[attr-defined]


def _wait_gone(pids: list[int], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if pid_alive(p)]}"
        time.sleep(0.05)


def _workers(job: ProcessJob) -> list[int]:
    return [pid for pid, _ in job._workers.values()]


def test_async_with_shuts_the_mesh_down_and_later_use_is_refused() -> None:
    job = ProcessJob({"hosts": 1})
    try:
        hosts = job.state(cached_path=None).hosts
        workers = _workers(job)
        assert hosts.initialized.get(T) is True

        async def main() -> list[int]:
            async with hosts as hm:
                assert hm is hosts
                assert await hm.initialized is True
                mesh = hm.spawn_procs(per_host={"gpus": 2}).spawn("pid", Pid)
                return list((await mesh.pid.call()).values())

        pids = trio.run(main)
        assert len(set(pids)) == 2
        _wait_gone(pids)
        _wait_gone(workers)  # shutdown ends run_worker_loop_forever workers
        for use in (
            lambda: hosts.spawn_procs(per_host={"gpus": 1}),
            lambda: hosts.shutdown().get(T),
            lambda: hosts.stop().get(T),
            lambda: hosts.initialized,
            lambda: hosts.slice(hosts=0).spawn_procs(),
        ):
            with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
                use()

        async def again() -> None:
            async with hosts:
                pass

        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            trio.run(again)
    finally:
        job.kill()


def test_stop_stops_only_its_own_procs_and_the_hosts_spawn_again() -> None:
    job = ProcessJob({"hosts": 2})
    try:
        first = job.state(cached_path=None).hosts
        second = job.state(cached_path=None).hosts
        assert first is not second
        mine = _pids(first.spawn_procs(per_host={"gpus": 1}, name="one").spawn("a", Pid))
        # Procs spawned from a slice belong to the sliced mesh too.
        mine += _pids(first.slice(hosts=1).spawn_procs(name="sliced").spawn("b", Pid))
        theirs = _pids(second.spawn_procs(per_host={"gpus": 1}, name="two").spawn("c", Pid))
        first.stop().get(T)
        _wait_gone(mine)
        assert all(pid_alive(p) for p in theirs), "stop() killed another mesh's procs"
        assert second.spawn_procs(name="still").spawn("d", Pid).pid.call().get(T)
        # The first mesh spawns again after stop() (its hosts serve on).
        again = first.spawn_procs(per_host={"gpus": 1}, name="again").spawn("e", Pid)
        assert len(_pids(again)) == 2
        second.stop().get(T)
        first.stop().get(T)
        _wait_gone(theirs)
        # No proc of ours is left: the workers were let go, and are attached again on use.
        assert all(pid_alive(p) for p in _workers(job))
        assert len(_pids(second.spawn_procs(name="back").spawn("f", Pid))) == 2
        second.shutdown().get(T)
        # One shutdown ends the workers for every mesh of them.
        _wait_gone(_workers(job))
    finally:
        job.kill()


def test_an_unpickled_host_mesh_spawns_but_cannot_stop_or_shut_down() -> None:
    job = ProcessJob({"hosts": 1})
    try:
        hosts = job.state(cached_path=None).hosts
        copy = pickle.loads(pickle.dumps(hosts))
        assert copy.initialized.get(T) is True
        pids = _pids(copy.spawn_procs(name="copy").spawn("pid", Pid))
        for what, call in (("shut down", copy.shutdown), ("stop", copy.stop)):
            with pytest.raises(RuntimeError, match=f"cannot {what} `HostMesh` that is a reference"):
                call().get(T)
        assert all(pid_alive(p) for p in pids)
        hosts.shutdown().get(T)  # the original can
        _wait_gone(pids)
    finally:
        job.kill()


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_proc_bind_on_worker_hosts_is_applied_by_the_worker() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
            hosts.spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
        with pytest.raises(ValueError, match=r"proc_bind keys must be among .* \(got \['cpu'\]\)"):
            hosts.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpu": "0"}])
        with pytest.raises(TypeError, match="proc_bind must be a list of dicts"):
            hosts.spawn_procs(per_host={"gpus": 1}, proc_bind={"cpus": "0"})  # type: ignore[arg-type]
        bound = hosts.spawn_procs(
            per_host={"gpus": 2},
            name="bound",
            proc_bind=[{"cpus": str(cpus[0])}, {"cpus": str(cpus[1])}],
        ).spawn("pid", Pid)
        got = bound.affinity.call().get(T)
        assert sorted(tuple(v) for v in got.values()) == sorted(
            [(cpus[0],), (cpus[1],)] * 2
        ), got
        # Unbound procs of the same workers keep every CPU.
        free = hosts.spawn_procs(name="free").spawn("pid", Pid).affinity.call().get(T)
        assert all(v == cpus for v in free.values()), free
    finally:
        job.kill()


def test_a_failed_attach_fails_initialized_and_first_use_naming_the_worker(
    tmp_path: Path,
) -> None:
    unreachable = tmp_path / "never_bound"
    script = textwrap.dedent(
        f"""
        import time
        from regency.actor import attach_to_workers
        from regency.config import configure
        configure(mesh_attach_config_timeout="500ms")
        started = time.monotonic()
        hosts = attach_to_workers(ca="trust_all_connections", workers=["ipc://{unreachable}"])
        print("returned", round(time.monotonic() - started, 1))
        for name, use in (
            ("initialized", lambda: hosts.initialized.get(5)),
            ("spawn_procs", lambda: hosts.spawn_procs()),
            ("slice", lambda: hosts.slice(hosts=0).spawn_procs()),
        ):
            try:
                use()
            except ConnectionError as exc:
                print(name, type(exc).__name__, exc)
        hosts.shutdown().get(5)
        print("shut down")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=T
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("returned") and float(lines[0].split()[1]) < 10, lines
    expected = (
        "ConnectionError attach_to_workers: attach failed: config push failed during attach: "
        f"the worker at unix://{unreachable} did not answer within 0.5 s (attach_timeout)"
    )
    assert lines[1:] == [
        f"initialized {expected}",
        f"spawn_procs {expected}",
        f"slice {expected}",
        "shut down",
    ], done.stdout + done.stderr
