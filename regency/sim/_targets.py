"""What a fault call may be aimed at, turned into simulated host names and proc addresses.

A user injecting a fault has a mesh in hand, not the simulator's names: the rank of a host
in the simulation's host mesh (``hosts.slice(hosts=1)`` is rank 1), a ``HostMesh`` or
``ProcMesh`` slice, an ``ActorMesh`` (whose procs are meant), or the names the event log
prints (``"host1"``, ``"sim://host1/p3"``). Every fault call resolves its target here, and
anything it cannot resolve raises: a fault that silently does nothing would make a test pass
that should fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..core import ActorMesh, HostMesh, ProcMesh

SCHEME = "sim://"

#: What the messages say a target may be.
HOST_TARGETS = (
    "a host name (str), the rank of a host in the simulation's host mesh (int), a HostMesh "
    "or ProcMesh slice, an ActorMesh, or a proc address 'sim://HOST/PROC'"
)
PROC_TARGETS = (
    "a proc address 'sim://HOST/PROC' (str), a ProcMesh slice, or an ActorMesh (its procs)"
)


def host_of(address: str) -> str:
    """The simulated host of a ``sim://HOST/PROC`` address."""
    if not address.startswith(SCHEME) or "/" not in address[len(SCHEME):]:
        raise LookupError(f"{address!r} is not a simulated proc address ('sim://HOST/PROC')")
    return address[len(SCHEME):].split("/", 1)[0]


def mesh_proc_addresses(mesh: ProcMesh | ActorMesh[Any]) -> list[str]:
    """The addresses of the procs of a proc or actor mesh slice, in rank order."""
    procs = mesh._procs
    return [procs[rank][1] for rank in mesh._shape.ranks]


def resolve_hosts(
    target: object, *, known: Sequence[str], ranked: Sequence[str], controller: str, what: str
) -> list[str]:
    """Host names for ``target`` (see :data:`HOST_TARGETS`), each one of ``known``.

    ``ranked`` lists the simulation's host mesh in rank order; ``controller`` is the host a
    ``HostMesh`` of this host (``this_host()``) stands for. ``what`` names the call and
    argument for the messages. Order follows the target; duplicates are dropped.
    """
    names: list[str]
    if isinstance(target, bool) or target is None:
        raise TypeError(f"{what} must be {HOST_TARGETS} (got {target!r})")
    if isinstance(target, int):
        if not 0 <= target < len(ranked):
            raise LookupError(
                f"{what}: no host of rank {target} in the simulation's host mesh of "
                f"{len(ranked)} host(s) (ranks 0..{len(ranked) - 1})"
            )
        names = [ranked[target]]
    elif isinstance(target, str):
        names = [host_of(target)] if target.startswith(SCHEME) else [target]
    elif isinstance(target, HostMesh):
        refs = target._hosts
        if refs is None:
            names = [controller]
        else:
            names = []
            for rank in target._shape.ranks:
                worker = refs[rank].worker
                if not worker.startswith("sim:"):
                    raise LookupError(
                        f"{what}: host {refs[rank].hostname!r} of this HostMesh is not a "
                        f"simulated host (its worker is {worker!r})"
                    )
                names.append(worker[len("sim:"):])
    elif isinstance(target, (ProcMesh, ActorMesh)):
        names = [host_of(address) for address in mesh_proc_addresses(target)]
    else:
        raise TypeError(f"{what} must be {HOST_TARGETS} (got {type(target).__name__})")
    for name in names:
        if name not in known:
            raise LookupError(
                f"{what}: no simulated host {name!r} (hosts: {', '.join(map(repr, known))})"
            )
    if not names:
        raise LookupError(f"{what}: {target!r} names no host (an empty slice)")
    return list(dict.fromkeys(names))


def resolve_host_group(
    target: object, *, known: Sequence[str], ranked: Sequence[str], controller: str, what: str
) -> list[str]:
    """Like :func:`resolve_hosts`, and also a list or tuple of such targets (one side of a
    partition)."""
    if isinstance(target, (list, tuple, set, frozenset)):
        items: Iterable[object] = (
            sorted(target, key=repr) if isinstance(target, (set, frozenset)) else target
        )
        names: list[str] = []
        for item in items:
            names += resolve_hosts(
                item, known=known, ranked=ranked, controller=controller, what=what
            )
        if not names:
            raise LookupError(f"{what}: an empty list names no host")
        return list(dict.fromkeys(names))
    return resolve_hosts(target, known=known, ranked=ranked, controller=controller, what=what)


def resolve_procs(target: object, *, running: Iterable[str], what: str) -> list[str]:
    """Addresses of running simulated procs for ``target`` (see :data:`PROC_TARGETS`)."""
    if isinstance(target, str):
        addresses = [target]
    elif isinstance(target, (ProcMesh, ActorMesh)):
        addresses = mesh_proc_addresses(target)
    elif isinstance(target, int) and not isinstance(target, bool):
        raise TypeError(
            f"{what} must be {PROC_TARGETS} (got the int {target}: a proc rank needs its "
            f"mesh, e.g. procs.slice(gpus={target}))"
        )
    else:
        raise TypeError(f"{what} must be {PROC_TARGETS} (got {type(target).__name__})")
    alive = set(running)
    for address in addresses:
        if address not in alive:
            raise LookupError(f"{what}: no running simulated proc at {address!r}")
    if not addresses:
        raise LookupError(f"{what}: {target!r} names no proc (an empty slice)")
    return list(dict.fromkeys(addresses))


def check_duration(value: object, what: str, *, allow_none: bool = False) -> None:
    """Raise unless ``value`` is a number of virtual seconds >= 0 (or None if allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        expected = "a number of virtual seconds >= 0" + (" or None" if allow_none else "")
        raise (TypeError if not isinstance(value, (int, float)) else ValueError)(
            f"{what} must be {expected} (got {value!r})"
        )
