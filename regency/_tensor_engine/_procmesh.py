"""What the tensor engine adds to ``ProcMesh``: ``activate()``, ``rank_tensor()``,
``rank_tensors()``, ``to_table()``. Imports nothing heavy until used (torch loads lazily)."""

from __future__ import annotations

from typing import Any


class TensorEngineMesh:
    """Mixed into :class:`regency.core.ProcMesh`."""

    __slots__ = ()

    def activate(self) -> Any:
        """``with mesh.activate():`` torch ops, factories included, run on every proc."""
        from ._context import activated
        from ._engine import engine_for

        engine_for(self)  # type: ignore[arg-type]
        return activated(self)

    def rank_tensor(self, dim: str | tuple[str, ...] | list[str]) -> Any:
        """A tensor whose value on each proc is its coordinate along ``dim`` (row-major over
        several dims)."""
        from ._remote import Remote

        shape = self._shape  # type: ignore[attr-defined]
        dims = (dim,) if isinstance(dim, str) else tuple(dim)
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

        with activated(self):
            return Remote("regency._tensor_engine._worker.rank_value", _rank_value_propagate)(table)

    def rank_tensors(self) -> dict[str, Any]:
        """``{dim: rank_tensor(dim)}`` for every dim of the mesh."""
        return {d: self.rank_tensor(d) for d in self._shape.labels}  # type: ignore[attr-defined]

    def to_table(self) -> str:
        """The mesh as a text table: one row per proc, its coordinates and global rank."""
        shape = self._shape  # type: ignore[attr-defined]
        header = [*shape.labels, "rank", "proc"]
        rows = [header]
        for local, rank in enumerate(shape.ranks):
            coords = shape.coords(local)
            proc = self._procs[rank][0]  # type: ignore[attr-defined]
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


def _rank_value_propagate(table: dict[int, int]) -> Any:
    import torch

    return torch.empty((), dtype=torch.int64)
