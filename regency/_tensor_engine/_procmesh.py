"""What the tensor engine adds to core: what ``ProcMesh.activate()`` and
``ProcMesh.rank_tensor()`` run, and what an actor endpoint's call with tensors among its
arguments and ``Endpoint.rref()`` run (core calls them through
``regency.core._extensions.mesh_tensors()``; this module is what :mod:`regency._boot` plugs in
there). Imports nothing heavy until used (torch loads lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..core._adverbs import Endpoint
    from ..core._proc_mesh import ProcMesh


def activate(mesh: ProcMesh) -> Any:
    """``with mesh.activate():`` torch ops, factories included, run on every proc."""
    from ._context import activated
    from ._engine import engine_for

    engine_for(mesh)
    return activated(mesh)


def carry(
    endpoint: Endpoint[..., Any],
    ranks: Sequence[int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> list[Any] | None:
    """The payload of a call whose arguments hold ``regency.Tensor`` handles: each of
    ``ranks`` gets its own proc's tensors, after the ops issued before (None: no handles)."""
    from ._actors import carry as carry_handles

    return carry_handles(endpoint, ranks, args, kwargs)


def rref(
    endpoint: Endpoint[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    send: Callable[[list[Any]], None],
) -> Any:
    """``endpoint.rref(...)``: ``send`` the call to every rank; what each returns becomes a
    ``regency.Tensor`` (the handles, returned at once)."""
    from ._actors import rref as rref_call

    return rref_call(endpoint, args, kwargs, send)


def rank_tensor(mesh: ProcMesh, dims: tuple[str, ...]) -> Any:
    """A tensor whose value on each proc is its coordinate along ``dims`` (row-major over
    several dims)."""
    from ._remote import Remote

    shape = mesh._shape
    for d in dims:
        if d not in shape.labels:
            raise ValueError(f"rank_tensor dims must be among {shape.labels} (got {d!r})")
    table: dict[int, int] = {}
    for local, rank in enumerate(shape.ranks):
        coords = shape.coords(local)
        value = 0
        for d in dims:
            value = value * shape.size(d) + coords[d]
        table[rank] = value
    from ._context import activated

    with activated(mesh):
        return Remote("regency._tensor_engine._worker.rank_value", _rank_value_propagate)(table)


def _rank_value_propagate(table: dict[int, int]) -> Any:
    import torch

    return torch.empty((), dtype=torch.int64)
