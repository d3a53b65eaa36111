"""JobTrait, JobState and the job state file: Monarch's job model.

A job is a declarative spec (which meshes, how many hosts each) plus, once applied, the
scheduler's handle on it (an allocation id, worker pids, ...). ``apply()`` brings the spec
into existence; ``state()`` attaches to its workers and returns one ``HostMesh`` per mesh.
``state()`` also caches the applied job in a file (``.regency/job_state.pkl``, mode 0600: it
holds the job secret) so that a later controller with an equal spec reuses a live allocation
instead of asking for a new one.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import uuid
from abc import ABC, abstractmethod
from typing import Any, Literal

import attrs

from ..core._proc_mesh import HostMesh

log = logging.getLogger("regency.job")

#: Where ``state()`` caches the applied job, relative to the working directory.
DEFAULT_STATE_PATH = ".regency/job_state.pkl"

#: Set to "1" in the client that batch mode runs inside the allocation.
BATCH_ENV = "REGENCY_BATCH_JOB"


def in_batch_job() -> bool:
    """True in the client that ``apply(client_script=...)`` runs inside the allocation."""
    return os.environ.get(BATCH_ENV) == "1"


class JobState:
    """The meshes of a running job: one ``HostMesh`` attribute per mesh of the spec."""

    def __init__(self, hosts: dict[str, HostMesh]) -> None:
        self._hosts = dict(hosts)

    def __getattr__(self, name: str) -> HostMesh:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._hosts[name]
        except KeyError:
            raise AttributeError(
                f"this job has no mesh named {name!r} (meshes: {', '.join(self._hosts)})"
            ) from None

    @property
    def meshes(self) -> dict[str, HostMesh]:
        """Every mesh by name, in the spec's order."""
        return dict(self._hosts)

    def __repr__(self) -> str:
        return f"JobState({self._hosts!r})"


@attrs.frozen
class _Cached:
    """The job was found running in the state file; ``job`` is that applied job."""

    job: JobTrait


