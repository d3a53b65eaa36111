"""Host, proc and actor meshes, endpoints and their adverbs, ports and channels.

Meshes are immutable values that pickle: passing one to an actor lets that actor talk to the
mesh directly, from its own process. All sending goes through this process's runtime
(:func:`current_runtime`), looked up at call time.
"""

from __future__ import annotations

import signal
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import trio

from .._tensor_engine._procmesh import TensorEngineMesh
from ..supervision import ROOT, MeshStopped, ProcStopped
from . import _codec
from . import _messages as M
from ._context import current as current_context
from ._endpoint import Actor, EndpointSpec, endpoints_of
from ._errors import ActorError, RemoteFailure, SupervisionError, UndeliverableError
from ._future import Future, resolved
from ._hosts import HostRef, launch_remote, plan_remote, shutdown_hosts
from ._runtime import Child, Runtime, current_runtime
from ._shape import MeshAlgebra, Shape, ValueMesh

A = TypeVar("A", bound=Actor)
R = TypeVar("R")
T = TypeVar("T")
Acc = TypeVar("Acc")

ProcRef = tuple[str, str]  # (proc_id, address)


# -- reply collection (port handlers, run on the runtime's trio thread) ----------------------


def _decode(endpoint: str, index: int, status: int, parts: list[memoryview]) -> Any:
    """Unpickle a reply; raise what the caller should see for an error reply."""
    value = _codec.loads(parts)
    if status == M.OK:
        return value
    if status == M.ERROR:
        raise ActorError(endpoint, value, index)
    raise SupervisionError(f"Endpoint call {endpoint} failed: {value.message}")


def _call_failed(
    endpoint: str, exc: BaseException, address: str | None, route: _Route
) -> SupervisionError:
    """The error for a call whose destination is lost, naming the mesh ranks behind it."""
    ranks = [route.ranks[r] for r, a in enumerate(route.addresses) if a == address]
    where = f" on rank {ranks[0]}" if len(ranks) == 1 else f" on ranks {ranks}" if ranks else ""
    return SupervisionError(f"Endpoint call {endpoint} failed{where}: {exc}")


class _OneReply:
    __slots__ = ("dests", "endpoint", "fut", "rank")

    def __init__(self, fut: Future[Any], endpoint: str, dests: frozenset[str], rank: int) -> None:
        self.fut = fut
        self.endpoint = endpoint
        self.dests = dests
        self.rank = rank

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        try:
            self.fut.set_result(_decode(self.endpoint, index, status, parts))
        except Exception as exc:
            self.fut.set_exception(exc)
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(
            SupervisionError(f"Endpoint call {self.endpoint} failed on rank {self.rank}: {exc}")
        )


class _MeshReplies:
    """Builds the ValueMesh of a ``call``; the first error fails the whole future."""

    def __init__(
        self, fut: Future[Any], endpoint: str, shape: Shape, route: _Route
    ) -> None:
        self.fut = fut
        self.endpoint = endpoint
        self.shape = shape
        self.route = route
        self.dests = route.all_dests
        self.values: list[Any] = [None] * len(shape)
        self.seen = [False] * len(shape)
        self.missing = len(shape)

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        if self.seen[index]:
            return False  # an explicit port answered twice: the first answer counts
        self.seen[index] = True
        try:
            self.values[index] = _decode(self.endpoint, index, status, parts)
        except Exception as exc:
            self.fut.set_exception(exc)
            return True
        self.missing -= 1
        if self.missing == 0:
            self.fut.set_result(ValueMesh(self.shape, self.values))
            return True
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(_call_failed(self.endpoint, exc, address, self.route))


class _StreamReplies:
    """Resolves the k-th future with the k-th reply to arrive."""

    def __init__(self, futs: list[Future[Any]], endpoint: str, route: _Route) -> None:
        self.futs = futs
        self.next = 0
        self.endpoint = endpoint
        self.route = route
        self.dests = route.all_dests

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        fut = self.futs[self.next]
        self.next += 1
        try:
            fut.set_result(_decode(self.endpoint, index, status, parts))
        except Exception as exc:
            fut.set_exception(exc)
        return self.next == len(self.futs)

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        for fut in self.futs[self.next :]:
            fut.set_exception(_call_failed(self.endpoint, exc, address, self.route))


