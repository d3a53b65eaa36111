"""The runtime's own warnings inside ``simulate()`` go to the run's log, not to stderr.

Under the faults a sweep asks for, the runtime warns as it should (reconnects, procs killed as
stuck, actor failures that reach the root): on hundreds of seeds that drowned the output. A
run keeps them in ``SimResult.log``, stamped with virtual time; a failed run's exception
shows them; ``log=True`` prints them; and a sweep whose runs pass prints nothing.
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import regency.actor
from regency.core import _oversight
from regency.sim import Faults, InvariantViolation, current, simulate

from ..conftest import RootFailures
from .actors import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAULTS = Faults(
    crash=0.15, pause=0.3, disconnect=0.3, partition=0.2, clog=0.2, delay=0.2, mean_duration=3.0
)
ENTRY = re.compile(r"\d+\.\d{9} (DEBUG|INFO|WARNING|ERROR|CRITICAL) regency[\w.]*: ")


def sweep_program(hosts: Any) -> list[object]:
    counters = hosts.spawn_procs(per_host={"gpus": 2}).spawn("swept", Counter)
    seen: list[object] = []
    for _ in range(5):
        try:
            seen.append(sum(counters.incr.call().get(timeout=600).values()))
            counters.slice(hosts=0, gpus=0).nap.call_one(1.0).get(timeout=600)
        except Exception as exc:
            seen.append(type(exc).__name__)
    return seen


@contextmanager
def unconfigured_logging() -> Iterator[None]:
    """Logging as in a plain script that never configured it (no handler on the root, so
    Python's last resort prints warnings to stderr), and the default unhandled fault hook,
    for the length of the block; as the test suite had them afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hook = regency.actor.unhandled_fault_hook
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    regency.actor.unhandled_fault_hook = _oversight.default_unhandled_fault_hook
    try:
        yield
    finally:
        regency.actor.unhandled_fault_hook = hook
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_sweep_with_random_faults_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    logs: list[tuple[str, ...]] = []
    with unconfigured_logging():
        logging.getLogger("regency.elsewhere").warning("before: this one is printed")
        capfd.readouterr()
        for seed in range(50):
            logs.append(simulate(sweep_program, seed=seed, hosts=3, faults=FAULTS, buggify=None).log)
        out, err = capfd.readouterr()
    assert err == "" and out == "", err[:3000]
    entries = [entry for log in logs for entry in log]
    # The sweep had plenty to say, all of it in the runs' logs.
    assert sum(1 for log in logs if log) >= 10, logs
    assert all(ENTRY.match(entry) for entry in entries), entries[:5]
    said = "\n".join(entries)
    assert "reached the root unhandled" in said and "Regency: MeshFailure" in said
    assert "regency.stall" in said or "stuck" in said


def stuck_program(hosts: Any) -> None:
    counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("logged", Counter)
    counters.value.call().get()
    current().pause_proc(counters._procs[0][1], 30.0)  # stuck: killed after 10 s
    try:
        counters.incr.call().get()
    except Exception:
        pass


def test_the_log_is_in_virtual_time_and_replays(roots: RootFailures) -> None:
    first = simulate(stuck_program, seed=2, hosts=2)
    again = simulate(stuck_program, seed=2, hosts=2)
    assert first.log == again.log
    assert first.log and all(ENTRY.match(entry) for entry in first.log), first.log
    times = [float(entry.split(" ", 1)[0]) for entry in first.log]
    assert times == sorted(times) and times[-1] >= 10.0, first.log  # virtual, not real time
    assert any("stuck" in entry for entry in first.log), first.log


def test_log_true_prints_each_entry_as_it_is_written(
    capfd: pytest.CaptureFixture[str], roots: RootFailures
) -> None:
    stream = io.StringIO()
    result = simulate(stuck_program, seed=3, hosts=2, log=stream)
    assert result.log
    assert stream.getvalue() == "".join(entry + "\n" for entry in result.log)
    capfd.readouterr()
    again = simulate(stuck_program, seed=3, hosts=2, log=True)
    assert again.log == result.log
    assert capfd.readouterr().err == stream.getvalue()


def test_a_failed_run_shows_its_log(roots: RootFailures) -> None:
    def program(hosts: Any) -> None:
        counters = hosts.spawn_procs(per_host={"gpus": 1}).spawn("failing", Counter)
        counters.value.call().get()
        current().pause_proc(counters._procs[1][1], 30.0)
        try:
            counters.incr.call().get()
        except Exception:
            pass
        raise RuntimeError("the program's own check failed")

    with pytest.raises(RuntimeError, match="own check failed") as info:
        simulate(program, seed=2, hosts=2)
    notes = info.value.__notes__
    log: tuple[str, ...] = info.value.sim_log  # type: ignore[attr-defined]
    assert log and any("stuck" in entry for entry in log)
    shown = next(note for note in notes if note.startswith("the run's log"))
    assert all(entry.splitlines()[0] in shown for entry in log)
    assert notes[-1].startswith("replay: ")  # the replay line stays last


def test_a_violation_carries_the_log(
    monkeypatch: pytest.MonkeyPatch, roots: RootFailures
) -> None:
    original = _oversight.Oversight._perform

    def twice(self: Any, action: Any) -> None:
        original(self, action)
        if type(action).__name__ == "Notify":
            original(self, action)

    monkeypatch.setattr(_oversight.Oversight, "_perform", twice)

    class Boss(Counter):
        def __init__(self) -> None:
            super().__init__()
            self.told = 0

        def __supervise__(self, failure: Any) -> bool:
            self.told += 1
            return True

    from regency.actor import endpoint

    class Owner(Boss):
        @endpoint
        def build(self, hosts: Any) -> None:
            self.counters = hosts.spawn_procs().spawn("owned", Counter)
            self.counters.value.call().get()

    def program(hosts: Any) -> None:
        owner = hosts.slice(hosts=0).spawn_procs().spawn("owner", Owner)
        owner.build.call_one(hosts.slice(hosts=1)).get()
        procs = [p for p in current().procs if p.startswith("sim://host1/")]
        current().crash_proc(procs[0])
        owner.nap.call_one(5.0).get()

    with pytest.raises(InvariantViolation, match="twice") as info:
        simulate(program, seed=1, hosts=2)
    assert isinstance(info.value.sim_log, tuple)  # type: ignore[attr-defined]


def test_records_of_other_threads_are_left_alone(capfd: pytest.CaptureFixture[str]) -> None:
    def program(hosts: Any) -> None:
        elsewhere = threading.Thread(
            target=lambda: logging.getLogger("regency.elsewhere").warning("not the simulation's")
        )
        elsewhere.start()
        elsewhere.join()
        logging.getLogger("regency.inside").warning("the simulation's")

    with unconfigured_logging():
        capfd.readouterr()
        result = simulate(program, seed=1, hosts=1)
        err = capfd.readouterr().err
    assert err == "not the simulation's\n"
    assert [entry.split(" ", 1)[1] for entry in result.log] == [
        "WARNING regency.inside: the simulation's"
    ]


def test_configured_handlers_still_get_the_records(caplog: pytest.LogCaptureFixture) -> None:
    def program(hosts: Any) -> None:
        logging.getLogger("regency.inside").warning("for whoever configured logging")

    with caplog.at_level(logging.WARNING, logger="regency"):
        result = simulate(program, seed=1, hosts=1)
    assert "for whoever configured logging" in caplog.text
    assert len(result.log) == 1


def test_a_sweep_in_a_fresh_interpreter_prints_nothing() -> None:
    script = textwrap.dedent(
        """
        import sys
        from regency.sim import simulate
        from tests.sim.test_run_log import FAULTS, sweep_program

        entries = 0
        for seed in range(12):
            entries += len(simulate(sweep_program, seed=seed, hosts=3, faults=FAULTS).log)
        print(entries)
        """
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("REGENCY_RUNTIME", None)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert int(done.stdout) > 0  # there was something to keep quiet
