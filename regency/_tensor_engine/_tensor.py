"""``regency.Tensor``: a handle to one tensor per proc of a mesh, with local metadata.

A handle is a torch wrapper subclass holding a fake tensor (shape, dtype, strides; no data).
Every aten op that reaches a handle, or that runs while a mesh is active, is computed on fake
tensors here (so shape errors raise at the call) and issued to the mesh's workers, which run
the same op on the real tensors. Autograd sits above the dispatcher, so it runs here over the
handles and its backward ops are issued like any other.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from . import _context
from ._actors import reduce_handle
from ._engine import ISSUER, Engine, engine_for, forget
from ._errors import (
    BORROWED,
    DROPPED,
    LOCAL_TENSOR,
    MUTATING_BORROW,
    WRONG_MESH,
    WRONG_STREAM,
    bad_argument,
)
from ._records import Ref
from ._stream import Borrow, Stream, get_active_stream

fake_mode = FakeTensorMode()


@contextmanager
def faking() -> Iterator[None]:
    """Run torch on fake tensors only (metadata), whatever modes the caller has active."""
    with _disable_current_modes(), fake_mode:
        yield


_LIFTS = frozenset(
    {
        torch.ops.aten.lift_fresh.default,
        torch.ops.aten.lift_fresh_copy.default,
        torch.ops.aten.lift.default,
    }
)
_names: dict[Any, str] = {}
_writes: dict[Any, tuple[tuple[int, str], ...]] = {}


def _op_name(func: Any) -> str:
    name = _names.get(func)
    if name is None:
        name = _names[func] = func.name()
    return name


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments ``func`` writes to (its schema's mutable aliases)."""
    positions = _writes.get(func)
    if positions is None:
        positions = tuple(
            (i, a.name)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        _writes[func] = positions
    out: list[Any] = []
    for i, name in positions:
        value = args[i] if i < len(args) else kwargs.get(name)
        out.extend(v for v in pytree.tree_leaves(value) if isinstance(v, Tensor))
    return out


class Tensor(torch.Tensor):
    """A tensor that lives on every proc of a mesh (``regency.Tensor``, Monarch's
    ``monarch.Tensor``): ``.mesh``, ``.stream``, ``.drop()``, ``.to_mesh()``, ``.reduce()``."""

    _fake_obj: torch.Tensor | None
    #: (shape, stride, storage offset, dtype, device): all that ops need to know on a cache hit
    _meta: tuple[Any, ...]
    _ref: int
    _mesh: Any
    _engine: Engine
    _stream: Stream
    _dropped: bool
    #: "rw", or "r" (immutably borrowed, or a borrow that may not write), or "" (lent mutably)
    _access: str
    _loans: int
    _finalizer: Any

    @staticmethod
    def __new__(
        cls,
        fake: torch.Tensor | None,
        mesh: Any,
        engine: Engine,
        stream: Stream,
        ref: int | None = None,
        meta: tuple[Any, ...] | None = None,
    ) -> Tensor:
        if meta is None:
            assert fake is not None
            meta = meta_of_fake(fake)
        shape, stride, offset, dtype, device = meta
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            shape,
            strides=stride,
            storage_offset=offset,
            dtype=dtype,
            device=device,
            requires_grad=False,
        )
        r._fake_obj = fake
        r._meta = meta
        r._ref = engine.issuer.new_ref() if ref is None else ref
        r._mesh = mesh
        r._engine = engine
        r._stream = stream
        r._dropped = False
        r._access = "rw"
        r._loans = 0
        r._finalizer = weakref.finalize(r, forget, engine, r._ref, frozenset(mesh._shape.ranks))
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return dispatch(func, args, kwargs or {})

    @property
    def _fake(self) -> torch.Tensor:
        """The fake tensor (made from the metadata when an op's cache entry skipped it)."""
        fake = self._fake_obj
        if fake is None:
            shape, stride, _, dtype, device = self._meta
            with faking():
                fake = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            self._fake_obj = fake
        return fake

    # -- what a handle is ------------------------------------------------------------------

    @property
    def mesh(self) -> Any:
        """The proc mesh (or slice) this tensor lives on."""
        return self._mesh

    @property
    def stream(self) -> Stream:
        return self._stream

    @property
    def dropped(self) -> bool:
        return self._dropped

    @property
    def ref(self) -> int:
        return self._ref

    def drop(self) -> None:
        """Free this tensor on its mesh now; later use raises ``TypeError`` (DROPPED)."""
        if self._dropped:
            return
        self._dropped = True
        if self._finalizer.detach() is not None:
            forget(self._engine, self._ref, frozenset(self._mesh._shape.ranks))

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        state = ", dropped" if self._dropped else ""
        return (
            f"regency.Tensor(shape={tuple(self._fake.shape)}, dtype={self.dtype}, "
            f"mesh={self._mesh!r}, stream={self._stream.name!r}{state})"
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        reduced = reduce_handle(self)  # among an actor endpoint's arguments: each rank's own
        if reduced is None:
            raise TypeError(
                "a regency.Tensor lives on its mesh and cannot be pickled; fetch its value "
                "with regency.inspect(t), pass it to a regency.remote function, or pass it to "
                "an endpoint of actors on its mesh (each gets its own proc's tensor)"
            )
        return reduced

    # -- collectives and moves (implemented in _collectives) -----------------------------------

    def reduce(
        self,
        dims: str | tuple[str, ...] | list[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
        _inplace: bool = False,
        out: Any = None,
    ) -> Tensor:
        """Reduce over the mesh ``dims`` (``"sum"``, ``"avg"``, ``"product"``, ``"min"``,
        ``"max"``, ``"band"``, ``"bor"``, ``"bxor"``, or ``"stack"``); ``scatter`` splits the
        result along dim 0 among the reduced ranks."""
        from ._collectives import reduce_one

        return reduce_one(self, dims, reduction, scatter, mesh, _inplace, out)

    def reduce_(
        self,
        dims: str | tuple[str, ...] | list[str],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
    ) -> Tensor:
        """:meth:`reduce` in place."""
        return self.reduce(dims, reduction, scatter, mesh, _inplace=True)

    def to_mesh(self, mesh: Any, stream: Stream | None = None) -> Tensor:
        """A copy on ``mesh`` (another slice of the same procs): dims match by name and size;
        a dim this tensor's mesh lacks is broadcast."""
        from ._collectives import to_mesh_one

        return to_mesh_one(self, self._mesh, mesh, stream)

    def slice_mesh(self, **dims: Any) -> MeshSliceTensor:
        """The copies on a slice of this tensor's mesh, to send with ``.to_mesh(...)``."""
        return MeshSliceTensor(self, self._mesh.slice(**dims))


def _operator(forward: Any, swap: bool = False, inplace: bool = False) -> Any:
    """A Python operator that lets our argument errors through: torch turns a ``TypeError``
    raised inside ``t + x`` into ``NotImplemented``, which would lose the reason."""

    def op(self: Tensor, other: Any) -> Any:
        result = forward(other, self) if swap else forward(self, other)
        return self if inplace else result

    return op


for _name, _fn, _swap, _inplace in (
    ("__add__", torch.add, False, False),
    ("__radd__", torch.add, True, False),
    ("__iadd__", torch.Tensor.add_, False, True),
    ("__sub__", torch.sub, False, False),
    ("__rsub__", torch.sub, True, False),
    ("__isub__", torch.Tensor.sub_, False, True),
    ("__mul__", torch.mul, False, False),
    ("__rmul__", torch.mul, True, False),
    ("__imul__", torch.Tensor.mul_, False, True),
    ("__truediv__", torch.div, False, False),
    ("__rtruediv__", torch.div, True, False),
    ("__itruediv__", torch.Tensor.div_, False, True),
    ("__matmul__", torch.matmul, False, False),
    ("__rmatmul__", torch.matmul, True, False),
):
    setattr(Tensor, _name, _operator(_fn, _swap, _inplace))


class MeshSliceTensor:
    """A tensor restricted to a slice of its mesh; its one use is ``.to_mesh(mesh)``."""

    def __init__(self, tensor: Tensor, slicing: Any) -> None:
        self.tensor, self.slicing = tensor, slicing

    def to_mesh(self, mesh: Any, stream: Stream | None = None) -> Tensor:
        from ._collectives import to_mesh_one

        return to_mesh_one(self.tensor, self.slicing, mesh, stream)


def handles_for(
    fake_out: Any, mesh: Any, engine: Engine, stream: Stream
) -> tuple[list[Any], list[int], Any]:
    """What a remote computation returns, from its output on fake tensors: a new handle for
    each tensor leaf (the other leaves as they are), the handles' refs (where the workers
    put the results), and the pytree spec to rebuild the output from the first list."""
    leaves, out_spec = pytree.tree_flatten(fake_out)
    results: list[Any] = []
    outs: list[int] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            h = Tensor(leaf, mesh, engine, stream)
            outs.append(h._ref)
            results.append(h)
        else:
            results.append(leaf)
    return results, outs, out_spec


def same_place(a: Any, b: Any) -> bool:
    """Two meshes are the same place when they cover the same procs (labels aside)."""
    return bool(a is b or (a._procs == b._procs and a._shape.ranks == b._shape.ranks))


def check_handles(
    call: str,
    handles: list[Tensor],
    mesh: Any,
    stream: Stream,
    written: list[Tensor] | None = None,
) -> None:
    """Raise the ``TypeError`` for the first handle this op cannot take."""
    for h in handles:
        if h._dropped:
            raise bad_argument(call, DROPPED, f"{h!r} was dropped and cannot be used")
        if not same_place(h._mesh, mesh):
            raise bad_argument(
                call, WRONG_MESH, f"{h!r} is on {h._mesh!r}, but the op runs on {mesh!r}"
            )
        if h._stream is not stream:
            raise bad_argument(
                call,
                WRONG_STREAM,
                f"{h!r} is on stream {h._stream.name!r}, but the op runs on stream "
                f"{stream.name!r}; run the op inside that stream's activate(), or borrow the "
                f"tensor onto stream {stream.name!r}",
            )
        if h._access != "rw":
            if h._access == "":
                raise bad_argument(
                    call,
                    BORROWED,
                    f"{h!r} is borrowed mutably by another stream until its borrow is dropped",
                )
            if written is None:
                continue
            if any(w is h for w in written):
                raise bad_argument(
                    call,
                    MUTATING_BORROW,
                    f"{h!r} is borrowed immutably and cannot be written "
                    "until the borrow is dropped",
                )


def meta_of_fake(fake: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(fake.shape), fake.stride(), fake.storage_offset(), fake.dtype, fake.device)


class _Uncacheable(Exception):
    """An argument the metadata cache cannot key on (a local tensor, an odd object)."""


_SCALARS = (int, float, bool, str, complex, type(None))
_TORCH_VALUES = (torch.dtype, torch.device, torch.memory_format, torch.layout)


def _walk(a: Any, handles: list[Tensor]) -> tuple[Any, Any]:
    """(cache key, argument with Refs) of one argument; collects handles in order."""
    if isinstance(a, Tensor):
        handles.append(a)
        return a._meta, Ref(a._ref)
    t = type(a)
    if t in _SCALARS:
        return (t, a), a
    if t is list or t is tuple:
        keys, parts = [], []
        for x in a:
            k, v = _walk(x, handles)
            keys.append(k)
            parts.append(v)
        return (t, tuple(keys)), (parts if t is list else tuple(parts))
    if isinstance(a, _TORCH_VALUES):
        return a, a
    raise _Uncacheable


#: (op, argument metadata) -> (output spec, per output leaf: ("h", index of the input handle it
#: returns), ("n", metadata of a new tensor) or ("v", a non-tensor value)). Fake tensors are
#: the slow part of issuing an op; a loop of ops sees the same metadata again and again.
_meta_cache: dict[Any, tuple[Any, tuple[tuple[str, Any], ...]]] = {}
_META_CACHE_LIMIT = 100_000


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], mesh: Any = None) -> Any:
    """Issue ``func(*args, **kwargs)`` to the workers; return handles for its results."""
    handles: list[Tensor] = []
    try:
        akey, atemplate = _walk(args, handles)
        kkeys, ktemplate = [], {}
        for name, value in kwargs.items():
            k, v = _walk(value, handles)
            kkeys.append((name, k))
            ktemplate[name] = v
    except _Uncacheable:
        return _dispatch_slow(func, args, kwargs, mesh, None, None)
    key = (func, akey, tuple(kkeys), torch.get_default_dtype())  # factories read it
    entry = _meta_cache.get(key)
    if entry is None:
        return _dispatch_slow(func, args, kwargs, mesh, key, handles)
    active = _context.active_mesh_or_none()
    mesh = _place(func, handles, mesh, active)
    stream = get_active_stream()
    if handles:
        _check_fast(func, args, kwargs, handles, mesh, stream)
    engine = handles[0]._engine if handles else engine_for(mesh)
    out_spec, items = entry
    outs: list[int] = []
    results: list[Any] = []
    for kind, x in items:
        if kind == "h":
            h = handles[x]
        elif kind == "n":
            h = Tensor(None, mesh, engine, stream, meta=x)
        else:
            results.append(x)
            continue
        outs.append(h._ref)
        results.append(h)
    if not handles and results and isinstance(results[0], Tensor):
        _pin_dtype(func, ktemplate, results[0].dtype)
    ISSUER.issue(
        engine,
        mesh._shape,
        ("op", ISSUER.next_seq(), _op_name(func), (atemplate, ktemplate), outs),
    )
    if out_spec is None:
        return results[0]
    return pytree.tree_unflatten(results, out_spec)


