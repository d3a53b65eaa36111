"""Monarch's workspace values (``monarch.tools.config.workspace.Workspace``, its
environments) and what ``HostMesh.sync_workspace`` checks before anything travels.

The sync itself is :mod:`._workspace_sync` (actors) over :mod:`._workspace_files`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import attrs

from ._future import Future, resolved

if TYPE_CHECKING:
    from ._hosts import HostRef
    from ._proc_mesh import HostMesh


class Environment:
    """The dependencies of a workspace's projects (Monarch's
    ``monarch.tools.config.environment.Environment``)."""


class CondaEnvironment(Environment):
    """A conda environment: ``conda_prefix``, or the active one (``$CONDA_PREFIX``)."""

    def __init__(self, conda_prefix: str | None = None) -> None:
        self._conda_prefix = conda_prefix

    @property
    def conda_prefix(self) -> str:
        """The prefix given, else the active environment's (``ValueError`` when none is)."""
        prefix = self._conda_prefix or os.environ.get("CONDA_PREFIX")
        if not prefix:
            raise ValueError(
                "no conda environment is active ($CONDA_PREFIX is not set); activate one "
                "or give CondaEnvironment(conda_prefix=...)"
            )
        return prefix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CondaEnvironment) and self._conda_prefix == other._conda_prefix

    def __hash__(self) -> int:
        return hash(self._conda_prefix)

    def __repr__(self) -> str:
        return f"CondaEnvironment({self._conda_prefix!r})"


ACTIVE_CONDA_ENV = CondaEnvironment()


