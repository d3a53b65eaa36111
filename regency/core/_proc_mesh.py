"""Proc and host meshes: start procs on hosts, spawn actor meshes on procs."""

from __future__ import annotations

import collections.abc
import logging
import math
import os
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import _codec, _extensions
from . import _messages as M
from ._actor_mesh import _MESH_ATTRIBUTES, ActorMesh, ProcRef, _owner, _StopEndpointActorMesh
from ._adverbs import _pickle_args
from ._bootstrap_command import BootstrapCommand
from ._children import _stop_procs, _wait_ready
from ._context import context, record_spawned
from ._controller import current_runtime
from ._endpoint import Actor, endpoints_of
from ._future import Future, resolved
from ._hosts import (
    HostRef,
    MeshLife,
    WorkerLauncher,
    shutdown_hosts,
    stop_mesh_procs,
    worker_launcher,
)
from ._launcher import LocalLauncher
from ._proc_bind import bind_command, check_proc_bind
from ._replies import _Acks
from ._shape import Extent, MeshAlgebra, Point, Shape
from ._singletons import ensure_registry

if TYPE_CHECKING:
    from ._workspace import Workspace, WorkspaceSync

A = TypeVar("A", bound=Actor)
R = TypeVar("R")


class ProcMesh(MeshAlgebra):
    """Processes, arranged as a mesh; spawn actors on them. The tensor engine's methods
    (``activate``, ``rank_tensor``) and ``logging_option`` run what the packages above core
    plugged in (:mod:`regency.core._extensions`)."""

    __slots__ = ("_procs", "_ready", "_shape", "_stopped")

    def __init__(
        self, procs: tuple[ProcRef, ...], shape: Shape, ready: Future[None] | None = None
    ) -> None:
        self._procs, self._shape, self._ready = procs, shape, ready
        #: ``stop()`` was called on this object (as Monarch's ``ProcMesh._stopped``).
        self._stopped = False

    @classmethod
    def _single(cls, proc_id: str, address: str) -> ProcMesh:
        return cls(((proc_id, address),), Shape.full([], []))

    def _with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._procs, shape, self._ready)

    def __reduce__(self) -> Any:
        return (ProcMesh, (self._procs, self._shape))

    def spawn(self, name: str, cls: type[A], *args: Any, **kwargs: Any) -> A:
        """Spawn ``cls(*args, **kwargs)`` on every proc. Returns at once; ``__init__`` runs
        before the first message any rank handles.

        The result is an :class:`ActorMesh`; it is typed as ``cls`` (as in Monarch) so that
        the type checker checks ``mesh.endpoint_name.call(...)`` against the method."""
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"spawn needs an Actor subclass (got {cls!r})")
        if self._stopped:
            raise RuntimeError(f"`ProcMesh` has already been stopped: cannot spawn {name!r} on it")
        names = set(endpoints_of(cls))
        clashes = sorted(names & _MESH_ATTRIBUTES - {"stop"})
        if clashes:
            raise ValueError(
                f"endpoints {clashes} of {cls.__name__} have the names of ActorMesh "
                f"attributes, which a mesh needs for itself; rename them (as Monarch, Regency "
                f"refuses these; an endpoint named 'stop' is allowed, see docs/porting.md)"
            )
        mesh_class = _StopEndpointActorMesh if "stop" in names else ActorMesh
        rt = current_runtime()
        payload = _pickle_args(f"{cls.__name__}.__init__", args, kwargs, (cls, args, kwargs))
        key = rt.new_name(f"{name}.")
        shape = self._shape
        init: Future[None] = Future()
        dests = frozenset(self._procs[r][1] for r in shape.ranks)
        port = rt.open_port(_Acks(init, len(shape), f"spawning {name}", dests))
        labels, sizes = list(shape.labels), list(shape.sizes)
        pickled = M.Pickled(payload)
        # The actor mesh's own ranks are 0..n-1 over the procs of this (maybe sliced) mesh.
        procs = tuple(self._procs[r] for r in shape.ranks)
        mesh = mesh_class(key, name, cls, procs, Shape.full(shape.labels, shape.sizes), init)
        owner = _owner(rt)
        addresses = tuple(address for _, address in procs)
        kind = f"{cls.__module__}.{cls.__qualname__}"
        dims = (tuple(shape.labels), tuple(shape.sizes))
        rt.call_soon(
            lambda: rt.oversight.mesh_spawned(
                key, name, owner[1], owner[2], addresses, kind, *dims
            )
        )
        for local, address in enumerate(addresses):
            rt.post(address, M.Spawn(key, name, local, labels, sizes, port, owner, pickled))
        return cast(A, mesh)

    @property
    def initialized(self) -> Future[bool]:
        """Resolves to True (as Monarch's) once every proc has started and connected back;
        fails as the start failed."""
        ready = self._ready
        if ready is None:
            return resolved(True)
        fut: Future[bool] = Future()

        def done() -> None:
            if ready._exception is not None:
                fut.set_exception(ready._exception)
            else:
                fut.set_result(True)

        ready.add_done_callback(done)
        return fut

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of this mesh; resolves when they have exited."""
        rt = current_runtime()
        self._stopped = True
        done: Future[None] = Future()
        addresses = [self._procs[r][1] for r in self._shape.ranks]
        rt.start_soon(_stop_procs, rt, addresses, done)
        return done

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: float | None = 3,
        level: int = logging.INFO,
    ) -> Future[None]:
        """Forward this mesh's stdout/stderr to the controller (docs/logging.md). Await it
        (trio or asyncio) or ``.get()`` it: it resolves once every proc applies the change,
        after the lines written before it."""
        return _CoroutineFuture(
            _extensions.log_forwarding().logging_option(
                self, stream_to_client, aggregate_window_sec, level
            )
        )

    # The tensor engine (docs/tensors.md).

    def activate(self) -> Any:
        """``with mesh.activate():`` torch ops, factories included, run on every proc."""
        return _extensions.mesh_tensors().activate(self)

    def rank_tensor(self, dim: str | tuple[str, ...] | list[str]) -> Any:
        """A tensor whose value on each proc is its coordinate along ``dim`` (row-major over
        several dims)."""
        dims = (dim,) if isinstance(dim, str) else tuple(dim)
        return _extensions.mesh_tensors().rank_tensor(self, dims)

    def rank_tensors(self) -> dict[str, Any]:
        """``{dim: rank_tensor(dim)}`` for every dim of the mesh."""
        return {d: self.rank_tensor(d) for d in self._shape.labels}

    def to_table(self) -> str:
        """The mesh as a text table: one row per proc, its coordinates and global rank."""
        shape = self._shape
        header = [*shape.labels, "rank", "proc"]
        rows = [header]
        for local, rank in enumerate(shape.ranks):
            coords = shape.coords(local)
            proc = self._procs[rank][0]
            rows.append([*(str(coords[d]) for d in shape.labels), str(rank), proc])
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        last = len(header) - 1  # proc names read better left-aligned
        return "\n".join(
            "  ".join(
                cell.ljust(w) if i == last else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        )

    def sync_workspace(self, *args: Any, **kwargs: Any) -> None:
        """Monarch's: not for proc meshes (it raises, as there)."""
        raise NotImplementedError(
            "sync_workspace is not implemented for ProcMesh. Use HostMesh.sync_workspace instead."
        )

    def __repr__(self) -> str:
        return f"<ProcMesh {self._shape.dim_sizes()}>"

    # Monarch's older `await proc_mesh(...)` / `proc_mesh(...).get()` forms.
    def get(self, timeout: float | None = None) -> ProcMesh:
        self.initialized.get(timeout)
        return self

    def __await__(self) -> Any:
        async def wait() -> ProcMesh:
            await self.initialized
            return self

        return wait().__await__()



