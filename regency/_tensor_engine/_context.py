"""What is active: the device mesh that torch ops run on, and the stream they run on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The meshes of the enclosing ``activate()`` blocks, innermost last; None is ``no_mesh``.
_mesh_stack: list[Any] = []
#: The streams of the enclosing ``Stream.activate()`` blocks, innermost last.
_stream_stack: list[Any] = []


def active_mesh_or_none() -> Any:
    return _mesh_stack[-1] if _mesh_stack else None


def get_active_mesh() -> Any:
    """The mesh of the innermost ``activate()``; ``ValueError`` when none is active."""
    mesh = active_mesh_or_none()
    if mesh is None:
        raise ValueError("no device mesh is active")
    return mesh


@contextmanager
def activated(mesh: Any) -> Iterator[Any]:
    """Make ``mesh`` (None: no mesh) the one torch ops run on, inside the block."""
    from ..core._leader import loop_reads
    from ._engine import ISSUER
    from ._tensor import ActiveMeshMode

    _mesh_stack.append(mesh)
    mode = ActiveMeshMode()  # type: ignore[no-untyped-call]
    mode.__enter__()  # type: ignore[no-untyped-call]
    try:
        # This thread's torch mode must not see the tensors of replies being unpickled
        # (core/_leader.py): the loop reads and decodes them while a mesh is active.
        with loop_reads():
            yield mesh
    finally:
        mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        _mesh_stack.pop()
        ISSUER.flush()


class _NoMesh:
    """``no_mesh.activate()``: plain local torch inside the block, even within a mesh's."""

    def activate(self) -> Any:
        return activated(None)

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()