class Workspace:
    """One or more local directories holding your project(s), as Monarch has it.

    ``dirs`` is a list of directories (each goes to ``$WORKSPACE_DIR/<its name>`` on a host
    whose environment sets ``WORKSPACE_DIR``) or a dict from directory to its path under
    ``$WORKSPACE_DIR`` (``""``: the directory's contents go to ``$WORKSPACE_DIR`` itself).
    On a host without ``WORKSPACE_DIR``, a directory goes to the same absolute path it has
    here. ``env`` is the environment ``sync_workspace(conda=True)`` also syncs.
    """

    def __init__(
        self,
        dirs: list[Path | str] | dict[Path | str, str] | None = None,
        env: Environment | None = ACTIVE_CONDA_ENV,
    ) -> None:
        self.env = env
        self.dirs: dict[Path, str] = {}  # local directory -> its path under $WORKSPACE_DIR
        if dirs is None:
            return
        if isinstance(dirs, str | os.PathLike):
            raise TypeError(
                f"Workspace dirs must be a list or a dict of directories (got the single "
                f"path {str(dirs)!r}; write dirs=[{str(dirs)!r}])"
            )
        if isinstance(dirs, dict):
            for src, dst in dirs.items():
                if not isinstance(dst, str):
                    raise TypeError(
                        f"Workspace dirs: the remote path of {str(src)!r} must be a str "
                        f"relative to $WORKSPACE_DIR (got {dst!r})"
                    )
                self.dirs[_local(src)] = dst
        elif isinstance(dirs, list | tuple):
            for src in dirs:
                local = _local(src)
                self.dirs[local] = local.name
        else:
            raise TypeError(
                f"Workspace dirs must be a list or a dict of directories (got {dirs!r})"
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and (self.env, self.dirs) == (other.env, other.dirs)

    __hash__ = None  # type: ignore[assignment]  # mutable, as Monarch's

    def __repr__(self) -> str:
        return f"Workspace(dirs={ {str(k): v for k, v in self.dirs.items()} }, env={self.env!r})"

    @staticmethod
    def null() -> Workspace:
        """No directories and no environment."""
        return Workspace(env=None)

    def merge(self, outdir: str | Path) -> None:
        """Copy every directory of this workspace into ``outdir`` (at its remote path)."""
        import shutil

        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        for src, dst in self.dirs.items():
            shutil.copytree(src, out / dst, dirs_exist_ok=True, symlinks=True)


def _local(src: object) -> Path:
    if not isinstance(src, str | os.PathLike) or not str(src):
        raise TypeError(
            f"Workspace dirs: each directory must be a non-empty path (got {src!r})"
        )
    return Path(src)


class Unit(NamedTuple):
    """One directory to sync, as the hosts are told it."""

    source: str  #: its absolute path here
    #: Its path under a host's $WORKSPACE_DIR; None: the same absolute path as here.
    relative: str | None
    #: Put on sys.path of procs (the workspace's directories; not a conda environment).
    on_path: bool


def units(workspace: Workspace | None, conda: bool) -> list[Unit]:
    """The directories to sync, checked: each exists, is a directory, has a plain relative
    remote path, and no two of them land inside one another."""
    if workspace is None:
        workspace = Workspace(dirs=[os.getcwd()], env=None)
    if not isinstance(workspace, Workspace):
        raise TypeError(
            "sync_workspace needs a Workspace (regency.tools.config.workspace.Workspace), "
            f"e.g. Workspace(dirs=[...]) (got {type(workspace).__name__} {workspace!r})"
        )
    if not isinstance(conda, bool):
        raise TypeError(f"sync_workspace: conda must be a bool (got {conda!r})")
    found: list[Unit] = []
    for src, dst in workspace.dirs.items():
        path = _directory(src, "workspace directory")
        if path == "/":
            raise ValueError(
                "sync_workspace: the workspace directory / would mirror (and delete) a "
                "host's whole file system; name the project's directory"
            )
        parts = dst.split("/") if dst else []
        if os.path.isabs(dst) or ".." in parts or "\\" in dst:
            raise ValueError(
                f"sync_workspace: the remote path of {path} must lie inside $WORKSPACE_DIR: "
                f"relative, without '..' (got {dst!r})"
            )
        found.append(Unit(path, "/".join(p for p in parts if p not in ("", ".")), True))
    if conda:
        env = workspace.env if isinstance(workspace.env, CondaEnvironment) else ACTIVE_CONDA_ENV
        prefix = _directory(env.conda_prefix, "conda environment")
        found.append(Unit(prefix, None, False))
    _no_nesting(found)
    return found


def _directory(src: str | Path, what: str) -> str:
    path = os.path.abspath(os.fspath(src))
    if not os.path.exists(path):
        raise FileNotFoundError(f"sync_workspace: the {what} {path} does not exist")
    if not os.path.isdir(path):
        raise NotADirectoryError(f"sync_workspace: the {what} {path} is not a directory")
    return path


def overlap(a: str, b: str) -> bool:
    """Whether the directories ``a`` and ``b`` (normalized paths) are one, or one lies in
    the other."""

    def inside(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip("/") + "/")

    return inside(a, b) or inside(b, a)


def _no_nesting(found: list[Unit]) -> None:
    """Two directories synced into one another would delete each other's files: on a host
    without $WORKSPACE_DIR each goes to its own path, on one with it to its remote path."""

    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            places = [(a.source, b.source)]
            if a.relative is not None and b.relative is not None:
                places.append(("/" + a.relative, "/" + b.relative))
            for x, y in places:
                if overlap(x, y):
                    raise ValueError(
                        f"sync_workspace: {a.source} and {b.source} would be synced into one "
                        f"another (at {x.lstrip('/') or '.'!r} and {y.lstrip('/') or '.'!r}); "
                        "give them separate places"
                    )


@attrs.frozen
class HostSync:
    """What one host of a ``sync_workspace`` received and did."""

    #: The host (its name, and its worker's address for a host of ``attach_to_workers``).
    host: str
    #: Where each directory went there, in the workspace's order.
    destinations: tuple[str, ...]
    #: Directories that were the controller's own (a shared file system): nothing moved.
    shared: tuple[str, ...]
    #: Distinct file contents, and their bytes, that travelled to this host.
    files_sent: int
    bytes_sent: int
    #: Files (and links) written there: new or changed, whether their bytes travelled or a
    #: copy already on the host served; and those deleted. Absolute paths on the host.
    written: tuple[str, ...]
    deleted: tuple[str, ...]
    #: With ``auto_reload``: the modules each running proc there reloaded (by proc id).
    reloaded: dict[str, tuple[str, ...]] = attrs.field(factory=dict)


@attrs.frozen
class WorkspaceSync:
    """What ``HostMesh.sync_workspace`` did, host by host."""

    hosts: tuple[HostSync, ...]

    @property
    def files_sent(self) -> int:
        return sum(h.files_sent for h in self.hosts)

    @property
    def bytes_sent(self) -> int:
        return sum(h.bytes_sent for h in self.hosts)


class WorkspaceError(RuntimeError):
    """A host could not take part in a ``sync_workspace``: the message names it and why."""


class ReloadError(WorkspaceError):
    """Files were synced, but some running procs could not reload changed modules; the
    sync's result is ``result``."""

    def __init__(self, message: str, result: WorkspaceSync) -> None:
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[type[ReloadError], tuple[str, WorkspaceSync]]:
        return (ReloadError, (str(self), self.result))


def _hosts_of(mesh: HostMesh) -> list[tuple[str, HostRef | None]]:
    """Each host of the mesh, named, with its worker (None: this host)."""
    if mesh._hosts is None:
        return [("this host", None)]
    refs = [mesh._hosts[r] for r in mesh._shape.ranks]
    return [(f"{ref.hostname} ({ref.worker})", ref) for ref in refs]


def sync_workspace(
    mesh: HostMesh, workspace: Workspace | None, conda: bool, auto_reload: bool
) -> Future[WorkspaceSync]:
    """``HostMesh.sync_workspace``: checks here (errors raise at once), the work in the
    caller's process's workspace client actor (:mod:`._workspace_sync`)."""
    if not isinstance(auto_reload, bool):
        raise TypeError(f"sync_workspace: auto_reload must be a bool (got {auto_reload!r})")
    found = units(workspace, conda)
    hosts = _hosts_of(mesh)
    if mesh.is_fake_in_process:
        # Simulated hosts share this process and its files: there is nothing to move, and
        # a simulation does no real I/O.
        return resolved(
            WorkspaceSync(
                tuple(
                    HostSync(label, tuple(u.source for u in found),
                             tuple(u.source for u in found), 0, 0, (), ())
                    for label, _ in hosts
                )
            )
        )
    from ._workspace_sync import client

    call = client().sync.call_one(hosts, found, auto_reload)
    done: Future[WorkspaceSync] = Future()

    def settle() -> None:
        # The client answers a failure as its value, so that it keeps its type here.
        exc = call.exception(0)
        value = call.result(0) if exc is None else exc
        if isinstance(value, BaseException):
            done.set_exception(value)
        else:
            done.set_result(value)

    call.add_done_callback(settle)
    return done