def _default_command() -> BootstrapCommand:
    from ._bootstrap_command import default_bootstrap_cmd

    return default_bootstrap_cmd()


class _CoroutineFuture(Future[R]):
    """A Future that is also a coroutine object, for what Monarch declares ``async def``:
    ``asyncio.run(procs.logging_option(...))`` (its tutorial's form) and
    ``asyncio.create_task(...)`` take it, as ``await`` and ``.get()`` do. It resolves as
    ``inner`` does."""

    __slots__ = ("_steps",)

    def __init__(self, inner: Future[R]) -> None:
        super().__init__()
        self._steps: Generator[Any, None, R] | None = None
        inner.add_done_callback(lambda: self._settle(inner))

    def _settle(self, inner: Future[R]) -> None:
        exc = inner.exception(0)
        if exc is not None:
            self.set_exception(exc)
        else:
            self.set_result(inner.result(0))

    # -- the coroutine protocol (asyncio's Task drives it) ----------------------------------

    def send(self, value: None) -> Any:
        if self._steps is None:
            self._steps = self.__await__()
        return self._steps.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._steps is None:
            self._steps = self.__await__()
        if val is None:
            return self._steps.throw(typ)
        return self._steps.throw(val.with_traceback(tb) if tb is not None else val)

    def close(self) -> None:
        if self._steps is not None:
            self._steps.close()


