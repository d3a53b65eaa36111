"""Singleton actors in the controller: ``get_or_spawn_controller(name, Class)``.

Each job's controller (the root runtime) holds one registry actor under a fixed key, which
spawns each named controller once, in the controller's own process, and hands out the mesh.
Any actor in any proc reaches it at the root's address, so everyone gets the same one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from ..supervision import ROOT, MeshFailure
from ._endpoint import Actor, endpoint
from ._future import Future
from ._shape import Shape

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._runtime import Runtime

A = TypeVar("A", bound=Actor)

#: The registry's actor key in the root runtime.
REGISTRY_KEY = "regency.controllers"


def root_address(rt: Runtime) -> str:
    """The address of the job's controller (the root runtime), seen from ``rt``."""
    if rt.parent_address is None:
        return rt.address
    return rt.root_address or rt.parent_address


class _Registry(Actor):
    """The controller's registry of named singleton actors."""

    def __init__(self) -> None:
        self._controllers: dict[str, Any] = {}
        self._by_key: dict[str, str] = {}

    @endpoint
    async def get_or_spawn(
        self, name: str, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        from ._proc_mesh import this_proc

        if name not in self._controllers:
            mesh: Any = this_proc().spawn(name, cls, *args, **kwargs)
            self._controllers[name] = mesh
            self._by_key[mesh._key] = name
        found = self._controllers[name]
        if isinstance(found, MeshFailure):
            raise ValueError(f"controller {name!r} has failed: {found}")
        return found

    def __supervise__(self, failure: MeshFailure) -> bool:
        name = self._by_key.get(failure.mesh_key)
        if name is None:
            return False
        if not isinstance(self._controllers[name], MeshFailure):
            self._controllers[name] = failure  # later lookups raise; the program goes on
        return True


def ensure_registry(rt: Runtime) -> None:
    """Create the registry in a root runtime (on its trio thread; idempotent)."""
    if REGISTRY_KEY in rt.actors or REGISTRY_KEY in rt.dead:
        return
    rt.spawn_here(
        REGISTRY_KEY,
        "controller_controller",
        (0, [], []),
        (_Registry, (), {}),
        None,
        (rt.address, ROOT, "client"),
    )


def get_or_spawn_controller(name: str, cls: type[A], *args: Any, **kwargs: Any) -> Future[A]:
    """The singleton actor ``name`` of the job, spawned as ``cls(*args, **kwargs)`` in the
    controller's process by the first caller (from the controller or from any actor);
    every later caller gets the same mesh. Resolves to a one-rank ``ActorMesh`` (typed as
    ``cls``, as ``spawn`` is)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a controller's name must be a non-empty string (got {name!r})")
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"get_or_spawn_controller needs an Actor subclass (got {cls!r})")
    from ._actor_mesh import ActorMesh
    from ._controller import current_runtime

    rt = current_runtime()
    root = root_address(rt)
    if rt.parent_address is None:
        rt.call_soon(lambda: ensure_registry(rt))
    registry: ActorMesh[_Registry] = ActorMesh(
        REGISTRY_KEY, "controller_controller", _Registry, (("root", root),), Shape.full([], [])
    )
    fut: Future[A] = registry.get_or_spawn.call_one(name, cls, args, kwargs)
    return fut
