"""The supervision state machine of one process: events in, actions out.

Pure: no trio, no I/O, no clocks. The runtime feeds it what happens to the meshes that actors
in this process own (spawned, ranks failed, a proc lost, stopped, an owner's ``__supervise__``
answered, an owner gone) and carries out the actions it returns, in order. The simulator drives
the very same machine.

Invariants (checked by tests/supervision/test_machine.py with Hypothesis):

* each rank of a mesh fails at most once, and its owner is told at most once for it;
* a stopped rank is never reported as failed;
* an unhandled failure goes to the owner's owner (``Escalate``), or at the root to
  ``RunRootHook``, exactly once;
* an illegal event (a mesh spawned twice, a failure for a rank that does not exist) puts the
  machine in a failed state that it never leaves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

from ._failure import FailureCause, MeshFailure, describe_actor

#: The owner key of meshes spawned by the controller's main code.
ROOT = "client"

RUNNING = "running"
FAILED = "failed"
STOPPED = "stopped"


# -- events --------------------------------------------------------------------------------


@attrs.frozen
class MeshSpawned:
    key: str
    name: str
    owner: str
    owner_name: str
    #: The address of each rank's proc, by rank.
    addresses: tuple[str, ...]
    #: ``module.Class`` of its actors, and its dims (for failure reports).
    actor_class: str = ""
    labels: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()


@attrs.frozen
class RanksFailed:
    key: str
    ranks: tuple[int, ...]
    cause: FailureCause


@attrs.frozen
class ProcLost:
    address: str
    cause: FailureCause


@attrs.frozen
class ProcStopped:
    """A proc is being stopped on purpose: its ranks stop, they do not fail."""

    address: str


@attrs.frozen
class MeshStopped:
    key: str
    ranks: tuple[int, ...] | None = None  # None: every rank


@attrs.frozen
class SuperviseDone:
    owner: str
    failure: MeshFailure
    handled: bool
    #: Set when ``__supervise__`` raised instead of answering.
    error: FailureCause | None = None


@attrs.frozen
class OwnerGone:
    """The owning actor stopped or failed: everything it owns must stop."""

    owner: str


Event = (
    MeshSpawned | RanksFailed | ProcLost | ProcStopped | MeshStopped | SuperviseDone | OwnerGone
)


# -- actions -------------------------------------------------------------------------------


@attrs.frozen
class Notify:
    """Run the owner's ``__supervise__(failure)``."""

    owner: str
    failure: MeshFailure


@attrs.frozen
class Escalate:
    """The owner did not handle a failure: the owner itself fails with ``cause``."""

    owner: str
    cause: FailureCause


@attrs.frozen
class RunRootHook:
    failure: MeshFailure


@attrs.frozen
class StopMeshes:
    keys: tuple[str, ...]


Action = Notify | Escalate | RunRootHook | StopMeshes


# -- the machine ---------------------------------------------------------------------------


@attrs.define
class MeshState:
    """What the machine knows of one actor mesh: read it, never change it."""

    name: str
    owner: str
    owner_name: str
    addresses: tuple[str, ...]
    status: list[str]
    actor_class: str = ""
    labels: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()


