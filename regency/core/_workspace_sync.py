"""The actors of ``HostMesh.sync_workspace``.

- :class:`WorkspaceClient`, one per process that syncs (in that process): builds the
  manifests, drives every host's sync, and owns what it spawns, so that a host proc or a
  reloader that fails is this sync's error and never the program's (its ``__supervise__``
  handles every failure of its meshes).
- :class:`WorkspaceHost`, one per host, in a proc of its own that the client spawns on the
  host at its first sync and keeps (named ``workspace``; for this host, in this process):
  answers which contents it lacks, receives them, and commits (:mod:`._workspace_files`).
- :class:`Reloader`, spawned for a moment into each running proc of a host with
  ``auto_reload``: puts the synced directories on ``sys.path`` and reloads the modules whose
  files changed.

Everything travels as ordinary actor messages over the job's authenticated links; contents
go as one ``bytes`` argument per call (out of band, not pickled), at most ``WINDOW`` calls
in flight per host.
"""

from __future__ import annotations

import importlib
import os
import secrets
import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import attrs

from ..supervision import MeshFailure
from . import _workspace_files as F
from ._endpoint import Actor, endpoint
from ._errors import ActorError
from ._future import Future
from ._hosts import HostRef
from ._launcher import ProcLauncher
from ._workspace import HostSync, ReloadError, Unit, WorkspaceError, WorkspaceSync, overlap

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._runtime import Runtime

#: Calls carrying contents in flight per host (each up to ``_workspace_files.CHUNK``).
WINDOW = 4


class WorkspaceHost(Actor):
    """A host's side of syncs: one sync at a time, its directories by sync id."""

    def __init__(self) -> None:
        self._cache = F.HashCache()
        self._syncs: dict[str, list[F.Destination | str]] = {}

    @endpoint
    def plan(
        self, sync: str, units: list[Unit], manifests: list[list[F.Entry]], probe: str
    ) -> tuple[list[str], list[list[str] | None]]:
        """Where each directory goes here, and the contents each lacks (None: it is the
        controller's own directory, seen here through a shared file system)."""
        for old in self._syncs.pop(sync, []):
            if isinstance(old, F.Destination):
                old.discard()
        base = os.environ.get("WORKSPACE_DIR", "")
        paths = [
            os.path.normpath(os.path.join(base, u.relative))
            if base and u.relative is not None
            else u.source
            for u in units
        ]
        for i, a in enumerate(paths):
            for b in paths[i + 1 :]:
                if overlap(a, b):
                    raise ValueError(
                        f"two workspace directories would be synced into one another here: "
                        f"{a} and {b} (WORKSPACE_DIR={base!r})"
                    )
        found: list[F.Destination | str] = []
        lacking: list[list[str] | None] = []
        for path, entries in zip(paths, manifests, strict=True):
            if os.path.lexists(os.path.join(path, probe)):
                found.append(path)
                lacking.append(None)
                continue
            dest = F.Destination(path, entries, self._cache, sync)
            found.append(dest)
            lacking.append(dest.lacking())
        self._syncs[sync] = found
        return paths, lacking

    @endpoint
    def put(self, sync: str, index: list[tuple[int, str, int, int]], data: bytes) -> None:
        """Contents: ``index`` entries (directory, sha256, offset, length) over ``data``."""
        found = self._syncs[sync]
        view = memoryview(data)
        at = 0
        for unit, sha, offset, length in index:
            dest = found[unit]
            assert isinstance(dest, F.Destination)
            dest.receive(sha, offset, view[at : at + length])
            at += length

    @endpoint
    def commit(self, sync: str, on_path: list[bool]) -> list[F.Report]:
        """Put everything in place; new procs on this host import from the directories."""
        found = self._syncs.pop(sync)
        reports = [
            F.Report(d, True, (), (), 0, 0) if isinstance(d, str) else d.commit()
            for d in found
        ]
        from ._controller import current_runtime

        rt = current_runtime()
        paths = [r.destination for r, put in zip(reports, on_path, strict=True) if put]
        if paths:  # the controller's address, as procs it starts are told it
            F.record_paths(rt.jobdir, rt.root_address or rt.address, paths)
        return reports

    @endpoint
    def abort(self, sync: str) -> None:
        for dest in self._syncs.pop(sync, []):
            if isinstance(dest, F.Destination):
                dest.discard()