class _Fold:
    """Left fold of replies in arrival order (``Accumulator``)."""

    def __init__(
        self,
        fut: Future[Any],
        endpoint: str,
        n: int,
        acc: Any,
        combine: Callable[[Any, Any], Any],
        route: _Route,
    ) -> None:
        self.fut, self.endpoint, self.missing = fut, endpoint, n
        self.acc, self.combine, self.route = acc, combine, route
        self.dests = route.all_dests

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        try:
            self.acc = self.combine(self.acc, _decode(self.endpoint, index, status, parts))
        except Exception as exc:
            self.fut.set_exception(exc)
            return True
        self.missing -= 1
        if self.missing == 0:
            self.fut.set_result(self.acc)
            return True
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(_call_failed(self.endpoint, exc, address, self.route))


class _Acks:
    """Counts acknowledgements (spawn, stop); errors are remembered, not raised."""

    def __init__(self, fut: Future[None], n: int, what: str, dests: frozenset[str]) -> None:
        self.fut, self.missing, self.what, self.dests = fut, n, what, dests
        self.failures: list[RemoteFailure] = []

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        if status != M.OK:
            self.failures.append(_codec.loads(parts))
        return self.skip(1)

    def skip(self, count: int) -> bool:
        """``count`` ranks will never answer (already gone: nothing to stop or spawn there).
        Returns True when the port is finished."""
        self.missing -= count
        if self.missing > 0:
            return False
        if self.failures:
            first = self.failures[0]
            self.fut.set_exception(
                SupervisionError(
                    f"{self.what} failed on {len(self.failures)} rank(s): "
                    f"{first.type_name}: {first.message}\n{first.traceback}"
                )
            )
        else:
            self.fut.set_result(None)
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(SupervisionError(f"{self.what} failed: {exc}"))


# -- endpoints -----------------------------------------------------------------------------


class _Route(NamedTuple):
    addresses: tuple[str, ...]  # by local rank
    ranks: tuple[int, ...]  # the mesh rank of each local rank
    dest_sets: tuple[frozenset[str], ...]  # {address}, by local rank
    all_dests: frozenset[str]
    labels: tuple[str, ...]
    sizes: tuple[int, ...]


_NO_ARGUMENTS = _codec.dumps(((), {}))


def _pickle_args(
    endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], whole: Any = None
) -> list[Any]:
    """Pickle ``whole`` (default: ``(args, kwargs)``), naming the argument at fault when it
    cannot be pickled."""
    if whole is None:
        if not args and not kwargs:
            return _NO_ARGUMENTS  # the common no-argument call: pickled once
        oob = _codec.out_of_band
        whole = (
            tuple(oob(a) for a in args),
            {k: oob(v) for k, v in kwargs.items()} if kwargs else kwargs,
        )
    try:
        return _codec.dumps(whole)
    except Exception as exc:
        for position, value in enumerate(args):
            try:
                _codec.dumps(value)
            except Exception as inner:
                raise TypeError(
                    f"cannot pickle argument #{position} ({type(value).__name__}) "
                    f"of endpoint {endpoint}: {inner}"
                ) from inner
        for name, value in kwargs.items():
            try:
                _codec.dumps(value)
            except Exception as inner:
                raise TypeError(
                    f"cannot pickle argument {name!r} ({type(value).__name__}) "
                    f"of endpoint {endpoint}: {inner}"
                ) from inner
        raise TypeError(f"cannot pickle the arguments of endpoint {endpoint}: {exc}") from exc


