"""Test-wide setup: actor failures that reach the root are recorded, not fatal.

The default ``unhandled_fault_hook`` stops the program, which here would be pytest itself;
tests that check that default run a controller in a subprocess.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
import time
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


#: The prefix of the directories the multi-host tests give their workers as TMPDIR; the
#: pytest process's pid follows, so that a run checks its own and not a concurrent run's.
TEST_WORKER_PREFIX = "regency-test-worker-"
_JOBDIR = re.compile(r"regency-(\d+)-")
#: Seconds the final check gives leftovers to go (a zygote removing a dead controller's job
#: directory, a reaper thread waiting for a child that is exiting) before it names them.
LEFTOVER_GRACE = 5.0


def _stat_fields(pid: str) -> tuple[str, list[bytes]] | None:
    """The name and the fields after it (from the state on) of ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # gone meanwhile
        return None
    name = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
    return name, stat[stat.rindex(b")") + 2 :].split()


def _own_children(keep: set[int]) -> list[str]:
    """This process's children (zombies included), except ``keep``: from ``/proc``, as
    ``pid (name) state``."""
    me = str(os.getpid()).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        fields = _stat_fields(entry)
        if fields is not None and fields[1][1] == me:
            found.append(f"{entry} ({fields[0]}) {fields[1][0].decode()}")
    return found


def _controller_keeps() -> tuple[set[int], set[str]]:
    """What this process's controller legitimately holds until its own exit: its zygote
    (the one started at import while nobody adopted it) and its job directory (both go at
    exit, after the fixtures end)."""
    from regency import _prestart
    from regency.core import _controller, _current
    from regency.core._launcher import ZygoteLauncher

    pids: set[int] = set()
    jobdirs = {jobdir for _, jobdir in _controller._booted.values()}
    early = _prestart._zygote
    if early is not None:
        pids.add(early.popen.pid)
    rt = _current._runtime
    if rt is not None:
        jobdirs.add(rt.jobdir)
        launcher = rt.launcher
        if isinstance(launcher, ZygoteLauncher) and launcher._popen is not None:
            pids.add(launcher._popen.pid)
    return pids, {os.path.realpath(d) for d in jobdirs}


def _leftover_dirs(tmp: str, before: set[str], started: float, keep: set[str]) -> list[str]:
    """What this run left in ``tmp``: its multi-host workers' directories, and job
    directories made during the run whose process is gone (a controller killed by a test
    whose zygote did not remove them) or is this one (a runtime that stopped and left its
    own)."""
    found = []
    me = os.getpid()
    try:
        names = os.listdir(tmp)
    except OSError:
        return found
    for name in names:
        path = os.path.join(tmp, name)
        if name.startswith(f"{TEST_WORKER_PREFIX}{me}-"):
            found.append(path)
            continue
        match = _JOBDIR.match(name)
        if match is None or name in before or os.path.realpath(path) in keep:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue  # removed meanwhile
        if st.st_uid != os.getuid() or st.st_ctime < started or not os.path.isdir(path):
            continue
        owner = int(match.group(1))
        if owner == me or not pid_alive(owner):
            found.append(path)
    return found


@pytest.fixture(autouse=True, scope="session")
def _nothing_left_behind() -> Iterator[None]:
    """Every fixture removes what it creates and waits for what it starts. At the
    end of the session (after every other fixture), the run fails if it left anything:
    directories in the temporary directory (see :func:`_leftover_dirs`), or children of
    this process, running or zombies. Only what this run made counts: directories made
    before it (or by a concurrent run's living processes) do not, nor the controller's own
    zygote and job directory, which go at exit."""
    tmp = tempfile.gettempdir()
    try:
        before = set(os.listdir(tmp))
    except OSError:
        before = set()
    started = time.time() - 1.0  # ctime has a coarser clock than time()
    yield
    if not sys.platform.startswith("linux"):
        return
    deadline = time.monotonic() + LEFTOVER_GRACE
    while True:
        keep_pids, keep_dirs = _controller_keeps()
        children = _own_children(keep_pids)
        dirs = _leftover_dirs(tmp, before, started, keep_dirs)
        if not (children or dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if children or dirs:
        for path in dirs:  # named below; not left for the next run to trip over
            shutil.rmtree(path, ignore_errors=True)
        for child in children:
            if child.endswith(" Z"):
                try:
                    os.waitpid(int(child.split()[0]), os.WNOHANG)
                except ChildProcessError:
                    pass
        pytest.fail(
            "the test run left behind "
            + "; ".join(
                ([f"children of pytest (running or zombies): {', '.join(children)}"]
                 if children else [])
                + ([f"directories: {', '.join(sorted(dirs))}"] if dirs else [])
            ),
            pytrace=False,
        )


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