collections.abc.Coroutine.register(_CoroutineFuture)


class HostMesh(MeshAlgebra):
    """Hosts, arranged as a mesh; start procs on them."""

    __slots__ = ("_hosts", "_life", "_python", "_shape")

    def __init__(
        self,
        shape: Shape,
        hosts: tuple[HostRef, ...] | None = None,
        python: str | None = None,
        life: MeshLife | None = None,
    ) -> None:
        self._shape = shape
        #: Remote hosts by global rank (``attach_to_workers``); None for this host.
        self._hosts = hosts
        #: The interpreter procs spawned from here run (None: this one's, via the zygote).
        self._python = python
        #: What this mesh and its slices started, and whether it was attached or shut down.
        self._life = life if life is not None else MeshLife.attached()

    def _with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts, self._python, self._life)

    def __reduce__(self) -> Any:
        # An unpickled mesh is a reference: it starts procs, but cannot stop or shut down
        # the hosts (as Monarch's).
        return (_reference, (self._shape, self._hosts, self._python))

    @property
    def initialized(self) -> Future[bool]:
        """Resolves to True once this mesh's hosts are attached; fails with the attach's
        error when a worker of ``attach_to_workers`` did not answer or refused."""
        if self._life.shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        return self._life.ready

    async def __aenter__(self) -> HostMesh:
        if self._life.shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        return self

    async def __aexit__(self, exc_type: object, exc_val: object, exc_tb: object) -> None:
        if not self._life.shut_down:  # nested ``async with``: shut down once
            await self.shutdown()

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """This mesh, whose procs run ``python_executable`` (another virtualenv, say) instead
        of the controller's interpreter. It must be able to import Regency and the program's
        actor classes. Procs start as fresh interpreters (no zygote)."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError(f"python_executable must be a path (got {python_executable!r})")
        if not (os.path.isfile(python_executable) and os.access(python_executable, os.X_OK)):
            raise FileNotFoundError(
                f"python_executable {python_executable!r} is not an executable file"
            )
        if self._hosts is not None:
            raise ValueError(
                "with_python_executable applies to procs on this host; a worker's procs run the "
                "interpreter that runs `regency worker` (start the worker with the one you want)"
            )
        return HostMesh(self._shape, self._hosts, python_executable, self._life)

    @property
    def is_fake_in_process(self) -> bool:
        """Whether this mesh's procs share one OS process: True on the simulated cluster
        (Monarch's fake in-process hosts serve tests the same way), False otherwise."""
        return current_runtime().env.simulated_host is not None

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        env: dict[str, str] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
        proc_bind: list[dict[str, str]] | None = None,
    ) -> ProcMesh:
        """Start one OS process per point of ``per_host`` on each host. Returns at once.

        ``bootstrap_command`` (procs on this host): how to start them, one
        :class:`BootstrapCommand` for all or a function of each proc's point (over the host
        dims and ``per_host``); see ``default_bootstrap_cmd()``.

        ``proc_bind`` (Linux): one dict per proc of a host (in the order of ``per_host``'s
        points) binding it to CPUs and NUMA nodes, Monarch's keys: ``cpunodebind``,
        ``membind``, ``physcpubind`` (``numactl``, on a NUMA machine) and ``cpus``
        (``taskset -c``, used where numactl does not apply); on a host of
        ``attach_to_workers`` its worker applies it."""
        self._life.check_usable()
        per_host = dict(per_host or {})
        for _dim, size in per_host.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"per_host sizes must be positive integers (got {per_host})")
        overlap = set(per_host) & set(self._shape.labels)
        if overlap:
            raise ValueError(
                f"per_host labels {sorted(overlap)} overlap with the host mesh's labels "
                f"{list(self._shape.labels)}"
            )
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise TypeError("env must map str to str")
        shape = Shape.full(
            [*self._shape.labels, *per_host], [*self._shape.sizes, *per_host.values()]
        )
        binds = None
        if proc_bind is not None:
            binds = check_proc_bind(proc_bind, math.prod(per_host.values()))
        commands = self._bootstrap_commands(bootstrap_command, shape)
        if binds is not None and self._hosts is None:
            commands = self._bind(binds, shape, commands)
        elif binds is not None and self.is_fake_in_process:
            raise ValueError("proc_bind does not apply to simulated procs (they run in-process)")
        rt = current_runtime()
        if self._hosts is not None:
            count = len(shape) // max(len(self._shape), 1)
            refs = [self._hosts[r] for r in self._shape.ranks]
            state = rt.hosts
            if state is not None and rt.env.host_launcher(refs[0].worker) is None:
                state.ensure_attached(refs)  # let go by stop(): attach again
            launchers = [rt.env.host_launcher(host.worker) or worker_launcher(rt, host) for host in refs]
            children = rt.child_procs.plan_on_launchers(launchers, count, name or "p")
            if binds is not None:
                for rank, child in enumerate(children):
                    cast(WorkerLauncher, child.launcher).binds[child.address] = binds[rank % count]
        else:
            children = rt.child_procs.plan(len(shape), name or "p")
        extent = Extent(shape.labels, shape.sizes)
        for rank, child in enumerate(children):
            child.coords = tuple(Point(rank, extent).items())
        if rt.parent_address is None:  # procs may ask the controller for its singletons
            rt.call_soon(lambda: ensure_registry(rt))
        if rt.config.tees_output:  # log forwarding, file capture or tails: loaded when on
            _extensions.log_forwarding().procs_planned(rt, children)
        python = self._python
        if python is not None:
            # The procs' own this_host() starts procs with this interpreter too (a wrapper
            # runs again for each: Monarch keeps the command on the host mesh).
            env = {**(env or {}), HOST_PYTHON_ENV: python}
        ready: Future[None] = Future()
        boot = _codec.dumps(bootstrap)[0].hex() if bootstrap is not None else None

        owner = _owner(rt)[1]

        def launch() -> None:
            rt.oversight.procs_spawned(owner, [c.address for c in children])
            if commands is not None:
                for child, command in zip(children, commands, strict=True):
                    child.launcher = LocalLauncher(rt.nursery, command=command)
            elif python is not None:
                launcher = LocalLauncher(rt.nursery, executable=python)
                for child in children:
                    child.launcher = launcher
            try:
                rt.child_procs.launch(children, env, boot)
            except Exception as exc:  # not raised: this runs as a loop callback
                ready.set_exception(exc)
                for child in children:
                    if child.returncode is None:
                        child.killed_for = f"could not be started ({exc})"
                        rt.child_procs.exited(child, 1)
                return
            rt.nursery.start_soon(_wait_ready, rt, children, ready)

        rt.call_soon(launch)
        procs = ProcMesh(tuple((c.proc_id, c.address) for c in children), shape, ready)
        self._life.procs.extend(c.address for c in children)
        record_spawned(context().actor_instance.actor_id, procs)
        return procs

    def _bootstrap_commands(
        self, spec: BootstrapCommand | Callable[[Point], BootstrapCommand] | None, shape: Shape
    ) -> list[BootstrapCommand] | None:
        """One command per proc of ``shape`` (in rank order), or None for the default."""
        if spec is None:
            return None
        if self._hosts is not None or self.is_fake_in_process:
            raise ValueError(
                "bootstrap_command applies to procs on this host; a worker's procs run the "
                "command that runs `regency worker`, and simulated procs run in-process"
            )
        if isinstance(spec, BootstrapCommand):
            commands = [spec] * len(shape)
        elif callable(spec):
            extent = Extent(shape.labels, shape.sizes)
            commands = [spec(Point(rank, extent)) for rank in range(len(shape))]
            for command in commands:
                if not isinstance(command, BootstrapCommand):
                    raise TypeError(
                        "bootstrap_command(point) must return a BootstrapCommand "
                        f"(got {command!r})"
                    )
        else:
            raise TypeError(
                "bootstrap_command must be a BootstrapCommand or a function of a Point "
                f"returning one (got {spec!r})"
            )
        for command in commands:
            if not (os.path.isfile(command.program) and os.access(command.program, os.X_OK)):
                raise FileNotFoundError(
                    f"bootstrap_command program {command.program!r} is not an executable file"
                )
        return commands

    def _bind(
        self,
        binds: list[dict[str, str]],
        shape: Shape,
        commands: list[BootstrapCommand] | None,
    ) -> list[BootstrapCommand]:
        """Each proc's command (on this host), wrapped in ``numactl``/``taskset`` as
        ``binds`` (one per proc of a host) say."""
        base = commands or [
            BootstrapCommand(self._python) if self._python is not None else _default_command()
        ] * len(shape)
        return [bind_command(binds[rank % len(binds)], c) for rank, c in enumerate(base)]

    def _refused(self, what: str) -> Future[None] | None:
        """The failed future of ``what`` (``shutdown``/``stop``) on a mesh that cannot do
        it, or None when it can."""
        why = None
        if self._life.shut_down:
            why = "HostMesh has already been shut down"
        elif not self._life.owned:
            why = (
                f"cannot {what} `HostMesh` that is a reference instead of owned (it was "
                "unpickled: only the mesh attach_to_workers returned, or its slices, can)"
            )
        if why is None:
            return None
        refused: Future[None] = Future()
        refused.set_exception(RuntimeError(why))
        return refused

    def shutdown(self) -> Future[None]:
        """Stop our procs on its hosts and detach from their workers, which end if they run
        ``run_worker_loop_forever`` (hosts from ``attach_to_workers``; on this host it stops
        nothing). The mesh cannot be used afterwards (``RuntimeError``)."""
        refused = self._refused("shut down")
        if refused is not None:
            return refused
        self._life.shut_down = True
        if self._hosts is None or self._life.error is not None:
            return resolved(None)
        rt = current_runtime()
        return shutdown_hosts(rt, [self._hosts[r] for r in self._shape.ranks])

    def stop(self) -> Future[None]:
        """Stop the procs this mesh (or a slice of it) started, and no others; workers with
        none of this controller's procs left are let go, and stay up for another
        ``attach_to_workers`` (this controller's or another's). The mesh can spawn again
        (it attaches again); ``shutdown()`` also ends ``run_worker_loop_forever`` workers."""
        refused = self._refused("stop")
        if refused is not None:
            return refused
        return stop_mesh_procs(current_runtime(), self._life)

    def sync_workspace(
        self,
        workspace: Workspace | None = None,
        conda: bool = False,
        auto_reload: bool = False,
    ) -> Future[WorkspaceSync]:
        """Copy ``workspace``'s directories (default: the working directory) to every host
        of this mesh, content-hashed: only what a host lacks travels, and what the
        directories no longer hold is deleted there (docs/workspace.md). A directory goes to
        ``$WORKSPACE_DIR/<its remote path>`` on a host whose environment sets
        ``WORKSPACE_DIR``, else to the same path as here; procs started on the host
        afterwards have it first on ``sys.path``. ``conda``: also the active conda
        environment (to the same path). ``auto_reload``: every running proc the controller
        started on these hosts reloads the modules whose files changed.

        Await it (trio or asyncio) or ``.get()`` it; it resolves to a :class:`WorkspaceSync`
        (what each host received, wrote, deleted and reloaded)."""
        from ._workspace import sync_workspace

        return _CoroutineFuture(sync_workspace(self, workspace, conda, auto_reload))

    def __repr__(self) -> str:
        return f"<HostMesh {self._shape.dim_sizes()}>"