class Endpoint(Generic[R]):
    """An endpoint of an actor mesh (or slice): the adverbs send to its ranks.

    Every adverb sends its messages before it returns; the future only collects replies.
    """

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    @property
    def qualname(self) -> str:
        return f"{self._mesh._name}.{self._name}"

    def _send(
        self,
        rt: Runtime,
        local_ranks: Sequence[int],
        port: tuple[str, int] | None,
        payload: list[Any],
    ) -> None:
        route = self._mesh._route()
        key, name, labels, sizes = self._mesh._key, self._name, route.labels, route.sizes
        for local in local_ranks:
            frame = _codec.pack((M.CALL, key, name, port, local, labels, sizes), payload)
            rt.send(route.addresses[local], frame)

    def _issue(
        self, rt: Runtime, local_ranks: Sequence[int], handler: Any, payload: list[Any]
    ) -> None:
        """Open a reply port for ``handler`` and send to ``local_ranks``.

        A rank known to have failed, or a proc known to be unreachable, fails the handler at
        once; a message too large raises here, at the call site.
        """
        port = rt.open_port(handler)
        try:
            self._check_alive(rt, local_ranks)
            self._send(rt, local_ranks, port, payload)
        except SupervisionError as exc:
            rt.close_port(port[1])
            handler.fail(exc)
        except ValueError:
            rt.close_port(port[1])
            raise

    def _check_alive(self, rt: Runtime, local_ranks: Sequence[int]) -> None:
        machine, key, ranks = rt.oversight.machine, self._mesh._key, self._mesh._shape.ranks
        for local in local_ranks:
            if machine.failed(key, ranks[local]):
                cause = machine.cause_of(key, ranks[local])
                why = f": {cause.summary}" if cause is not None else ""
                raise SupervisionError(
                    f"actor mesh {self._mesh._name} has failed at rank {ranks[local]}{why}"
                )

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Send to every rank; the future resolves to a ValueMesh of the replies."""
        rt = current_runtime()
        payload = _pickle_args(self.qualname, args, kwargs)
        fut: Future[ValueMesh[R]] = Future()
        route = self._mesh._route()
        self._issue(
            rt,
            range(len(route.addresses)),
            _MeshReplies(fut, self.qualname, self._mesh._shape, route),
            payload,
        )
        return fut

    def _call_rank(self, rt: Runtime, local: int, payload: list[Any]) -> Future[R]:
        fut: Future[R] = Future()
        route = self._mesh._route()
        handler = _OneReply(fut, self.qualname, route.dest_sets[local], route.ranks[local])
        self._issue(rt, (local,), handler, payload)
        return fut

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the only rank of a one-rank mesh."""
        n = len(self._mesh._shape)
        if n != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly 1 rank (got {n} ranks: "
                f"{self._mesh._shape.dim_sizes()}); slice it first or use call()"
            )
        rt = current_runtime()
        return self._call_rank(rt, 0, _pickle_args(self.qualname, args, kwargs))

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one rank chosen uniformly at random."""
        rt = current_runtime()
        payload = _pickle_args(self.qualname, args, kwargs)
        return self._call_rank(rt, rt.rng.randrange(len(self._mesh._shape)), payload)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Send to every rank; yield one future per rank, in the order replies arrive."""
        rt = current_runtime()
        payload = _pickle_args(self.qualname, args, kwargs)
        route = self._mesh._route()
        futs: list[Future[R]] = [Future() for _ in route.addresses]
        handler = _StreamReplies(futs, self.qualname, route)
        self._issue(rt, range(len(futs)), handler, payload)
        return iter(futs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every rank; wait for nothing. A rank known to have failed raises
        ``SupervisionError`` here."""
        rt = current_runtime()
        payload = _pickle_args(self.qualname, args, kwargs)
        ranks = range(len(self._mesh._shape))
        self._check_alive(rt, ranks)
        self._send(rt, ranks, None, payload)

    def _fold(
        self, acc: Any, combine: Callable[[Any, Any], Any], args: Any, kwargs: Any
    ) -> Future[Any]:
        rt = current_runtime()
        payload = _pickle_args(self.qualname, args, kwargs)
        route = self._mesh._route()
        fut: Future[Any] = Future()
        n = len(route.addresses)
        handler = _Fold(fut, self.qualname, n, acc, combine, route)
        self._issue(rt, range(n), handler, payload)
        return fut

    def __repr__(self) -> str:
        return f"<Endpoint {self.qualname} over {self._mesh._shape.dim_sizes()}>"


class _PlainMethod:
    """An undecorated method looked up on a mesh: only ``as_endpoint`` can use it."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh, self._name = mesh, name

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(
            f"{self._mesh._cls.__name__}.{self._name} is not an endpoint; decorate it with "
            f"@endpoint, or call it through as_endpoint(mesh.{self._name}).{attr}(...)"
        )


def as_endpoint(method: Any) -> Endpoint[Any]:
    """Call an undecorated actor method through a mesh (Monarch's ``as_endpoint``)."""
    if isinstance(method, Endpoint):
        return method
    if isinstance(method, _PlainMethod):
        return Endpoint(method._mesh, method._name)
    raise TypeError(f"as_endpoint takes a method looked up on an actor mesh (got {method!r})")


class Accumulator(Generic[R, Acc]):
    """Left fold of an endpoint's replies over all ranks, in arrival order."""

    def __init__(self, endpoint: Endpoint[R], identity: Acc, combine: Callable[[Acc, R], Acc]):
        self._endpoint, self._identity, self._combine = endpoint, identity, combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[Acc]:
        return self._endpoint._fold(self._identity, self._combine, args, kwargs)


def send(
    endpoint: Endpoint[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Send to an endpoint's ranks; replies, if any, go to ``port`` (Monarch's ``send``)."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be one of ('all', 'choose') (got {selection!r})")
    rt = current_runtime()
    payload = _pickle_args(endpoint.qualname, args, kwargs)
    n = len(endpoint._mesh._shape)
    ranks: Sequence[int] = [rt.rng.randrange(n)] if selection == "choose" else range(n)
    endpoint._send(rt, ranks, port._ref if port is not None else None, payload)


# -- meshes --------------------------------------------------------------------------------


class ActorMesh(MeshAlgebra, Generic[A]):
    """Actors of one class spawned on a proc mesh; each endpoint is an attribute."""

    __slots__ = (
        "_cached_route",
        "_cls",
        "_endpoints",
        "_init",
        "_key",
        "_name",
        "_procs",
        "_shape",
    )

    def __init__(
        self,
        key: str,
        name: str,
        cls: type[A],
        procs: tuple[ProcRef, ...],
        shape: Shape,
        init: Future[None] | None = None,
    ) -> None:
        self._key, self._name, self._cls = key, name, cls
        self._procs, self._shape = procs, shape
        self._init = init
        self._endpoints: dict[str, Endpoint[Any]] = {}
        self._cached_route: _Route | None = None

    def _route(self) -> _Route:
        """Per-rank addresses and envelope fields, computed once per mesh object."""
        route = self._cached_route
        if route is None:
            shape = self._shape
            addresses = tuple(self._procs[r][1] for r in shape.ranks)
            route = _Route(
                addresses,
                shape.ranks,
                tuple(frozenset((a,)) for a in addresses),
                frozenset(addresses),
                shape.labels,
                shape.sizes,
            )
            self._cached_route = route
        return route

    def _with_shape(self, shape: Shape) -> ActorMesh[A]:
        return ActorMesh(self._key, self._name, self._cls, self._procs, shape, self._init)

    def __reduce__(self) -> Any:
        return (ActorMesh, (self._key, self._name, self._cls, self._procs, self._shape))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cached = self._endpoints.get(name)
        if cached is not None:
            return cached
        attr = getattr(self._cls, name, None)
        if isinstance(attr, EndpointSpec):
            ep: Endpoint[Any] = Endpoint(self, name)
            self._endpoints[name] = ep
            return ep
        if callable(attr):
            return _PlainMethod(self, name)
        raise AttributeError(
            f"{self._cls.__name__} has no endpoint {name!r}; "
            f"endpoints: {sorted(endpoints_of(self._cls))}"
        )

    def endpoint(self, name: str) -> Endpoint[Any]:
        """The endpoint ``name``, also when a mesh attribute of that name hides it
        (``mesh.size`` is the mesh's size; ``mesh.endpoint("size")`` the endpoint)."""
        if not isinstance(getattr(self._cls, name, None), EndpointSpec):
            raise AttributeError(
                f"{self._cls.__name__} has no endpoint {name!r}; "
                f"endpoints: {sorted(endpoints_of(self._cls))}"
            )
        return Endpoint(self, name)

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every rank's ``__init__`` has run (fails if one raised)."""
        if self._init is None:
            raise RuntimeError("only the spawner of a mesh can wait for its initialization")
        return self._init

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor of this mesh (or slice) once it has handled the messages already
        queued for it; later calls fail with ``SupervisionError``."""
        rt = current_runtime()
        fut: Future[None] = Future()
        shape = self._shape
        key, ranks = self._key, tuple(shape.ranks)
        # Stopping is not failing: the owner is not told about these ranks.
        rt.call_soon(lambda: rt.oversight.machine.handle(MeshStopped(key, ranks)))
        dests = frozenset(self._procs[r][1] for r in shape.ranks)
        acks = _Acks(fut, len(shape), f"stopping {self._name}", dests)
        port = rt.open_port(acks)
        unreachable = 0
        for global_rank in shape.ranks:
            try:
                rt.send(self._procs[global_rank][1], _codec.pack((M.STOP_ACTOR, self._key, port)))
            except UndeliverableError:
                unreachable += 1  # already gone: nothing to stop there

        def count_unreachable() -> None:  # ports belong to the loop
            if acks.skip(unreachable):
                rt.close_port(port[1])

        if unreachable:
            rt.call_soon(count_unreachable)
        return fut

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name} ({self._cls.__name__}) {self._shape.dim_sizes()}>"


def _owner(rt: Runtime) -> tuple[str, str, str]:
    """(address, key, name) of the actor running now, or of the root client."""
    ctx = current_context.get()
    if ctx is None:
        return (rt.address, ROOT, "client")
    return (rt.address, ctx.actor_instance.actor_id, ctx.actor_instance.name)


_MESH_ATTRIBUTES = frozenset(
    name for name in dir(ActorMesh) if not name.startswith("_")
)


class ProcMesh(TensorEngineMesh, MeshAlgebra):
    """Processes, arranged as a mesh; spawn actors on them."""

    __slots__ = ("_procs", "_ready", "_shape")

    def __init__(
        self, procs: tuple[ProcRef, ...], shape: Shape, ready: Future[None] | None = None
    ) -> None:
        self._procs, self._shape, self._ready = procs, shape, ready

    @classmethod
    def _single(cls, proc_id: str, address: str) -> ProcMesh:
        return cls(((proc_id, address),), Shape.full([], []))

    def _with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._procs, shape, self._ready)

    def __reduce__(self) -> Any:
        return (ProcMesh, (self._procs, self._shape))

    def spawn(self, name: str, cls: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Spawn ``cls(*args, **kwargs)`` on every proc. Returns at once; ``__init__`` runs
        before the first message any rank handles."""
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"spawn needs an Actor subclass (got {cls!r})")
        shadowed = sorted(set(endpoints_of(cls)) & _MESH_ATTRIBUTES)
        if shadowed:
            warnings.warn(
                f"endpoints {shadowed} of {cls.__name__} are hidden by ActorMesh attributes "
                f"of the same name; call them as mesh.endpoint({shadowed[0]!r}).call(...) "
                "or rename them",
                RuntimeWarning,
                stacklevel=2,
            )
        rt = current_runtime()
        payload = _pickle_args(f"{cls.__name__}.__init__", args, kwargs, (cls, args, kwargs))
        key = rt.new_name(f"{name}.")
        shape = self._shape
        init: Future[None] = Future()
        dests = frozenset(self._procs[r][1] for r in shape.ranks)
        port = rt.open_port(_Acks(init, len(shape), f"spawning {name}", dests))
        labels, sizes = list(shape.labels), list(shape.sizes)
        # The actor mesh's own ranks are 0..n-1 over the procs of this (maybe sliced) mesh.
        procs = tuple(self._procs[r] for r in shape.ranks)
        mesh = ActorMesh(key, name, cls, procs, Shape.full(shape.labels, shape.sizes), init)
        owner = _owner(rt)
        addresses = tuple(address for _, address in procs)
        rt.call_soon(lambda: rt.oversight.mesh_spawned(key, name, owner[1], owner[2], addresses))
        for local, address in enumerate(addresses):
            rt.send(
                address,
                _codec.pack((M.SPAWN, key, name, local, labels, sizes, port, owner), payload),
            )
        return mesh

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every proc has started and connected back."""
        if self._ready is None:
            fut: Future[None] = Future()
            fut.set_result(None)
            return fut
        return self._ready

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of this mesh; resolves when they have exited."""
        rt = current_runtime()
        done: Future[None] = Future()
        addresses = [self._procs[r][1] for r in self._shape.ranks]
        rt.start_soon(_stop_procs, rt, addresses, done)
        return done

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