class Reloader(Actor):
    """In a running proc: the synced directories on ``sys.path``, changed modules reloaded."""

    @endpoint
    def reload(self, changed: list[str], paths: list[str]) -> list[str]:
        F.put_first_on_path(paths)
        wanted = {os.path.realpath(p) for p in changed}
        reloaded: list[str] = []
        failed: list[str] = []
        # Latest imported first: a module is registered before the ones it imports, so
        # this reloads a dependency before the module that took names from it.
        for name, module in reversed(list(sys.modules.items())):
            file = getattr(module, "__file__", None)
            if not isinstance(file, str) or os.path.realpath(file) not in wanted:
                continue
            try:
                importlib.reload(module)
            except Exception as exc:
                failed.append(f"{name} ({type(exc).__name__}: {exc})")
            else:
                reloaded.append(name)
        if failed:
            raise RuntimeError(
                f"could not reload {', '.join(failed)}"
                + (f" (reloaded {', '.join(reloaded)})" if reloaded else "")
            )
        return reloaded


class WorkspaceClient(Actor):
    """The syncing process's side (see the module's docstring)."""

    def __init__(self) -> None:
        self._cache = F.HashCache()
        #: Each host's WorkspaceHost (a one-host slice), its proc's address, the key of the
        #: mesh it is a rank of (one mesh serves the hosts whose procs were spawned
        #: together) and that rank.
        self._hosts: dict[str, tuple[ActorMesh[WorkspaceHost], str, str, int]] = {}

    def __supervise__(self, failure: MeshFailure) -> bool:
        # A host proc or a reloader failed: the sync waiting on it fails with the call, and
        # the next sync spawns a new host proc there (only there: the other ranks of its
        # mesh serve on). Never the program's business.
        for key, (_, _, mesh_key, rank) in list(self._hosts.items()):
            if mesh_key == failure.mesh_key and rank in failure.ranks:
                del self._hosts[key]
        return True

    @endpoint
    def sync(
        self, hosts: list[tuple[str, HostRef | None]], units: list[Unit], auto_reload: bool
    ) -> WorkspaceSync | BaseException:
        """The whole sync; a failure comes back as the value (raised by the caller's
        future), so that it keeps its type and names the host."""
        try:
            return self._sync(hosts, units, auto_reload)
        except Exception as exc:
            return exc

    def _sync(
        self, hosts: list[tuple[str, HostRef | None]], units: list[Unit], auto_reload: bool
    ) -> WorkspaceSync:
        manifests = [F.scan(u.source, self._cache)[0] for u in units]
        actors = self._actors(hosts)
        token = secrets.token_hex(8)
        probe = f"{F.RESERVED_PREFIX}probe-{token}"
        probes = []
        for u in units:  # a host that sees this file sees our own directory
            path = os.path.join(u.source, probe)
            try:
                with open(path, "x"):
                    pass
            except OSError:
                continue  # a read-only directory: a host sharing it finds nothing to change
            probes.append(path)
        try:
            try:
                planned = _each(
                    hosts, [a.plan.call_one(token, units, manifests, probe) for a in actors]
                )
            finally:
                for path in probes:
                    os.unlink(path)
            sent = self._send(hosts, actors, token, units, manifests, [p[1] for p in planned])
            on_path = [u.on_path for u in units]
            reports = _each(hosts, [a.commit.call_one(token, on_path) for a in actors])
        except BaseException:
            for actor in actors:  # no staging left behind (the host forgets the sync)
                try:
                    actor.abort.call_one(token)
                except Exception:
                    pass
            raise
        results = []
        for (label, _), (files, size), done in zip(hosts, sent, reports, strict=True):
            results.append(
                HostSync(
                    label,
                    tuple(r.destination for r in done),
                    tuple(r.destination for r in done if r.shared),
                    files,
                    size,
                    tuple(os.path.join(r.destination, p) for r in done for p in r.written),
                    tuple(os.path.join(r.destination, p) for r in done for p in r.deleted),
                )
            )
        if not auto_reload:
            return WorkspaceSync(tuple(results))
        return self._reload(hosts, units, results)

    def _actors(self, hosts: list[tuple[str, HostRef | None]]) -> list[ActorMesh[WorkspaceHost]]:
        """Each host's WorkspaceHost; a host proc that is gone is spawned again."""
        from ._controller import current_runtime
        from ._proc_mesh import HostMesh, this_proc
        from ._shape import Shape

        rt = current_runtime()
        missing: list[HostRef | None] = []
        for _, ref in hosts:
            key = _key(ref)
            known = self._hosts.get(key)
            if known is not None and known[1]:  # a proc of its own (not this process)
                child = rt.children.get(known[1])
                if child is None or child.returncode is not None:
                    del self._hosts[key]
            if key not in self._hosts and ref not in missing:
                missing.append(ref)
        if None in missing:
            # This host's file system is this process's: the host side runs here.
            here = cast("ActorMesh[WorkspaceHost]", this_proc().spawn("workspace_host", WorkspaceHost))
            here.initialized.get()
            self._hosts[_key(None)] = (here, "", here._key, 0)
        remote = [r for r in missing if r is not None]
        if remote:
            mesh = HostMesh(Shape.full(["hosts"], [len(remote)]), tuple(remote))
            procs = mesh.spawn_procs(name="workspace")
            actors = cast("ActorMesh[WorkspaceHost]", procs.spawn("workspace_host", WorkspaceHost))
            actors.initialized.get()
            for j, ref in enumerate(remote):
                self._hosts[_key(ref)] = (
                    actors.slice(hosts=j), procs._procs[j][1], actors._key, j
                )
        return [self._hosts[_key(ref)][0] for _, ref in hosts]

    def _send(
        self,
        hosts: list[tuple[str, HostRef | None]],
        actors: list[ActorMesh[WorkspaceHost]],
        token: str,
        units: list[Unit],
        manifests: list[list[F.Entry]],
        lacking: list[list[list[str] | None]],
    ) -> list[tuple[int, int]]:
        """Send each host the contents it lacks; (contents, bytes) sent to each."""
        where = [{e.sha: e.path for e in m if e.kind == F.FILE} for m in manifests]
        sizes = [{e.sha: e.size for e in m if e.kind == F.FILE} for m in manifests]
        counts = [
            (
                sum(len(shas) for shas in host if shas),
                sum(sizes[u][s] for u, shas in enumerate(host) if shas for s in shas),
            )
            for host in lacking
        ]
        pending = {
            i: _batches(units, where, host) for i, host in enumerate(lacking) if counts[i][0]
        }
        busy = dict.fromkeys(pending, 0)
        flying: deque[tuple[int, Future[None]]] = deque()
        while pending or flying:
            for i in list(pending):
                while busy[i] < WINDOW:
                    batch = next(pending[i], None)
                    if batch is None:
                        del pending[i]
                        break
                    flying.append((i, actors[i].put.call_one(token, *batch)))
                    busy[i] += 1
            if flying:
                i, fut = flying.popleft()
                _each([hosts[i]], [fut])
                busy[i] -= 1
        return counts

    def _reload(
        self, hosts: list[tuple[str, HostRef | None]], units: list[Unit], results: list[HostSync]
    ) -> WorkspaceSync:
        """Every running proc the controller started on these hosts reloads what changed."""
        from ._controller import current_runtime
        from ._proc_mesh import ProcMesh

        rt = current_runtime()
        ours = {address for _, address, _, _ in self._hosts.values()}
        failures: list[str] = []
        done: list[HostSync] = []
        for (_, ref), result in zip(hosts, results, strict=True):
            procs = [
                (child.proc_id, address)
                for address, child in list(rt.children.items())
                if child.returncode is None
                and child.last_seen is not None
                and address not in ours
                and _on_host(child.launcher, ref)
            ]
            paths = [d for d, u in zip(result.destinations, units, strict=True) if u.on_path]
            calls = []
            for proc_id, address in procs:
                mesh = ProcMesh._single(proc_id, address).spawn("workspace_reload", Reloader)
                calls.append((proc_id, mesh, mesh.reload.call_one(list(result.written), paths)))
            reloaded: dict[str, tuple[str, ...]] = {}
            for proc_id, mesh, fut in calls:
                try:
                    reloaded[proc_id] = tuple(fut.get())
                except ActorError as exc:
                    failures.append(f"proc {proc_id} on {result.host}: {exc.message}")
                except Exception as exc:
                    failures.append(f"proc {proc_id} on {result.host}: {exc}")
                try:
                    mesh.stop().get()
                except Exception:
                    pass  # it failed, or its proc is gone: nothing left to stop
            done.append(attrs.evolve(result, reloaded=reloaded))
        synced = WorkspaceSync(tuple(done))
        if failures:
            raise ReloadError(
                "sync_workspace: the files were synced, but " + "; ".join(failures), synced
            )
        return synced


