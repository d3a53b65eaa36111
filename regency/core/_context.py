"""What the code running now is: which actor, at which rank, handling which message."""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from ._shape import Extent, Point

if TYPE_CHECKING:
    from ._proc_mesh import ProcMesh


#: The proc meshes each actor (by actor_id; the root client too) spawned from this process,
#: in order: Monarch's ``actor_instance._children``, which test fixtures read and reassign.
_spawned: dict[str, list[ProcMesh]] = {}


def record_spawned(actor_id: str, procs: ProcMesh) -> None:
    _spawned.setdefault(actor_id, []).append(procs)


# Fields cannot change (as if frozen); ``_children`` can be reassigned (Monarch's fixtures do).
@attrs.define(on_setattr=attrs.setters.frozen, unsafe_hash=True)
class ActorInstance:
    """The actor that is running (the controller's root client outside any actor)."""

    name: str
    actor_id: str
    #: This actor's Point in the mesh it was spawned as.
    rank: Point
    proc_id: str
    _proc_address: str
    #: ``module.Class`` of the actor ("" for the controller's root client).
    class_name: str = ""

    def __str__(self) -> str:
        """As Monarch prints an actor: ``<module.Class name{'gpus': 0/2}>``; ``<root>``."""
        if not self.class_name:
            return "<root>"
        return f"<{self.class_name} {self.name}{self.rank}>"

    @property
    def creator(self) -> CreatorInstance | None:
        """The actor that spawned this actor's mesh (Monarch's ``creator``): the root client
        (name ``"root"``) for meshes the controller's main code spawned; None for the root
        client itself. Where the spawning actor runs in this process its class, rank and own
        creator are filled in; elsewhere only its name, id and proc are known here."""
        from ..supervision import ROOT
        from ._controller import current_runtime

        if not self.class_name:
            return None
        rt = current_runtime()
        cell = rt.actors.get(self.actor_id)
        if cell is None:
            return None
        address, key, name = cell.owner
        if key == ROOT:
            return CreatorInstance("root", key, _ROOT_POINT, "", address, None, None)
        spawner = rt.actors.get(key) if address == rt.address else None
        if spawner is not None:
            inst = spawner.instance
            return CreatorInstance(
                inst.name, key, inst.rank, inst.proc_id, address, inst.class_name, inst.creator
            )
        return CreatorInstance(name, key, None, "", address, None, None)

    @property
    def _children(self) -> list[ProcMesh] | None:
        """The proc meshes this actor spawned from this process (None when none), as
        Monarch's private attribute of that name; assigning replaces the list."""
        return _spawned.get(self.actor_id) or None

    @_children.setter
    def _children(self, children: list[ProcMesh] | None) -> None:
        if children:
            _spawned[self.actor_id] = list(children)
        else:
            _spawned.pop(self.actor_id, None)

    @property
    def proc(self) -> ProcMesh:
        from ._proc_mesh import ProcMesh

        return ProcMesh._single(self.proc_id, self._proc_address)

    @property
    def proc_mesh(self) -> ProcMesh:
        return self.proc

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor once it has handled the messages already queued for it (Monarch's
        ``context().actor_instance.stop()``: an actor whose work is done stops itself). Its
        ``__cleanup__`` runs and what it owns stops; later calls fail with
        ``SupervisionError``. Stopping is not failing: its owner is not told of a failure."""
        from . import _messages as M
        from ._controller import current_runtime

        if not self.class_name:
            raise RuntimeError(
                "the controller's root client cannot stop itself; "
                "use shutdown_context() to stop the procs and the runtime"
            )
        rt = current_runtime()
        cell = rt.actors.get(self.actor_id)
        if cell is None:
            raise RuntimeError(f"actor {self} is not running in this process")
        ctx = current.get()
        if ctx is not None and ctx.actor_instance.actor_id == self.actor_id:
            # From its own handler: queued before the handler's reply leaves, so a message
            # sent after the caller saw that reply is never handled.
            cell.stop_when_handled = True
        else:
            rt.call_soon(lambda: cell.enqueue(M.StopActor(self.actor_id, None)))

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor (Monarch's ``context().actor_instance.abort()``): after the message
        it is handling, it dies as if an endpoint had raised with no caller waiting; its owner
        gets a ``MeshFailure`` saying "actor aborted: <reason>" (or "no reason provided")."""
        from ..supervision import FailureCause
        from . import _messages as M
        from ._controller import current_runtime

        if not self.class_name:
            raise RuntimeError(
                "the controller's root client cannot abort itself; raise an exception instead"
            )
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"abort(reason) takes a str or None (got {reason!r})")
        rt = current_runtime()
        cell = rt.actors.get(self.actor_id)
        if cell is None:
            raise RuntimeError(f"actor {self} is not running in this process")
        cause = FailureCause(f"actor aborted: {reason or 'no reason provided'}")
        rt.call_soon(lambda: cell.enqueue(M.Escalate(cause)))