class JobTrait(ABC):
    """A job spec, and its scheduler state once applied.

    Subclasses implement ``_create`` (ask the scheduler), ``_state`` (attach to the workers),
    ``can_run`` (may this applied job serve that spec?) and ``_kill``.
    """

    def __init__(self) -> None:
        self._status: Literal["not_running", "running"] | _Cached = "not_running"
        self._apply_id: str | None = None
        #: The meshes of each ``state()`` call of this process (never pickled).
        self._attached: list[JobState] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_attached"] = []
        return state

    # -- Monarch's surface ---------------------------------------------------------------

    @property
    def _running(self) -> JobTrait | None:
        if self._status == "running":
            return self
        if isinstance(self._status, _Cached):
            return self._status.job
        return None

    @property
    def active(self) -> bool:
        """True once applied (or connected to a cached applied job), until ``kill()``."""
        return self._running is not None

    @property
    def apply_id(self) -> str | None:
        """A fresh id per allocation made by ``apply()``; None before."""
        running = self._running
        return running._apply_id if running is not None else None

    def apply(self, client_script: str | None = None) -> None:
        """Ask the scheduler for the job as specified; a no-op when already applied.

        With ``client_script`` (a command line, e.g. ``"python train.py"``) the job runs that
        client inside the allocation (batch mode): its ``state()`` attaches to this very
        allocation, and the workers are torn down when it ends.
        """
        if client_script is not None and (
            not isinstance(client_script, str) or not client_script.strip()
        ):
            raise ValueError(
                f"client_script must be a command line such as 'python train.py' "
                f"(got {client_script!r})"
            )
        if self._running is None:
            self._create(client_script)
            self._apply_id = str(uuid.uuid4())
            self._status = "running"

    def state(self, cached_path: str | None = DEFAULT_STATE_PATH) -> JobState:
        """Attach to the job's workers; return one ``HostMesh`` per mesh. Each call attaches
        again and returns new meshes (as Monarch's): stopping one leaves the others' procs
        alone.

        Not yet applied: with ``cached_path``, a job cached there that is still live and
        ``can_run`` this spec is reused; otherwise this job is applied and cached there.
        """
        running = self._running
        if running is None:
            cached = _load_cached(cached_path, self)
            if cached is not None:
                log.info("reusing the job cached in %s", cached_path)
                self._status = _Cached(cached)
                running = cached
            else:
                self.apply()
                running = self
                if cached_path is not None:
                    self.dump(cached_path)
        try:
            attached = running._state()
        except RuntimeError as exc:
            if "is not the one this process started Regency with" not in str(exc):
                raise
            if running is self:
                raise RuntimeError(
                    f"{type(self).__name__}.state(): this job was applied before Regency "
                    "started in this process, with a job secret of its own, and Regency then "
                    "started with another (or with one given as bytes, which a job cannot "
                    "hand on). Call state() right after apply(), before anything else starts "
                    "Regency, or apply the job after Regency started: it then gets this "
                    "process's secret"
                ) from exc
            raise RuntimeError(
                f"{type(self).__name__}.state(): the job cached in {cached_path!r} was applied "
                "by another process, with its own job secret, and Regency already runs in "
                "this process with another one. A job applied from this process gets this "
                "process's secret, so: call state() before anything else starts Regency here "
                "(it then adopts the job's secret), or release the cached job (kill(), "
                "`regency kill`) and apply again from here"
            ) from exc
        self._attached = [*(self._attached or []), attached]  # None in older state files
        return attached

    def kill(self) -> None:
        """Release the job's resources (scancel, kill the workers, ...). Procs this process
        started on the job's hosts are stopped first (not reported as failures)."""
        attached, self._attached = self._attached or [], []
        for state in attached:
            for name, hosts in state.meshes.items():
                try:
                    hosts.shutdown().get(30)
                except Exception as exc:
                    if "already been shut down" not in str(exc):
                        log.warning("could not shut mesh %r down before the kill: %s", name, exc)
        running = self._running
        if running is not None:
            running._kill()
        self._status = "not_running"

    def dump(self, filename: str = DEFAULT_STATE_PATH) -> None:
        """Write this job to ``filename`` (mode 0600: it holds the job secret), atomically;
        a symlink is followed."""
        path = os.path.realpath(filename)
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".job_state-", dir=directory)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(self, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def dumps(self) -> bytes:
        return pickle.dumps(self)

    # -- what a scheduler implements -----------------------------------------------------

    @abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Ask the scheduler for the job (called by ``apply()`` when not running)."""

    @abstractmethod
    def _state(self) -> JobState:
        """Attach to the workers of the applied job."""

    @abstractmethod
    def can_run(self, spec: JobTrait) -> bool:
        """May this applied job serve ``spec`` (same shape, still alive)?"""

    @abstractmethod
    def _kill(self) -> None:
        """Release the scheduler's resources."""


class BatchJob(JobTrait):
    """What batch mode caches for the client it runs inside the allocation: the inner job,
    always reusable there (``REGENCY_BATCH_JOB=1``), never elsewhere."""

    def __init__(self, job: JobTrait) -> None:
        super().__init__()
        self.job = job
        self._apply_id = job._apply_id or str(uuid.uuid4())
        self._status = "running"

    def _create(self, client_script: str | None) -> None:
        self.job._create(client_script)

    def _state(self) -> JobState:
        return self.job._state()

    def can_run(self, spec: JobTrait) -> bool:
        return in_batch_job()

    def _kill(self) -> None:
        # In the allocation the runner owns teardown; the client must not cancel its own job.
        if not in_batch_job():
            self.job._kill()


def _load_cached(cached_path: str | None, spec: JobTrait) -> JobTrait | None:
    if cached_path is None:
        return None
    try:
        job = job_load(cached_path)
    except FileNotFoundError:
        return None
    running = job._running
    if running is None:
        return None
    if isinstance(running, BatchJob) and not in_batch_job():
        # A batch job's own state: its client (inside the allocation) reads it. Leave it be.
        log.info("%s belongs to a batch job; not reusing it outside that job", cached_path)
        return None
    if not running.can_run(spec):
        log.info("the job cached in %s cannot run this spec: releasing it", cached_path)
        try:
            running._kill()
        finally:
            try:
                os.remove(os.path.realpath(cached_path))
            except FileNotFoundError:
                pass
        return None
    return job


def job_loads(data: bytes) -> JobTrait:
    """A job from ``JobTrait.dumps()``."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"expected a pickled JobTrait (got {type(job).__name__})")
    return job


def job_load(filename: str = DEFAULT_STATE_PATH) -> JobTrait:
    """A job from ``JobTrait.dump()`` (by default the cached state file)."""
    with open(filename, "rb") as f:
        return job_loads(f.read())