@attrs.define
class Supervisor:
    _meshes: dict[str, MeshState] = attrs.field(factory=dict)
    #: Why each failed rank failed, by (mesh key, rank): a rank is in it exactly while its
    #: mesh is known here and the rank failed, so an empty dict means no rank of any mesh
    #: has failed (what a sender checks once per call, not once per rank).
    causes: dict[tuple[str, int], FailureCause] = attrs.field(factory=dict)
    #: Why the machine stopped accepting events, once an illegal one arrived.
    broken: str | None = None

    def handle(self, event: Event) -> list[Action]:
        if self.broken is not None:
            return []
        try:
            return self._handle(event)
        except _Illegal as exc:
            self.broken = str(exc)
            return []

    def meshes(self) -> Mapping[str, MeshState]:
        """The meshes known here, by key (a read-only view)."""
        return MappingProxyType(self._meshes)

    def actor_of(self, key: str, rank: int) -> str:
        """Rank ``rank`` of mesh ``key`` as Monarch prints an actor (for error messages)."""
        mesh = self._meshes.get(key)
        if mesh is None:
            return f"<{key}[{rank}]>"
        return describe_actor(mesh.actor_class, mesh.name, mesh.labels, mesh.sizes, rank)

    def failed(self, key: str, rank: int) -> bool:
        mesh = self._meshes.get(key)
        return mesh is not None and mesh.status[rank] == FAILED

    def cause_of(self, key: str, rank: int) -> FailureCause | None:
        """Why a rank failed, while its mesh is known here."""
        return self.causes.get((key, rank))

    def status(self, key: str) -> tuple[str, ...] | None:
        mesh = self._meshes.get(key)
        return None if mesh is None else tuple(mesh.status)

    def owned_by(self, owner: str) -> list[str]:
        return sorted(k for k, m in self._meshes.items() if m.owner == owner)

    def _handle(self, event: Event) -> list[Action]:
        if isinstance(event, MeshSpawned):
            if event.key in self._meshes:
                raise _Illegal(f"mesh {event.key!r} spawned twice")
            self._meshes[event.key] = MeshState(
                event.name,
                event.owner,
                event.owner_name,
                event.addresses,
                [RUNNING] * len(event.addresses),
                event.actor_class,
                event.labels,
                event.sizes,
            )
            return []
        if isinstance(event, RanksFailed):
            mesh = self._meshes.get(event.key)
            if mesh is None:
                return []  # a late report about a mesh forgotten after its owner went
            for rank in event.ranks:
                if not 0 <= rank < len(mesh.status):
                    raise _Illegal(f"mesh {event.key!r} has no rank {rank}")
            return self._fail(event.key, mesh, event.ranks, event.cause)
        if isinstance(event, ProcLost):
            actions: list[Action] = []
            for key in sorted(self._meshes):
                mesh = self._meshes[key]
                ranks = [r for r, a in enumerate(mesh.addresses) if a == event.address]
                actions.extend(self._fail(key, mesh, ranks, event.cause))
            return actions
        if isinstance(event, ProcStopped):
            for mesh in self._meshes.values():
                for rank, address in enumerate(mesh.addresses):
                    if address == event.address and mesh.status[rank] == RUNNING:
                        mesh.status[rank] = STOPPED
            return []
        if isinstance(event, MeshStopped):
            mesh = self._meshes.get(event.key)
            if mesh is not None:
                which = range(len(mesh.status)) if event.ranks is None else event.ranks
                for rank in which:
                    if mesh.status[rank] == RUNNING:
                        mesh.status[rank] = STOPPED
            return []
        if isinstance(event, SuperviseDone):
            if event.handled:
                return []
            if event.error is not None:
                cause = FailureCause(
                    f"__supervise__ raised {event.error.summary} while handling: {event.failure}",
                    event.error.traceback,
                    chained=event.failure,
                )
            else:
                cause = FailureCause(
                    f"unhandled failure of a mesh it owns: {event.failure}",
                    chained=event.failure,
                )
            if event.owner == ROOT:
                failure = event.failure
                if event.error is not None:
                    failure = attrs.evolve(
                        failure,
                        cause=attrs.evolve(
                            failure.cause,
                            summary=failure.cause.summary
                            + f" (and the root's handler raised: {event.error.summary})",
                        ),
                    )
                return [RunRootHook(failure)]
            return [Escalate(event.owner, cause)]
        if isinstance(event, OwnerGone):
            keys = []
            for key in self.owned_by(event.owner):
                mesh = self._meshes.pop(key)
                for rank in range(len(mesh.status)):
                    self.causes.pop((key, rank), None)
                if RUNNING in mesh.status:
                    keys.append(key)
            return [StopMeshes(tuple(keys))] if keys else []
        raise _Illegal(f"unknown event {event!r}")

    def _fail(
        self, key: str, mesh: MeshState, ranks: Iterable[int], cause: FailureCause
    ) -> list[Action]:
        newly = []
        for rank in ranks:
            if mesh.status[rank] == RUNNING:
                mesh.status[rank] = FAILED
                self.causes[(key, rank)] = cause
                newly.append(rank)
        if not newly:
            return []
        failure = MeshFailure(
            mesh.name,
            key,
            tuple(newly),
            cause,
            (mesh.owner_name,),
            actor_class=mesh.actor_class,
            labels=mesh.labels,
            sizes=mesh.sizes,
        )
        if mesh.owner == ROOT:
            return [RunRootHook(failure)]  # the controller's main code has no __supervise__
        return [Notify(mesh.owner, failure)]


class _Illegal(Exception):
    pass