@attrs.frozen
class CreatorInstance:
    """The actor that spawned an actor's mesh, as ``ActorInstance.creator`` gives it
    (Monarch's ``CreatorInstance``): ``name`` ("root" for the controller's main code),
    ``actor_id``, ``rank`` and ``class_name`` (None where not known in this process; None
    for the root), ``proc_id`` and ``address`` of its proc, and its own ``creator``."""

    name: str
    actor_id: str
    rank: Point | None
    proc_id: str
    address: str
    class_name: str | None
    creator: CreatorInstance | None

    def __str__(self) -> str:
        """``<module.Class name{'gpus': 0/2}>`` as far as known; ``<root>``."""
        if self.name == "root" and self.class_name is None:
            return "<root>"
        prefix = "" if self.class_name is None else f"{self.class_name} "
        return f"<{prefix}{self.name}{'' if self.rank is None else self.rank}>"


class Context:
    """The running actor and the message it handles (Monarch's ``context()``).

    ``message_rank`` is built on first use: most handlers never ask, and building a Point
    for every message would cost more than the rest of dispatch.
    """

    __slots__ = ("_message_rank", "_spec", "actor_instance")

    def __init__(
        self,
        actor_instance: ActorInstance,
        message_rank: Point | None = None,
        spec: tuple[int, Sequence[str], Sequence[int]] | None = None,
    ) -> None:
        self.actor_instance = actor_instance
        self._message_rank = message_rank
        self._spec = spec

    @property
    def message_rank(self) -> Point:
        """The Point of this actor within the slice the current message was sent to."""
        if self._message_rank is None:
            assert self._spec is not None
            rank, labels, sizes = self._spec
            self._message_rank = Point(rank, Extent(labels, sizes))
        return self._message_rank


_EMPTY = Extent([], [])
_ROOT_POINT = Point(0, _EMPTY)
current: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "regency_context", default=None
)


def root_context(proc_id: str, address: str) -> Context:
    point = Point(0, _EMPTY)
    return Context(ActorInstance("client", f"{proc_id}/client", point, proc_id, address), point)


def context() -> Context:
    """The current actor and message (Monarch's ``context()``)."""
    ctx = current.get()
    if ctx is not None:
        return ctx
    from ._controller import current_runtime

    rt = current_runtime()
    return root_context(rt.proc_id, rt.address)


def current_rank() -> Point:
    """This actor's Point in its mesh."""
    return context().actor_instance.rank


def current_size() -> dict[str, int]:
    """The sizes of this actor's mesh, by dim."""
    return dict(context().actor_instance.rank.extent)


def current_actor_name() -> str:
    """This actor instance's unique id: its mesh's key and its rank, ``"<key>[<rank>]"``
    (the key holds the spawner's proc and the mesh name). Monarch's returns the actor id,
    unique per instance, too; the mesh's name alone is ``context().actor_instance.name``."""
    instance = context().actor_instance
    return f"{instance.actor_id}[{instance.rank.rank}]"


