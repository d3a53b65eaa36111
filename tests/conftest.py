"""Test-wide setup: actor failures that reach the root are recorded, not fatal.

The default ``unhandled_fault_hook`` stops the program, which here would be pytest itself;
tests that check that default run a controller in a subprocess.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

import regency
import regency.actor
from regency.actor import HostMesh, ProcMesh, this_host
from regency.core import _config
from regency.supervision import MeshFailure

# Hypothesis: the suite (and CI) runs the same examples every time, so its verdict depends
# on the code, not on what one run happened to draw; a property test's explicit settings
# (max_examples, deadline) still apply. To search afresh for new counterexamples:
# REGENCY_HYPOTHESIS=explore pytest ...
settings.register_profile("suite", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("REGENCY_HYPOTHESIS", "suite"))


class RootFailures:
    """Every MeshFailure that reached the root, with a way to wait for one."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []
        self._changed = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._changed:
            self.failures.append(failure)
            self._changed.notify_all()

    def wait_for(self, mesh_name: str, timeout: float = 20.0) -> MeshFailure:
        def found() -> MeshFailure | None:
            return next((f for f in self.failures if f.mesh_name == mesh_name), None)

        with self._changed:
            if not self._changed.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"no failure of mesh {mesh_name!r} reached the root")
            result = found()
            assert result is not None
            return result

    def of(self, mesh_name: str) -> list[MeshFailure]:
        return [f for f in self.failures if f.mesh_name == mesh_name]


#: Known to the multi-host tests' workers; set before anything starts the runtime.
TEST_SECRET = "regency-test-suite-job-secret"
os.environ.setdefault("REGENCY_SECRET", TEST_SECRET)

root_failures = RootFailures()


#: Fixtures that start real processes: a test using one is in the slow tier, marked or not.
_REAL_PROCESS_FIXTURES = frozenset({"spawn_procs", "peers", "victim", "procs", "mesh", "workers"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _REAL_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="session")
def _record_root_failures() -> Iterator[None]:
    regency.actor.unhandled_fault_hook = root_failures
    yield


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped meanwhile (reading says ESRCH)
        return False


def stop_and_wait(pid: int, within: float = 30.0) -> None:
    """SIGSTOP ``pid`` and return once the kernel reports it stopped. A stop takes effect when
    one of its threads dequeues the signal, which on a loaded machine can be milliseconds
    later; an idle actor thread that reads its own calls could still answer meanwhile."""
    import signal
    import time

    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within
    while True:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(") ", 1)[1][0] == "T":
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {pid} did not stop within {within} s of SIGSTOP")
        time.sleep(0.001)  # an OS state with no event to wait on


@pytest.fixture
def roots() -> RootFailures:
    return root_failures




#: ``spawn_procs(per_host, on=host_mesh, **options)``: see the fixture of that name.
SpawnProcs = Callable[..., ProcMesh]


@pytest.fixture
def spawn_procs() -> Iterator[SpawnProcs]:
    """``this_host().spawn_procs(...)`` (or ``on.spawn_procs(...)``) for one test: every proc
    mesh it made is stopped when the test ends, passed or failed, so no proc outlives the
    test that started it (cleanup does not rest on the interpreter's exit)."""
    made: list[ProcMesh] = []

    def spawn(per_host: dict[str, int] | None = None, on: HostMesh | None = None,
              **options: Any) -> ProcMesh:
        pm = (on if on is not None else this_host()).spawn_procs(per_host=per_host, **options)
        made.append(pm)
        return pm

    try:
        yield spawn
    finally:
        stops = []
        for pm in reversed(made):
            try:
                stops.append(pm.stop())
            except Exception:  # the runtime itself is gone
                pass
        for stop in stops:
            try:
                stop.get(30)
            except Exception:
                pass


@pytest.fixture
def configured() -> Iterator[Callable[..., None]]:
    """``regency.configure`` for one test; the configuration as it was comes back after it,
    whatever the test set (no test resets settings to hard-coded defaults)."""
    with _config.overridden():
        yield regency.configure
