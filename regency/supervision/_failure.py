"""What an owner is told when actors it owns fail."""

from __future__ import annotations

import attrs

#: Failed actors a report names one by one.
_ACTORS_SHOWN = 4


def describe_actor(
    actor_class: str, mesh_name: str, labels: tuple[str, ...], sizes: tuple[int, ...], rank: int
) -> str:
    """Rank ``rank`` of a mesh as Monarch prints an actor: ``<module.Class name{'gpus': 3/8}>``
    (the class left out when unknown)."""
    coords = []
    rest = rank
    for label, size in reversed(list(zip(labels, sizes, strict=True))):
        rest, coord = divmod(rest, size) if size else (rest, 0)
        coords.append(f"{label!r}: {coord}/{size}")
    where = "{" + ", ".join(reversed(coords)) + "}"
    who = f"{actor_class} " if actor_class else ""
    return f"<{who}{mesh_name}{where}>"


@attrs.frozen
class FailureCause:
    """Why one or more ranks failed, as plain data (it crosses processes)."""

    #: One line: "endpoint Trainer.step raised ValueError: bad batch", "proc ... was killed
    #: by signal 9", ...
    summary: str
    #: The remote traceback, when the cause was an exception.
    traceback: str = ""
    #: The proc's exit status when the proc died (negative: killed by that signal).
    exit_code: int | None = None
    #: The failure this one escalated from (an owner that did not handle its child's failure).
    chained: MeshFailure | None = None


@attrs.frozen
class MeshFailure:
    """Ranks of an actor mesh failed (Monarch's ``MeshFailure``), delivered to the mesh's owner
    through ``__supervise__``, or at the root to ``unhandled_fault_hook``."""

    mesh_name: str
    #: The mesh's unique key (``proc_id.name.N``).
    mesh_key: str
    ranks: tuple[int, ...]
    cause: FailureCause
    #: Names of the owners from the mesh's owner up to the root client.
    owners: tuple[str, ...] = ()
    #: ``module.Class`` of the mesh's actors, and the mesh's dims ("" and () when unknown).
    actor_class: str = ""
    labels: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()

    def actor(self, rank: int) -> str:
        """The failed actor at ``rank`` as Monarch prints an actor instance:
        ``<module.Class name{'hosts': 0/2, 'gpus': 3/8}>``."""
        return describe_actor(self.actor_class, self.mesh_name, self.labels, self.sizes, rank)

    def __str__(self) -> str:
        ranks = ", ".join(map(str, self.ranks))
        # ``crashed_ranks=[...]``: the field Monarch's str(MeshFailure) shows, which programs
        # (Monarch's own tests among them) look for.
        return (
            f"MeshFailure: actor mesh {self.mesh_name} failed at rank(s) {ranks} "
            f"(crashed_ranks={list(self.ranks)}), and all its descendants have failed: "
            f"{self.cause.summary}"
        )

    def report(self) -> str:
        """A multi-line report: what failed, why, the remote traceback and the owner chain."""
        lines = [f"Regency: {self}"]
        shown = self.ranks[:_ACTORS_SHOWN]
        more = len(self.ranks) - len(shown)
        lines.extend(
            f"  The actor {self.actor(rank)} and all its descendants have failed." for rank in shown
        )
        if more:
            lines.append(f"  ... and {more} more actors of {self.mesh_name}.")
        if self.owners:
            lines.append("  owners: " + " <- ".join(self.owners))
        if self.cause.exit_code is not None:
            code = self.cause.exit_code
            how = f"Killed(sig={-code})" if code < 0 else f"Exited(status={code})"
            lines.append(f"  the process this actor was running on failed: {how}")
        if self.cause.traceback:
            lines.append("  remote traceback:")
            lines.extend("    " + line for line in self.cause.traceback.rstrip().splitlines())
        if self.cause.chained is not None:
            lines.append("  caused by:")
            lines.extend("  " + line for line in self.cause.chained.report().splitlines())
        return "\n".join(lines)
