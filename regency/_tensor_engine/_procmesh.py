"""What the tensor engine adds to ``ProcMesh``: what ``activate()`` and ``rank_tensor()`` run
(core's ``ProcMesh`` calls them through ``regency.core._extensions.mesh_tensors()``; this module
is what :mod:`regency._boot` plugs in there). Imports nothing heavy until used (torch loads
lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core._proc_mesh import ProcMesh


def activate(mesh: ProcMesh) -> Any:
    """``with mesh.activate():`` torch ops, factories included, run on every proc."""
    from ._context import activated
    from ._engine import engine_for

    engine_for(mesh)
    return activated(mesh)


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
