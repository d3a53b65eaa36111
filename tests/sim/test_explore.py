"""``regency.sim.explore``: many seeds in worker processes, failures with replay lines that
replay, early stopping, progress, shrinking, and ``regency sim explore`` from a shell.

The programs are at the top level of this module: the workers import them by reference.
``buggy_store`` is a primary/backup store with a planted bug (the primary acknowledges a
write before the backup has it, replicating in batches of three), which loses acknowledged
writes when the primary crashes between a batch's first write and its flush;
``fixed_store`` replicates before it acknowledges.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import regency.sim
from regency.actor import Actor, endpoint
from regency.sim import (
    ClogFault,
    CrashHostFault,
    DelayFault,
    ExploreResult,
    Faults,
    FaultSchedule,
    ReplayDiverged,
    explore,
    fault_schedules,
    simulate,
)
from regency.sim._explore import _draw, _search

ROOT = Path(__file__).resolve().parents[2]
#: Random crashes: about a third of the seeds crash the primary mid-batch.
CRASHES = Faults(crash=0.5)


class Backup(Actor):
    def __init__(self) -> None:
        self.data: dict[str, int] = {}

    @endpoint
    async def put_many(self, items: list[tuple[str, int]]) -> None:
        self.data.update(items)

    @endpoint
    async def dump(self) -> dict[str, int]:
        return dict(self.data)


class Primary(Actor):
    def __init__(self, backup: Any, replicate_first: bool) -> None:
        self.backup, self.replicate_first = backup, replicate_first
        self.unreplicated: list[tuple[str, int]] = []

    @endpoint
    async def write(self, key: str, value: int) -> None:
        await trio.sleep(0.1)  # the disk
        self.unreplicated.append((key, value))
        if self.replicate_first or len(self.unreplicated) >= 3:
            await self.flush()

    @endpoint
    async def flush(self) -> None:
        batch, self.unreplicated = self.unreplicated, []
        await self.backup.put_many.call_one(batch)


def _store(hosts: Any, replicate_first: bool) -> int:
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    backup = procs.slice(hosts=1).spawn("explore_backup", Backup)
    primary = procs.slice(hosts=0).spawn("explore_primary", Primary, backup, replicate_first)
    acked: list[str] = []
    try:
        for i in range(8):
            primary.write.call_one(f"k{i}", i).get()
            acked.append(f"k{i}")
        primary.flush.call_one().get()
    except Exception:
        pass  # the primary is gone (or cut off): fail over to the backup
    try:
        have = backup.dump.call_one().get()
    except Exception:
        return -1  # the backup is gone too: nothing to check
    lost = [key for key in acked if key not in have]
    assert not lost, f"the backup lost acknowledged writes {lost}"
    return len(acked)


@pytest.fixture(autouse=True, scope="module")
def _no_forkserver_left() -> Iterator[None]:
    """explore()'s workers fork from multiprocessing's forkserver (and its resource tracker),
    which live as long as the process that started them, for the next explore() to reuse;
    the suite wants no children of pytest left behind, so they go with this module."""
    yield
    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    multiprocessing.resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


def buggy_store(hosts: Any) -> int:
    return _store(hosts, replicate_first=False)


def fixed_store(hosts: Any) -> int:
    return _store(hosts, replicate_first=True)


def dies(hosts: Any) -> None:
    os._exit(3)  # takes the worker process with it


def _lost_writes(result: ExploreResult) -> None:
    for failure in result.failures:
        assert failure.error_type == "builtins.AssertionError", failure.traceback
        assert "the backup lost acknowledged writes" in failure.error


def test_explore_finds_the_planted_bug_with_two_workers_as_in_process() -> None:
    calls: list[tuple[int, int | None, int]] = []
    parallel = explore(
        buggy_store, range(12), hosts=2, faults=CRASHES, workers=2, stop_after=0,
        progress=lambda *args: calls.append(args),
    )
    assert parallel.failures and parallel.runs == 12 and not parallel.stopped
    assert parallel.workers == 2
    _lost_writes(parallel)
    # the progress callback: after each run, (done, total, failures so far)
    assert [done for done, _, _ in calls] == list(range(1, 13))
    assert calls[-1] == (12, 12, len(parallel.failures))
    # the same seeds fail, whatever the workers
    alone = explore(buggy_store, range(12), hosts=2, faults=CRASHES, workers=0, stop_after=0)
    assert [f.seed for f in alone.failures] == [f.seed for f in parallel.failures]
    # (their first lines: pytest rewrites this module's asserts here, not in the workers)
    assert [f.error.splitlines()[0] for f in alone.failures] == [
        f.error.splitlines()[0] for f in parallel.failures
    ]
    failure = parallel.failures[0]
    assert failure.log_tail and failure.faults == CRASHES
    assert failure.replay_line == (
        f"regency.sim.simulate(program, seed={failure.seed}, hosts=2, faults={CRASHES!r})"
    )
    assert f"seed {failure.seed}: AssertionError" in parallel.summary()


def test_stop_after_stops_at_the_first_failing_seeds_in_order() -> None:
    everything = explore(buggy_store, range(12), hosts=2, faults=CRASHES, workers=0, stop_after=0)
    first_two = [f.seed for f in everything.failures[:2]]
    assert len(first_two) == 2
    stopped = explore(buggy_store, range(60), hosts=2, faults=CRASHES, workers=2, stop_after=2)
    assert stopped.stopped and stopped.runs < 60
    assert [f.seed for f in stopped.failures] == first_two


def test_the_replay_line_reproduces_the_failure() -> None:
    found = explore(buggy_store, range(30), hosts=2, faults=CRASHES, workers=2)
    (failure,) = found.failures
    with pytest.raises(AssertionError, match="lost acknowledged writes") as raised:
        failure.replay()
    assert f"replay: {failure.replay_line}" in getattr(raised.value, "__notes__", [])
    assert str(raised.value).splitlines()[0] == failure.error.splitlines()[0][16:]
    # the line itself, evaluated as printed (the schedule's repr reads back)
    namespace = {name: getattr(regency.sim, name) for name in regency.sim.__all__}
    namespace.update(regency=regency, program=buggy_store)
    with pytest.raises(AssertionError, match="lost acknowledged writes"):
        eval(failure.replay_line, namespace)


def test_a_replay_that_passes_is_reported() -> None:
    found = explore(buggy_store, range(30), hosts=2, faults=CRASHES, workers=0)
    (failure,) = found.failures
    passing = type(failure)(
        failure.seed, failure.error, failure.error_type, failure.traceback, failure.log_tail,
        failure.arguments, fixed_store,
    )
    with pytest.raises(ReplayDiverged, match="passed when run again"):
        passing.replay()


def test_a_clean_program_passes_twenty_seeds() -> None:
    result = explore(fixed_store, range(20), hosts=2, faults=CRASHES, workers=2)
    assert result.ok and result.runs == 20 and result.total == 20 and not result.stopped
    assert result.events > 0 and result.seeds_per_second > 0
    assert "no failures" in result.summary()


def test_a_fault_schedules_failure_is_shrunk() -> None:
    strategy = fault_schedules(2, crashes=True, horizon=1.0)
    result = explore(buggy_store, range(30), hosts=2, faults=strategy, workers=2, shrink_seconds=20)
    (failure,) = result.failures
    assert isinstance(failure.faults, FaultSchedule)
    assert failure.faults == _draw(strategy, failure.seed)  # the seed's own schedule
    # searching with the seed meets that schedule again: shrinking starts from it
    assert _search(strategy, failure.seed, failure.faults.__eq__, shrink=False) == failure.faults
    shrunk = failure.shrunk
    assert shrunk is not None, failure.shrink_note
    assert shrunk.seed == failure.seed and shrunk.error_type == failure.error_type
    assert isinstance(shrunk.faults, FaultSchedule)
    assert len(shrunk.faults.faults) <= len(failure.faults.faults)
    assert f"shrunk: {shrunk.replay_line}" in failure.describe()
    with pytest.raises(AssertionError, match="lost acknowledged writes"):
        shrunk.replay()


def test_shrink_true_shrinks_a_fixed_schedule() -> None:
    schedule = FaultSchedule(
        Faults(clog=0.3, mean_duration=0.05),
        (
            DelayFault(0.1, "controller", "host1", 0.01, 0.2),
            ClogFault(0.2, "host1", 0.05),
            CrashHostFault(0.45, "host0"),
        ),
    )
    result = explore(
        buggy_store, range(30), hosts=2, faults=schedule, workers=0, shrink=True,
    )
    (failure,) = result.failures
    shrunk = failure.shrunk
    assert shrunk is not None, failure.shrink_note
    assert isinstance(shrunk.faults, FaultSchedule)
    assert len(shrunk.faults.faults) <= 3 and shrunk.faults != schedule
    assert any(isinstance(f, CrashHostFault) for f in shrunk.faults.faults)
    with pytest.raises(AssertionError, match="lost acknowledged writes"):
        simulate(buggy_store, seed=shrunk.seed, hosts=2, faults=shrunk.faults)


def test_a_program_workers_cannot_import_is_refused_with_a_fix() -> None:
    with pytest.raises(TypeError, match=r"is a lambda.*top level of a module.*workers=0"):
        explore(lambda hosts: None, range(2), workers=2)

    def nested(hosts: Any) -> None:
        pass

    with pytest.raises(TypeError, match="defined inside another function"):
        explore(nested, range(2), workers=2)


def test_a_notebook_program_is_refused_with_a_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def program(hosts: Any) -> None:
        pass

    program.__module__, program.__qualname__ = "__main__", "program"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__
    with pytest.raises(TypeError, match=r"__main__ of an interactive session.*programs\.py"):
        explore(program, range(2), workers=2)


def test_workers_zero_runs_in_this_process_so_a_lambda_will_do() -> None:
    seen: list[int] = []
    result = explore(
        lambda hosts: len(hosts), range(3), hosts=1, workers=0,
        progress=lambda done, total, failures: seen.append(done),
    )
    assert result.ok and result.runs == 3 and result.workers == 0 and seen == [1, 2, 3]


def test_a_run_that_kills_its_worker_is_a_failure() -> None:
    result = explore(dies, range(3), hosts=1, workers=1, stop_after=0)
    assert [f.seed for f in result.failures] == [0, 1, 2]
    assert all("WorkerDied" in f.error and "status 3" in f.error for f in result.failures)


def test_each_seed_draws_its_own_schedule_again_and_again() -> None:
    strategy = fault_schedules(4, crashes=True)
    drawn = [_draw(strategy, seed) for seed in range(8)]
    assert drawn == [_draw(strategy, seed) for seed in range(8)]
    assert len({repr(schedule) for schedule in drawn}) == 8
    assert sum(bool(schedule.faults) for schedule in drawn) >= 4  # not just the simplest


def test_the_command_line_exits_1_and_prints_a_replay_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "regency", "sim", "explore", f"{__name__}:buggy_store",
         "--seeds", "30", "--hosts", "2", "--workers", "2", "--faults", "Faults(crash=0.5)"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failure (stopped early)" in run.stdout
    assert "replay: regency.sim.simulate(program, seed=" in run.stdout
    command = next(line for line in run.stdout.splitlines() if "; run: python -c" in line)
    code = command.split("; run: python -c ", 1)[1]
    assert code.startswith('"') and code.endswith('"')  # a shell word as it stands
    with pytest.raises(AssertionError, match="the backup lost acknowledged writes"):
        exec(code[1:-1], {})


def test_the_command_line_refuses_what_it_cannot_import(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from regency.__main__ import main

    assert main(["sim", "explore", "no_such_module:program"]) == 2
    assert "regency sim: cannot import no_such_module:program" in capsys.readouterr().err
    assert main(["sim", "explore", f"{__name__}:buggy_store", "--faults", "Faults(crash=-1)"]) == 2
    assert "--faults 'Faults(crash=-1)': ValueError" in capsys.readouterr().err
