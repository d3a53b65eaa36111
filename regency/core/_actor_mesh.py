"""Actor meshes: actors of one class spawned on a proc mesh, one endpoint per attribute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..supervision import ROOT, MeshStopped
from . import _codec
from . import _messages as M
from ._adverbs import Endpoint, _PlainMethod
from ._context import current as current_context
from ._controller import current_runtime
from ._endpoint import Actor, EndpointSpec, endpoints_of
from ._errors import UndeliverableError
from ._future import Future
from ._replies import _Acks, _Route
from ._shape import MeshAlgebra, Shape

if TYPE_CHECKING:
    from ._runtime import Runtime

A = TypeVar("A", bound=Actor)

ProcRef = tuple[str, str]  # (proc_id, address)


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
        self._endpoints: dict[str, Endpoint[..., Any]] = {}
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
                tuple((a,) for a in addresses),
                tuple((r,) for r in shape.ranks),
                f"{self._cls.__module__}.{self._cls.__qualname__}",
            )
            self._cached_route = route
        return route

    def _with_shape(self, shape: Shape) -> ActorMesh[A]:
        return type(self)(self._key, self._name, self._cls, self._procs, shape, self._init)

    def __reduce__(self) -> Any:
        return (type(self), (self._key, self._name, self._cls, self._procs, self._shape))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cached = self._endpoints.get(name)
        if cached is not None:
            return cached
        attr = getattr(self._cls, name, None)
        if isinstance(attr, EndpointSpec):
            ep: Endpoint[..., Any] = Endpoint(self, name)
            self._endpoints[name] = ep
            return ep
        if callable(attr):
            return _PlainMethod(self, name)
        raise AttributeError(
            f"{self._cls.__name__} has no endpoint {name!r}; "
            f"endpoints: {sorted(endpoints_of(self._cls))}"
        )

    def endpoint(self, name: str) -> Endpoint[..., Any]:
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

    def __await__(self) -> Any:
        """``await proc_mesh.spawn(...)`` (Monarch's older form): resolves to this mesh once
        every rank's ``__init__`` has run, raising what ``initialized`` raises. A mesh that
        was passed in rather than spawned here resolves at once (its spawner waited)."""

        async def wait() -> ActorMesh[A]:
            if self._init is not None:
                await self._init
            return self

        return wait().__await__()

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor of this mesh (or slice) once it has handled the messages already
        queued for it; later calls fail with ``SupervisionError``."""
        rt = current_runtime()
        fut: Future[None] = Future()
        shape = self._shape
        key, ranks = self._key, tuple(shape.ranks)
        # Stopping is not failing: the owner is not told about these ranks.
        rt.call_soon(lambda: rt.oversight.feed(MeshStopped(key, ranks)))
        dests = frozenset(self._procs[r][1] for r in shape.ranks)
        acks = _Acks(fut, len(shape), f"stopping {self._name}", dests)
        port = rt.open_port(acks)
        unreachable = 0
        for global_rank in shape.ranks:
            try:
                # In order with this sender's casts (a stop never overtakes a broadcast).
                rt.casting.post_actor(
                    self._procs[global_rank][1],
                    self._key,
                    _codec.encode(M.StopActor(self._key, port)),
                )
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


class _StopEndpointActorMesh(ActorMesh[A]):
    """The mesh of an actor class with an endpoint named ``stop`` (Monarch's GRPO example has
    one): ``mesh.stop`` is that endpoint, as the program means; the mesh itself stops with
    ``ActorMesh.stop(mesh)`` or with its procs."""

    __slots__ = ()

    @property
    def stop(self) -> Endpoint[..., Any]:
        return self.endpoint("stop")
