"""``reduce`` and ``to_mesh``: the only ways data moves between procs.

Both are single ops in the issue stream. The controller works out who talks to whom (the
groups of a reduction, the pairs of a move) and the result's metadata; the workers do the
moving over gloo (or over simulated messages), never through the controller.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..core import Shape
from ._comm import REDUCE_OPS
from ._engine import ISSUER, engine_for
from ._stream import Stream, get_active_stream
from ._tensor import Tensor, check_handles, faking, same_place

REDUCTIONS = ("stack", *REDUCE_OPS)

_groups: dict[tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]], list[tuple[int, ...]]] = {}


def groups_of(shape: Shape, dims: tuple[str, ...]) -> list[tuple[int, ...]]:
    """The global ranks that reduce together: points equal on every dim but ``dims``, each
    group ordered row-major over ``dims``."""
    key = (shape.ranks, shape.labels, dims)
    found = _groups.get(key)
    if found is None:
        keep = [d for d in shape.labels if d not in dims]
        by_rest: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
        for local, rank in enumerate(shape.ranks):
            coords = shape.coords(local)
            rest = tuple(coords[d] for d in keep)
            order = tuple(coords[d] for d in dims)
            by_rest.setdefault(rest, []).append((order, rank))
        found = [tuple(r for _, r in sorted(members)) for members in by_rest.values()]
        _groups[key] = found
    return found


def _no_grad_check(call: str, t: Tensor) -> None:
    if t.requires_grad and torch.is_grad_enabled():
        raise TypeError(
            f"{call}: {t!r} requires grad and {call.partition('(')[0]} is not differentiable; "
            "run it under torch.no_grad() or on t.detach()"
        )


def reduce_one(
    t: Tensor,
    dims: Any,
    reduction: str,
    scatter: bool,
    mesh: Any,
    inplace: bool,
    out: Any,
) -> Tensor:
    call = f"reduce({t!r}, {dims!r}, reduction={reduction!r})"
    if not isinstance(t, Tensor):
        raise TypeError(f"reduce takes regency.Tensor values (got {type(t).__name__})")
    if mesh is not None:
        # Monarch 0.7 raises NotImplementedError too; say what does the same job.
        raise NotImplementedError("reduce(mesh=...) is not supported; reduce, then to_mesh")
    if out is not None:
        if inplace:
            raise ValueError("reduce_ writes into the tensor itself: it takes no out=")
        if not isinstance(out, Tensor):
            raise TypeError(f"reduce(out=) takes a regency.Tensor (got {type(out).__name__})")
        result = reduce_one(t, dims, reduction, scatter, None, False, None)
        if out._mesh._shape != result._mesh._shape or out._mesh._procs != result._mesh._procs:
            result.drop()
            raise ValueError(f"reduce(out=) needs out on the mesh {t._mesh!r} (got {out._mesh!r})")
        if (out.shape, out.dtype) != (result.shape, result.dtype):
            shape, dtype = tuple(result.shape), result.dtype
            result.drop()
            raise ValueError(
                f"reduce(out=) needs out of shape {shape} and dtype {dtype} "
                f"(got {tuple(out.shape)}, {out.dtype})"
            )
        out.copy_(result)
        result.drop()
        return out
    labels = t._mesh._shape.labels
    dims_t: tuple[str, ...] = (dims,) if isinstance(dims, str) else tuple(dims)
    for d in dims_t:
        if d not in labels:
            raise ValueError(f"reduce dims must be among {labels} (got {d!r})")
    if not dims_t:
        dims_t = labels
    if len(set(dims_t)) != len(dims_t):
        raise ValueError(f"reduce got the same dim twice: {dims_t}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS} (got {reduction!r})")
    if len(dims_t) > 1 and (reduction == "stack" or scatter):
        raise ValueError(
            f"reduction {reduction!r} with scatter={scatter} takes one dim (got {dims_t})"
        )
    if inplace and (scatter or reduction == "stack"):
        raise ValueError(
            f"an in-place reduce cannot change the tensor's size (reduction={reduction!r}, "
            f"scatter={scatter})"
        )
    if reduction in ("band", "bor", "bxor") and (t.is_floating_point() or t.is_complex()):
        raise TypeError(f"reduction {reduction!r} needs an integer or bool tensor (got {t.dtype})")
    _no_grad_check(call, t)
    stream = get_active_stream()
    check_handles(call, [t], t._mesh, stream, [t] if inplace else None)
    shape = t._mesh._shape
    n = math.prod(shape.size(d) for d in dims_t)
    fake = t._fake
    with faking():
        if inplace:
            result_fake = fake
        elif reduction == "stack":
            result_fake = torch.stack([fake] * n) if not scatter else fake.contiguous().clone()
        else:
            result_fake = fake.contiguous().clone()
        if scatter and not inplace:
            if fake.dim() == 0 or fake.shape[0] % n:
                raise ValueError(
                    f"scatter splits dim 0 among {n} ranks, so it must divide it (got shape "
                    f"{tuple(fake.shape)})"
                )
            if reduction != "stack":
                result_fake = fake.chunk(n)[0].contiguous().clone()
    result = t if inplace else Tensor(result_fake, t._mesh, t._engine, stream)
    ISSUER.issue(
        t._engine,
        shape,
        (
            "reduce",
            ISSUER.next_seq(),
            t._ref,
            result._ref,
            groups_of(shape, dims_t),
            reduction,
            scatter,
            inplace,
            (tuple(fake.shape), fake.dtype, str(fake.device)),
        ),
    )
    return result


def to_mesh_one(t: Tensor, source: Any, mesh: Any, stream: Stream | None) -> Tensor:
    from ..core import ProcMesh

    call = f"to_mesh({t!r}, {mesh!r})"
    if not isinstance(t, Tensor):
        raise TypeError(f"to_mesh takes regency.Tensor values (got {type(t).__name__})")
    if not isinstance(mesh, ProcMesh):
        raise TypeError(f"to_mesh needs a ProcMesh to move to (got {type(mesh).__name__})")
    if mesh._procs != t._mesh._procs:
        raise ValueError(
            f"to_mesh moves between slices of one proc mesh; {mesh!r} and {t._mesh!r} come "
            "from different spawn_procs calls"
        )
    _no_grad_check(call, t)
    check_handles(call, [t], t._mesh, t._stream)
    src_shape, dst_shape = source._shape, mesh._shape
    for label, size in zip(src_shape.labels, src_shape.sizes, strict=True):
        if label not in dst_shape.labels:
            raise ValueError(
                f"to_mesh: the source has dim {label!r} that {mesh!r} lacks; slice it away "
                f"first (t.slice_mesh({label}=0).to_mesh(...))"
            )
        if dst_shape.size(label) != size:
            raise ValueError(
                f"to_mesh: dim {label!r} has size {size} in the source but "
                f"{dst_shape.size(label)} in {mesh!r}"
            )
    broadcast = [d for d in dst_shape.labels if d not in src_shape.labels]
    if broadcast:
        warnings.warn(f"to_mesh is broadcasting along {broadcast}", stacklevel=3)
    sends: list[tuple[int, int]] = []
    for local, dst_rank in enumerate(dst_shape.ranks):
        coords = dst_shape.coords(local)
        src_local = (
            src_shape._local_rank({d: coords[d] for d in src_shape.labels}, "to_mesh")
            if src_shape.labels
            else 0
        )
        sends.append((src_shape.ranks[src_local], dst_rank))
    involved = tuple(sorted({r for pair in sends for r in pair}))
    engine = engine_for(mesh)
    with faking():
        fake = t._fake.contiguous().clone()
    result = Tensor(fake, mesh, engine, stream or t._stream)
    ISSUER.issue(
        engine,
        Shape(("rank",), (len(involved),), involved),
        (
            "move",
            ISSUER.next_seq(),
            t._ref,
            result._ref,
            sends,
            involved,
            (tuple(fake.shape), fake.dtype, str(fake.device)),
        ),
    )
    return result


def reduce(
    tensors: Any,
    dims: Any,
    reduction: str = "sum",
    scatter: bool = False,
    mesh: Any = None,
    _inplace: bool = False,
) -> Any:
    """:meth:`Tensor.reduce` on every tensor of a pytree."""
    return pytree.tree_map(
        lambda t: (
            reduce_one(t, dims, reduction, scatter, mesh, _inplace, None)
            if isinstance(t, Tensor)
            else t
        ),
        tensors,
    )


def reduce_(
    tensors: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None
) -> Any:
    return reduce(tensors, dims, reduction, scatter, mesh, _inplace=True)


def to_mesh(tensors: Any, mesh: Any, stream: Stream | None = None) -> Any:
    """:meth:`Tensor.to_mesh` on every tensor of a pytree."""
    return pytree.tree_map(
        lambda t: t.to_mesh(mesh, stream) if isinstance(t, Tensor) else t, tensors
    )


def slice_mesh(tensors: Any, **dims: Any) -> Any:
    """:meth:`Tensor.slice_mesh` on every tensor of a pytree."""
    return pytree.tree_map(lambda t: t.slice_mesh(**dims) if isinstance(t, Tensor) else t, tensors)


__all__ = ["reduce", "reduce_", "same_place", "slice_mesh", "to_mesh"]