async def _stop_procs(rt: Runtime, addresses: list[str], done: Future[None]) -> None:
    for address in addresses:
        rt.oversight.feed(ProcStopped(address))  # stopping is not failing
    children = [rt.children[a] for a in addresses if a in rt.children]
    for child in children:
        if child.returncode is None:
            try:
                rt.send(child.address, _codec.pack((M.STOP_PROC, None)))
            except UndeliverableError:
                pass
    with trio.move_on_after(rt.config.stop_timeout):
        for child in children:
            await child.exited.wait()
    for child in children:
        if child.returncode is None and child.handle is not None:
            child.handle.kill()
    with trio.move_on_after(rt.config.stop_timeout):
        for child in children:
            await child.exited.wait()
    for child in children:
        if child.returncode is None:  # a remote proc whose worker is gone, or never started
            rt._child_exited(child, -signal.SIGKILL)
    done.set_result(None)


class HostMesh(MeshAlgebra):
    """Hosts, arranged as a mesh; start procs on them."""

    __slots__ = ("_hosts", "_shape")

    def __init__(self, shape: Shape, hosts: tuple[HostRef, ...] | None = None) -> None:
        self._shape = shape
        #: Remote hosts by global rank (``attach_to_workers``); None for this host.
        self._hosts = hosts

    def _with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts)

    def __reduce__(self) -> Any:
        return (HostMesh, (self._shape, self._hosts))

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ProcMesh:
        """Start one OS process per point of ``per_host`` on each host. Returns at once."""
        per_host = dict(per_host or {})
        for _dim, size in per_host.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"per_host sizes must be positive integers (got {per_host})")
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise TypeError("env must map str to str")
        shape = Shape.full(
            [*self._shape.labels, *per_host], [*self._shape.sizes, *per_host.values()]
        )
        rt = current_runtime()
        remote = False
        if self._hosts is not None:
            count = len(shape) // max(len(self._shape), 1)
            hosts = [self._hosts[r] for r in self._shape.ranks]
            if all(h.worker in rt.host_launchers for h in hosts):
                children = rt.plan_on_launchers(
                    [rt.host_launchers[h.worker] for h in hosts], count, name or "p"
                )
            else:
                remote = True
                children = plan_remote(rt, hosts, count, name or "p")
        else:
            children = rt.plan_procs(len(shape), name or "p")
        ready: Future[None] = Future()
        boot = _codec.dumps(bootstrap)[0].hex() if bootstrap is not None else None

        owner = _owner(rt)[1]

        def launch() -> None:
            rt.oversight.procs_spawned(owner, [c.address for c in children])
            try:
                if remote:
                    launch_remote(rt, children, env, boot)
                else:
                    rt.launch_procs(children, env, boot)
            except Exception as exc:  # not raised: this runs as a loop callback
                ready.set_exception(exc)
                for child in children:
                    if child.returncode is None:
                        child.killed_for = f"could not be started ({exc})"
                        rt._child_exited(child, 1)
                return
            rt.nursery.start_soon(_wait_ready, rt, children, ready)

        rt.call_soon(launch)
        return ProcMesh(tuple((c.proc_id, c.address) for c in children), shape, ready)

    def shutdown(self) -> Future[None]:
        """Stop this mesh's procs on its hosts and detach from their workers (hosts from
        ``attach_to_workers``; on this host it stops nothing)."""
        if self._hosts is None:
            return resolved(None)
        rt = current_runtime()
        return shutdown_hosts(rt, [self._hosts[r] for r in self._shape.ranks])

    def __repr__(self) -> str:
        return f"<HostMesh {self._shape.dim_sizes()}>"


