"""Jobs on this machine: LocalJob (this host as every mesh) and ProcessJob (one worker
process per host, for trying multi-host programs without a scheduler)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from ..core._hosts import attach_to_workers, new_job_passphrase
from ..core._proc_mesh import this_host
from ._job import BATCH_ENV, DEFAULT_STATE_PATH, BatchJob, JobState, JobTrait, log


def check_meshes(meshes: object, what: str) -> dict[str, int]:
    """``meshes`` must map mesh names (identifiers) to positive host counts."""
    if not isinstance(meshes, dict) or not meshes:
        raise ValueError(
            f"{what}: meshes must be a non-empty dict of mesh name to host count, "
            f"e.g. {{'trainers': 2}} (got {meshes!r})"
        )
    for name, count in meshes.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ValueError(
                f"{what}: mesh names must be identifiers not starting with '_' (they become "
                f"attributes of the job state) (got {name!r})"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(
                f"{what}: the host count of mesh {name!r} must be a positive int (got {count!r})"
            )
    return dict(meshes)


class LocalJob(JobTrait):
    """Every mesh is this host (``this_host()``): switch a job spec to local runs without
    touching the program."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        if isinstance(hosts, str):
            raise TypeError(f"LocalJob: hosts must be a sequence of mesh names (got {hosts!r})")
        check_meshes(dict.fromkeys(hosts, 1), "LocalJob")
        self._host_names = tuple(hosts)
        self._client: subprocess.Popen[bytes] | None = None

    def _create(self, client_script: str | None) -> None:
        if client_script is None:
            return  # this host always exists
        BatchJob(self).dump(DEFAULT_STATE_PATH)
        log_dir = tempfile.mkdtemp(prefix="job_", dir=_logs_dir())
        with (
            open(os.path.join(log_dir, "stdout.log"), "wb") as out,
            open(os.path.join(log_dir, "stderr.log"), "wb") as err,
        ):
            self._client = subprocess.Popen(
                shlex.split(client_script),
                env={**os.environ, BATCH_ENV: "1"},
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        log.info("started %r (pid %d); logs in %s", client_script, self._client.pid, log_dir)

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state["_client"] = None
        return state

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The batch client started by ``apply(client_script=...)``."""
        if self._client is None:
            raise ValueError("this LocalJob runs no batch client: use apply(client_script=...)")
        return self._client

    def _state(self) -> JobState:
        return JobState({name: this_host() for name in self._host_names})

    def can_run(self, spec: JobTrait) -> bool:
        # Nothing to reuse: the spec itself is as good as any cached LocalJob.
        return False

    def _kill(self) -> None:
        pass


def _logs_dir() -> str:
    path = os.path.join(os.path.dirname(DEFAULT_STATE_PATH), "logs")
    os.makedirs(path, exist_ok=True)
    return path


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all held while drawing, so none repeats)."""
    held = [socket.socket() for _ in range(count)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


_WORKER = (
    "from regency.actor import run_worker_loop_forever; "
    "run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"
)


class ProcessJob(JobTrait):
    """One ``run_worker_loop_forever`` process per host, on this machine, on loopback TCP.

    The job secret is drawn per job and given to the workers in their environment only.
    Workers run in their own sessions (a controller that exits does not take them along, so
    a later controller can reuse them through the state file); ``kill()`` ends them.
    """

    def __init__(
        self, meshes: dict[str, int], env: dict[str, str] | None = None, *, lease: float = 10.0
    ) -> None:
        super().__init__()
        self._meshes = check_meshes(meshes, "ProcessJob")
        if not isinstance(lease, int | float) or isinstance(lease, bool) or lease <= 0:
            raise ValueError(f"ProcessJob: lease must be positive seconds (got {lease!r})")
        #: Seconds a worker keeps our procs without hearing from us.
        self._lease = float(lease)
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise TypeError(f"ProcessJob: env must map str to str (got {env!r})")
        self._env = dict(env or {})
        self._secret = ""
        #: host key ("trainers_0") -> (pid, worker address)
        self._workers: dict[str, tuple[int, str]] = {}
        self._log_dir: str | None = None

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise ValueError(
                "ProcessJob runs no batch client: use LocalJob or SlurmJob for "
                "apply(client_script=...)"
            )
        # Applied after Regency started here: this process's secret (one controller, several
        # jobs); else a fresh one, which this process adopts when it attaches.
        self._secret = new_job_passphrase()
        self._log_dir = tempfile.mkdtemp(prefix="regency-process-job-")
        started: list[tuple[str, subprocess.Popen[bytes], str]] = []
        ports = iter(_free_ports(sum(self._meshes.values())))
        try:
            for mesh, count in self._meshes.items():
                for i in range(count):
                    key = f"{mesh}_{i}"
                    address = f"tcp://127.0.0.1:{next(ports)}"
                    with open(os.path.join(self._log_dir, f"{key}.log"), "wb") as out:
                        proc = subprocess.Popen(
                            [sys.executable, "-c", _WORKER.format(address=address)],
                            env={**os.environ, **self._env, "REGENCY_SECRET": self._secret},
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    started.append((key, proc, address))
                    self._workers[key] = (proc.pid, address)
            for key, proc, _address in started:
                self._wait_listening(key, proc)
        except BaseException:
            self._kill()
            raise

    def _wait_listening(self, key: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        assert self._log_dir is not None
        path = os.path.join(self._log_dir, f"{key}.log")
        deadline = time.monotonic() + timeout
        while True:
            with open(path, "rb") as f:
                text = f.read().decode(errors="replace")
            if "listening on" in text:
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {proc.returncode}" if proc.poll() is not None else (
                    f"did not listen within {timeout} s"
                )
                raise RuntimeError(f"ProcessJob: the worker for {key} {why}; its log:\n{text}")
            time.sleep(0.02)

    def _state(self) -> JobState:
        dead = [key for key, (pid, _) in self._workers.items() if not _alive(pid)]
        if dead:
            raise RuntimeError(f"ProcessJob: the workers for {', '.join(dead)} are gone")
        return JobState(
            {
                mesh: attach_to_workers(
                    [self._workers[f"{mesh}_{i}"][1] for i in range(count)],
                    self._secret,
                    name=mesh,
                    lease=self._lease,
                )
                for mesh, count in self._meshes.items()
            }
        )

    def can_run(self, spec: JobTrait) -> bool:
        return (
            isinstance(spec, ProcessJob)
            and spec._meshes == self._meshes
            and spec._env == self._env
            and bool(self._workers)
            and all(_alive(pid) for pid, _ in self._workers.values())
        )

    def _kill(self) -> None:
        stop_groups([pid for pid, _ in self._workers.values()])
        self._workers.clear()
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None


def stop_groups(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM the process groups led by ``pids``, wait up to ``grace`` seconds in all for
    their leaders to exit, then SIGKILL the groups of those still running."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; reaps it when it is our exited child."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