def _place(func: Any, handles: list[Tensor], mesh: Any, active: Any) -> Any:
    """The mesh an op runs on: its tensors', else the active one."""
    if handles:
        mesh = handles[0]._mesh
    elif mesh is None:
        mesh = active
    if mesh is None:
        raise bad_argument(str(func), LOCAL_TENSOR, "no mesh is active")
    if active is not None and not same_place(active, mesh):
        raise bad_argument(
            str(func), WRONG_MESH, f"{handles[0]!r} is used while {active!r} is active"
        )
    return mesh


def _check_fast(
    func: Any, args: Any, kwargs: Any, handles: list[Tensor], mesh: Any, stream: Stream
) -> None:
    needs_write_check = False
    for h in handles:
        if (
            h._dropped
            or h._stream is not stream
            or h._access != "rw"
            or (h._mesh is not mesh and not same_place(h._mesh, mesh))
        ):
            needs_write_check = True
            break
    if needs_write_check:
        check_handles(str(func), handles, mesh, stream, _written(func, args, kwargs))


def _dispatch_slow(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    mesh: Any,
    key: Any,
    walked: list[Tensor] | None,
) -> Any:
    """Run the op on fake tensors (and remember its output metadata under ``key``)."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    handles: list[Tensor] = []
    locals_at: list[int] = []
    for i, a in enumerate(flat):
        if isinstance(a, Tensor):
            handles.append(a)
        elif isinstance(a, torch.Tensor):
            locals_at.append(i)
    active = _context.active_mesh_or_none()
    mesh = _place(func, handles, mesh, active)
    stream = get_active_stream()
    if handles:
        _check_fast(func, args, kwargs, handles, mesh, stream)
    template = list(flat)
    fakes = list(flat)
    for i in locals_at:
        local = flat[i]
        if func not in _LIFTS and local.dim() != 0:
            raise bad_argument(
                str(func),
                LOCAL_TENSOR,
                f"a local tensor of shape {tuple(local.shape)} was mixed with tensors on "
                f"{mesh!r}; create it inside mesh.activate() instead",
            )
        fakes[i] = fake_mode.from_tensor(local)
    for i, a in enumerate(flat):
        if isinstance(a, Tensor):
            fakes[i] = a._fake
            template[i] = Ref(a._ref)
    fa, fk = pytree.tree_unflatten(fakes, spec)
    try:
        with fake_mode:
            out = func(*fa, **fk)
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise RuntimeError(
            f"{func} needs the values of a regency.Tensor, which live on its mesh; fetch them "
            "with regency.inspect(t), or run the code in a regency.remote function"
        ) from exc
    by_fake = {id(h._fake): h for h in handles}
    engine = handles[0]._engine if handles else engine_for(mesh)
    leaves, out_spec = pytree.tree_flatten(out)
    outs: list[int] = []
    results: list[Any] = []
    items: list[tuple[str, Any]] = []
    position = {id(h): i for i, h in reversed(list(enumerate(walked or ())))}
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            h = by_fake.get(id(leaf))
            if h is None:
                h = Tensor(leaf, mesh, engine, stream)
                items.append(("n", h._meta))
            else:
                if meta_of_fake(leaf) != h._meta:
                    h._fake_obj = None  # the fake ran the op: rebuild it from the metadata
                    raise NotImplementedError(
                        f"{func} changes the shape or strides of {h!r} in place, which a "
                        "regency.Tensor cannot follow; use the out-of-place form "
                        "(t = t.t() rather than t.t_())"
                    )
                items.append(("h", position.get(id(h), -1)))
            outs.append(h._ref)
            results.append(h)
        else:
            results.append(leaf)
            items.append(("v", leaf))
    if (
        key is not None
        and all(i != ("h", -1) for i in items)
        and len(_meta_cache) < _META_CACHE_LIMIT
    ):
        _meta_cache[key] = (None if out_spec.is_leaf() else out_spec, tuple(items))
    a_template, k_template = pytree.tree_unflatten(template, spec)
    if not handles and results and isinstance(results[0], Tensor):
        _pin_dtype(func, k_template, results[0].dtype)
    ISSUER.issue(
        engine,
        mesh._shape,
        ("op", ISSUER.next_seq(), _op_name(func), (a_template, k_template), outs),
    )
    return pytree.tree_unflatten(results, out_spec)


_takes_dtype: dict[Any, bool] = {}


def _pin_dtype(func: Any, kwargs: dict[str, Any], dtype: torch.dtype) -> None:
    """A factory left to the default dtype gets the controller's, not the proc's."""
    takes = _takes_dtype.get(func)
    if takes is None:
        takes = _takes_dtype[func] = any(
            a.name == "dtype" and a.kwarg_only for a in func._schema.arguments
        )
    if takes and kwargs.get("dtype") is None:
        kwargs["dtype"] = dtype


class ActiveMeshMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """While a mesh is active: factory ops (no tensor inputs) create tensors on it."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _context.active_mesh_or_none() is None:
            has_handle = any(isinstance(a, Tensor) for a in pytree.tree_leaves((args, kwargs)))
            if not has_handle:
                return func(*args, **kwargs)  # no_mesh: plain local torch
        return dispatch(func, args, kwargs)


def borrow_tensor(t: Tensor, stream: Stream, mutable: bool) -> tuple[Tensor, Borrow]:
    check_handles(f"borrow({t!r})", [t], t._mesh, t._stream, [t] if mutable else None)
    if mutable and t._loans:
        raise RuntimeError(
            f"cannot borrow {t!r} mutably: it is already borrowed immutably; drop that borrow first"
        )
    with faking():
        fake = torch.ops.aten.alias.default(t._fake)
    borrowed = Tensor(fake, t._mesh, t._engine, stream)
    borrowed._access = "rw" if mutable else "r"
    t._access = "" if mutable else "r"
    t._loans += 1
    ISSUER.issue(t._engine, t._mesh._shape, ("alias", borrowed._ref, t._ref))
    return borrowed, Borrow(t, borrowed, mutable)
