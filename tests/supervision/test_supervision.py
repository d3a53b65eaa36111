"""Supervision with real processes: every failure kind, handled, unhandled and nested."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from regency.actor import SupervisionError

from ..conftest import RootFailures, SpawnProcs
from ..conftest import pid_alive as _alive
from .actors import AsyncManager, Level, Manager, Tidy, Worker

#: Real processes: the slow tier (pytest -m "not slow" skips it).
pytestmark = pytest.mark.slow


T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_broadcast_exception_fails_one_rank_and_the_rest_serve(
    spawn_procs: SpawnProcs, roots: RootFailures
) -> None:
    pm = spawn_procs(per_host={"gpus": 8})
    workers = pm.spawn("eight", Worker)
    workers.explode_if.broadcast(5)
    failure = roots.wait_for("eight")
    assert failure.ranks == (5,)
    assert "endpoint eight.explode_if raised with no caller waiting" in failure.cause.summary
    assert "RuntimeError: rank 5 exploded" in failure.cause.summary
    assert 'raise RuntimeError(f"rank {rank} exploded")' in failure.cause.traceback
    assert "actor mesh eight failed at rank(s) 5" in failure.report()
    # The other seven keep serving; the failed rank fails fast, as does any slice holding it.
    healthy = workers.slice(gpus=slice(0, 5))
    assert healthy.work.call().get(T).values() == [0, 1, 2, 3, 4]
    assert workers.slice(gpus=slice(6, 8)).work.call().get(T).values() == [6, 7]
    with pytest.raises(SupervisionError, match=r'failure on mesh "eight" at rank 5 with event: The actor .* and all its descendants have failed: endpoint'):
        workers.slice(gpus=5).work.call_one().get(T)
    with pytest.raises(SupervisionError, match='failure on mesh "eight" at rank 5'):
        workers.work.call().get(T)
    # Another mesh on the same procs keeps working, except on the poisoned proc.
    others = pm.slice(gpus=slice(0, 5)).spawn("others", Worker)
    assert len(others.work.call().get(T)) == 5
    assert len(roots.of("eight")) == 1
    pm.stop().get(T)


@pytest.mark.parametrize(
    ("endpoint", "args", "code"),
    [("exit_process", (3,), 3), ("segfault", (), -signal.SIGSEGV)],
    ids=["os._exit", "segfault"],
)
def test_proc_death_fails_calls_and_reaches_the_owner(
    spawn_procs: SpawnProcs, roots: RootFailures, endpoint: str, args: tuple[int, ...], code: int
) -> None:
    pm = spawn_procs(per_host={"gpus": 2})
    name = f"dies_by_{endpoint}"
    workers = pm.spawn(name, Worker)
    busy = workers.slice(gpus=1).work.call_one(30)
    # Another actor on the same proc takes it down while `busy` is in flight.
    killers = pm.spawn(f"{name}_killer", Worker)
    getattr(killers.slice(gpus=1), endpoint).broadcast(*args)
    with pytest.raises(SupervisionError, match=r"\(\) failed, The actor <.*> at rank 1 and all its descendants have failed: proc \S+ (exited|was killed)"):
        busy.get(T)
    failure = roots.wait_for(name)
    assert failure.ranks == (1,)
    assert failure.cause.exit_code == code
    assert workers.slice(gpus=0).work.call_one().get(T) == 0
    pm.stop().get(T)


def test_kill_9_under_load(spawn_procs: SpawnProcs, roots: RootFailures) -> None:
    pm = spawn_procs(per_host={"gpus": 2})
    workers = pm.spawn("killed", Worker)
    victim = workers.slice(gpus=0).pid.call_one().get(T)
    in_flight = [workers.slice(gpus=0).work.call_one(0.001) for _ in range(200)]
    os.kill(victim, signal.SIGKILL)
    errors = 0
    for fut in in_flight:
        try:
            fut.get(T)
        except SupervisionError as e:
            assert "killed by signal 9 (SIGKILL)" in str(e)
            errors += 1
    assert errors > 0
    assert roots.wait_for("killed").cause.exit_code == -9
    assert workers.slice(gpus=1).work.call_one().get(T) == 1
    pm.stop().get(T)


def test_init_failure_reaches_the_owner(spawn_procs: SpawnProcs, roots: RootFailures) -> None:
    pm = spawn_procs(per_host={"gpus": 2})
    pm.spawn("badinit", Worker, True)
    failure = roots.wait_for("badinit")
    assert "__init__ raised builtins.ValueError: worker refused to start" in str(failure)
    pm.stop().get(T)


def test_supervise_handles_a_child_failure(spawn_procs: SpawnProcs, roots: RootFailures) -> None:
    pm = spawn_procs(per_host={"m": 1})
    manager = pm.spawn("handler", Manager, "handle")
    manager.break_worker.call_one(1).get(T)
    deadline = time.monotonic() + T
    while not (seen := manager.seen_failures.call_one().get(T)):
        assert time.monotonic() < deadline
    assert seen == ["workers:[1]:endpoint workers.explode_if raised with no caller waiting: "
                    "builtins.RuntimeError: rank 1 exploded"]
    assert roots.of("handler") == [] and roots.of("workers") == []
    # The manager lives on; its healthy worker too.
    assert manager.seen_failures.call_one().get(T) == seen
    pm.stop().get(T)


def test_async_supervise(spawn_procs: SpawnProcs, roots: RootFailures) -> None:
    pm = spawn_procs(per_host={"m": 1})
    manager = pm.spawn("amanager", AsyncManager)
    manager.break_worker.call_one().get(T)
    deadline = time.monotonic() + T
    while not manager.seen_failures.call_one().get(T):
        assert time.monotonic() < deadline
    assert manager.seen_failures.call_one().get(T) == [0]
    assert roots.of("amanager") == []
    pm.stop().get(T)


@pytest.mark.parametrize("policy", ["ignore", "raise", "exit"])
def test_unhandled_child_failure_escalates_to_the_root(
    spawn_procs: SpawnProcs, roots: RootFailures, policy: str
) -> None:
    pm = spawn_procs(per_host={"m": 1})
    name = f"manager_{policy}"
    manager = pm.spawn(name, Manager, policy)
    worker_pids = manager.worker_pids.call_one().get(T)
    manager.break_worker.call_one(0).get(T)
    failure = roots.wait_for(name)
    assert failure.ranks == (0,)
    if policy == "ignore":
        assert "unhandled failure of a mesh it owns" in failure.cause.summary
    elif policy == "raise":
        assert "__supervise__ raised" in failure.cause.summary
        assert "supervisor gave up" in failure.cause.traceback
    else:
        assert "__supervise__ raised" in failure.cause.summary
        assert "SystemExit" in failure.cause.traceback
    chained = failure.cause.chained
    assert chained is not None and chained.mesh_name == "workers"
    assert "rank 0 exploded" in failure.report()
    # The failed manager's own procs (and so its workers) were stopped, bottom-up.
    deadline = time.monotonic() + T
    while any(_alive(p) for p in worker_pids):
        assert time.monotonic() < deadline, "the failed owner's procs are still alive"
        time.sleep(0.05)
    pm.stop().get(T)


def test_three_levels_of_owners(spawn_procs: SpawnProcs, roots: RootFailures) -> None:
    pm = spawn_procs(per_host={"p": 1})
    top = pm.spawn("level3", Level, 3)
    pids = top.pids.call_one().get(T)
    assert len(set(pids)) == 3
    top.fail_at_bottom.call_one().get(T)
    failure = roots.wait_for("level3")
    report = failure.report()
    assert "the bottom level failed" in report
    inner = failure.cause.chained
    assert inner is not None and inner.mesh_name == "level2"
    assert inner.cause.chained is not None and inner.cause.chained.mesh_name == "level1"
    pm.stop().get(T)


def test_cleanup_runs_on_stop_and_on_failure(spawn_procs: SpawnProcs, roots: RootFailures) -> None:
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        pm = spawn_procs(per_host={"gpus": 2})
        tidy = pm.spawn("tidy", Tidy, log.name)
        tidy.slice(gpus=1).fail.broadcast()
        roots.wait_for("tidy")
        tidy.slice(gpus=0).stop().get(T)
        # The owner hears of rank 1's failure before rank 1's __cleanup__ has run (on
        # another proc): wait for its line, bounded, rather than race it.
        deadline = time.monotonic() + T
        while len(Path(log.name).read_text().splitlines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        lines = sorted(Path(log.name).read_text().splitlines())
        assert lines == ["cleanup 0 None", "cleanup 1 KeyError"]
        pm.stop().get(T)


def test_a_stuck_proc_is_found_by_heartbeat(
    spawn_procs: SpawnProcs, roots: RootFailures, configured: Callable[..., None]
) -> None:
    configured(heartbeat_interval=0.1, heartbeat_timeout=1.0)
    pm = spawn_procs(per_host={"gpus": 1})
    workers = pm.spawn("stuck", Worker)
    workers.work.call_one().get(T)
    hung = workers.hang_the_loop.call_one(60)
    with pytest.raises(SupervisionError, match="sent no heartbeat for"):
        hung.get(T)
    assert "stuck" in roots.wait_for("stuck").cause.summary




UNHANDLED = textwrap.dedent(
    """
    import sys, time
    from regency.actor import this_host
    from tests.supervision.actors import Worker
    workers = this_host().spawn_procs(per_host={"gpus": 2}).spawn("doomed", Worker)
    print(" ".join(str(p) for p in workers.pid.call().get(30).values()), flush=True)
    workers.explode_if.broadcast(1)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    else:
        workers.slice(gpus=0).work.call_one(60).get()
    print("main thread woke up: the fault did not stop the program", flush=True)
    """
)


@pytest.mark.parametrize("blocked_in", ["sleep", "get"])
def test_unhandled_failure_stops_the_program_within_5s(blocked_in: str) -> None:
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", UNHANDLED, blocked_in],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "main thread woke up" not in out
    assert "Regency: MeshFailure: actor mesh doomed failed at rank(s) 1" in err
    assert "RuntimeError: rank 1 exploded" in err
    assert "owners: client" in err
    assert "UnhandledFault" in err
    assert elapsed < 15  # startup included; the fault itself stops the program in < 5 s
    for pid in map(int, out.split()):
        assert not _alive(pid)