async def _wait_ready(rt: Runtime, children: list[Child], ready: Future[None]) -> None:
    try:
        with trio.fail_after(rt.config.spawn_timeout):
            for child in children:
                event = rt.child_ready.get(child.address)
                if event is not None:
                    async with trio.open_nursery() as n:

                        async def exited(c: Child = child) -> None:
                            await c.exited.wait()
                            n.cancel_scope.cancel()

                        n.start_soon(exited)
                        await event.wait()
                        n.cancel_scope.cancel()
                if child.returncode is not None:
                    raise SupervisionError(
                        f"proc {child.proc_id} exited with {child.returncode} before it started"
                    )
    except trio.TooSlowError:
        ready.set_exception(
            TimeoutError(f"procs did not start within spawn_timeout={rt.config.spawn_timeout} s")
        )
    except Exception as exc:
        ready.set_exception(exc)
    else:
        ready.set_result(None)


def this_host() -> HostMesh:
    """The host this code runs on, as a mesh with no dims."""
    return HostMesh(Shape.full([], []))


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


def stop_owned_procs(rt: Runtime, timeout: float) -> None:
    """At exit: ask every child proc to stop, then kill what is left."""
    if not rt.children:
        return
    done: Future[None] = Future()
    addresses = list(rt.children)

    try:
        rt.start_soon(_stop_procs, rt, addresses, done)
        done.get(timeout)
    except Exception:
        for child in list(rt.children.values()):
            if child.handle is not None and child.returncode is None:
                child.handle.kill()