def _key(ref: HostRef | None) -> str:
    return "" if ref is None else ref.worker


def _on_host(launcher: ProcLauncher | None, ref: HostRef | None) -> bool:
    worker = launcher.worker if launcher is not None else None
    return worker == (ref.worker if ref is not None else None)


def _each(hosts: list[tuple[str, HostRef | None]], futures: list[Future[Any]]) -> list[Any]:
    """Every future's value; the first failure as a WorkspaceError naming its host."""
    values = []
    for (label, _), fut in zip(hosts, futures, strict=True):
        try:
            values.append(fut.get())
        except ActorError as exc:
            inner = exc.exception
            raise WorkspaceError(
                f"sync_workspace on {label}: {type(inner).__name__}: {exc.message}"
            ) from None
        except Exception as exc:
            raise WorkspaceError(f"sync_workspace on {label}: {exc}") from None
    return values


def _batches(
    units: list[Unit], where: list[dict[str, str]], lacking: list[list[str] | None]
) -> Iterator[tuple[list[tuple[int, str, int, int]], bytes]]:
    """The lacking contents as (index, data) calls of about ``CHUNK`` bytes each."""
    index: list[tuple[int, str, int, int]] = []
    parts: list[bytes] = []
    size = 0
    for u, shas in enumerate(lacking):
        for sha in shas or ():
            offset = 0
            for chunk in F.read_verified(os.path.join(units[u].source, where[u][sha]), sha):
                index.append((u, sha, offset, len(chunk)))
                parts.append(chunk)
                offset += len(chunk)
                size += len(chunk)
                if size >= F.CHUNK:
                    yield index, b"".join(parts)
                    index, parts, size = [], [], 0
            if offset == 0:
                index.append((u, sha, 0, 0))  # an empty file: no bytes, still a content
    if index:
        yield index, b"".join(parts)


#: Each runtime's client (typed as the actor class, as ``spawn`` types it).
_clients: weakref.WeakKeyDictionary[Runtime, WorkspaceClient] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def client() -> WorkspaceClient:
    """This process's workspace client (spawned in it on first use)."""
    from ._controller import current_runtime
    from ._proc_mesh import this_proc

    rt = current_runtime()
    with _lock:
        found = _clients.get(rt)
        if found is None:
            found = _clients[rt] = this_proc().spawn("workspace", WorkspaceClient)
        return found