def _reference(
    shape: Shape, hosts: tuple[HostRef, ...] | None, python: str | None
) -> HostMesh:
    """An unpickled ``HostMesh``: it spawns procs, but cannot stop or shut its hosts down."""
    return HostMesh(shape, hosts, python, MeshLife.attached(owned=False))


#: In a proc spawned from ``HostMesh.with_python_executable(path)``: that path, which the
#: proc's own ``this_host()`` keeps.
HOST_PYTHON_ENV = "REGENCY_HOST_PYTHON"


def this_host() -> HostMesh:
    """The host this code runs on, as a mesh with no dims. In a proc spawned from
    ``HostMesh.with_python_executable(path)``, procs spawned from it run ``path`` too."""
    return HostMesh(Shape.full([], []), None, os.environ.get(HOST_PYTHON_ENV) or None)


def this_proc() -> ProcMesh:
    """This process, as a one-proc mesh: actors spawned here share the caller's process."""
    rt = current_runtime()
    return ProcMesh._single(rt.proc_id, rt.address)


def proc_mesh(
    *,
    gpus: int | None = None,
    hosts: int | None = None,
    env: dict[str, str] | None = None,
    **dims: int,
) -> ProcMesh:
    """Monarch's older constructor: ``await proc_mesh(gpus=8)`` or ``proc_mesh(gpus=8).get()``."""
    per_host: dict[str, int] = {}
    if hosts not in (None, 1):
        raise ValueError(f"proc_mesh on this host supports hosts=1 only (got hosts={hosts})")
    if gpus is not None:
        per_host["gpus"] = gpus
    per_host.update(dims)
    return this_host().spawn_procs(per_host=per_host, env=env)