# -- ports and channels --------------------------------------------------------------------


class Port(Generic[T]):
    """Where replies go: picklable, so it can be passed to any actor; in-order delivery.

    A reply port (explicit response port) carries the rank it answers for; a channel port
    (``Channel.open``) stamps each value with the sender's rank, which ``open_ranked`` shows.
    """

    __slots__ = ("_index", "_ref")

    def __init__(self, ref: tuple[str, int] | None, index: int | None = None) -> None:
        self._ref, self._index = ref, index

    def __reduce__(self) -> Any:
        return (Port, (self._ref, self._index))

    def _rank(self) -> int:
        if self._index is not None:
            return self._index
        from ._context import current

        ctx = current.get()
        return ctx.actor_instance.rank.rank if ctx is not None else 0

    def send(self, value: T) -> None:
        if self._ref is not None:
            current_runtime().send_port(self._ref, self._rank(), M.OK, value)

    def exception(self, exc: BaseException) -> None:
        if self._ref is not None:
            failure = RemoteFailure.capture(exc)
            current_runtime().send_port(self._ref, self._rank(), M.ERROR, failure)

    def __repr__(self) -> str:
        return f"<Port {self._ref}>"


class _Inbox:
    dests: frozenset[str] = frozenset()

    def __init__(self, once: bool, ranked: bool) -> None:
        self.values: deque[tuple[int, int, Any]] = deque()
        self.waiters: deque[Future[Any]] = deque()
        self.once, self.ranked = once, ranked
        self.done = False

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        item = (index, status, _codec.loads(parts))
        if self.waiters:
            self._settle(self.waiters.popleft(), item)
        else:
            self.values.append(item)
        self.done = self.once
        return self.once

    def _settle(self, fut: Future[Any], item: tuple[int, int, Any]) -> None:
        index, status, value = item
        if status == M.OK:
            fut.set_result((index, value) if self.ranked else value)
        else:
            fut.set_exception(ActorError("sent to a channel", value, index))

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.failure = exc
        for fut in self.waiters:
            fut.set_exception(exc)
        self.waiters.clear()

    failure: BaseException | None = None

    def take(self) -> Future[Any]:
        fut: Future[Any] = Future()
        if not self.values and self.failure is not None:
            fut.set_exception(self.failure)
        elif self.values:
            self._settle(fut, self.values.popleft())
        else:
            self.waiters.append(fut)
        return fut


class PortReceiver(Generic[T]):
    """The receiving end of a channel; lives in the process that opened it."""

    def __init__(self, rt: Runtime, inbox: _Inbox) -> None:
        self._rt, self._inbox = rt, inbox

    def recv(self) -> Future[T]:
        """The next value, in order: ``await recv.recv()`` or ``recv.recv().get()``."""
        fut: Future[T] = Future()

        def take() -> None:
            inner = self._inbox.take()
            inner.add_done_callback(lambda: _copy(inner, fut))

        self._rt.call_soon(take)
        return fut


def _copy(src: Future[Any], dst: Future[Any]) -> None:
    try:
        dst.set_result(src.get())
    except BaseException as exc:
        dst.set_exception(exc)


class Channel(Generic[T]):
    """``port, receiver = Channel[int].open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[T], PortReceiver[T]]:
        rt = current_runtime()
        inbox = _Inbox(once, ranked=False)
        return Port(rt.open_port(inbox)), PortReceiver(rt, inbox)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[T], PortReceiver[tuple[int, T]]]:
        rt = current_runtime()
        inbox = _Inbox(once, ranked=True)
        return Port(rt.open_port(inbox)), PortReceiver(rt, inbox)
