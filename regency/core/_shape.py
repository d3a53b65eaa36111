"""Mesh algebra: extents, points, shapes and value meshes.

Pure: no trio, no torch, no I/O. Everything here is an immutable value that pickles.

A `Shape` lists the *global* rank of every point explicitly, in row-major order (the last
label varies fastest). Monarch describes a shape as an affine ``Slice`` (offset, sizes,
strides); the explicit list costs memory proportional to the number of points but makes every
operation total: a strided slice can always be flattened or split again, which an affine
description cannot always express.

Indexing follows Python: an int removes a dim, a ``slice`` keeps it, negative numbers count
from the end, and errors name the dim and the valid range.
"""

from __future__ import annotations

import builtins
import json
import math
import operator
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Generic, NoReturn, Self, TypeVar

import attrs

__all__ = [
    "DimIndex",
    "Extent",
    "MeshAlgebra",
    "Point",
    "Shape",
    "SplitArg",
    "ValueMesh",
]

T = TypeVar("T")

# Aliases, because classes below have a method named `slice`, which shadows the builtin
# inside their bodies.
_slice = builtins.slice
DimIndex = int | builtins.slice
"""What `slice(**dims)` accepts per dim: an int (removes the dim) or a slice (keeps it)."""
SplitArg = int | tuple[str, ...] | list[str]
"""What `split(**kw)` accepts: new labels for an existing dim, or the size of a new label."""

_REPR_VALUES = 6


# ---------------------------------------------------------------------------------------------
# Validation helpers, shared so that every entry point words its errors the same way.


def _as_int(value: object) -> int | None:
    """`value` as a plain int if it is integer-like (numpy ints included), else None.

    Bools are refused: ``slice(gpus=True)`` is far more likely a bug than a request for 1.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(f"labels must be a sequence of strings, not a str (got {value!r})")
    return tuple(value)


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _validated_dims(
    what: str, labels: Iterable[str], sizes: Iterable[int]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Check and normalise a (labels, sizes) pair; `what` names the owner in errors."""
    labels_t = _str_tuple(labels)
    raw_sizes = tuple(sizes)
    if len(labels_t) != len(raw_sizes):
        raise ValueError(
            f"{what} labels and sizes must have the same length "
            f"(got {len(labels_t)} labels and {len(raw_sizes)} sizes)"
        )
    _check_labels(what, labels_t)
    sizes_t: list[int] = []
    bad: dict[str, object] = {}
    for label, raw in zip(labels_t, raw_sizes, strict=True):
        size = _as_int(raw)
        if size is None or size < 1:
            bad[label] = raw
        else:
            sizes_t.append(size)
    if bad:
        raise ValueError(f"{what} sizes must be positive integers (got {bad!r})")
    return labels_t, tuple(sizes_t)


def _check_labels(what: str, labels: Sequence[object]) -> None:
    for label in labels:
        if not isinstance(label, str) or not label:
            raise ValueError(f"{what} labels must be non-empty strings (got {label!r})")
    dups = tuple(label for label, n in Counter(labels).items() if n > 1)
    if dups:
        raise ValueError(f"{what} labels must be unique (got duplicates {dups!r})")


def _unknown_dim(labels: tuple[str, ...], dim: str) -> ValueError:
    return ValueError(f"dims must be one of {labels!r} (got {dim!r})")


def _normalize_index(dim: str, size: int, value: object, *, allow_negative: bool) -> int:
    """The non-negative position that `value` names along `dim`, or a descriptive error."""
    index = _as_int(value)
    if index is None:
        raise TypeError(
            f"index for dim {dim!r} must be an int or a slice (got {type(value).__name__})"
        )
    resolved = index + size if allow_negative and index < 0 else index
    if not 0 <= resolved < size:
        raise IndexError(
            f"index {index} out of range for dim {dim!r} of size {size} (valid: 0..{size - 1})"
        )
    return resolved


def _check_rank(rank: object, extent: Extent) -> int:
    r = _as_int(rank)
    if r is None:
        raise TypeError(f"rank must be an int (got {type(rank).__name__})")
    if not 0 <= r < extent.nelements:
        raise IndexError(
            f"rank {r} is out of range for {extent!r} (valid: 0..{extent.nelements - 1})"
        )
    return r


def _strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides: the last dim varies fastest."""
    strides = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    return tuple(strides)


def _unravel(rank: int, sizes: Sequence[int]) -> tuple[int, ...]:
    coords = [0] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        rank, coords[i] = divmod(rank, sizes[i])
    return tuple(coords)


def _seq_repr(values: Sequence[object]) -> str:
    if len(values) <= _REPR_VALUES:
        return repr(list(values))
    head = ", ".join(repr(v) for v in values[:_REPR_VALUES])
    return f"[{head}, ... ({len(values)} in all)]"


class _Shown:
    """Prints as the text given (a point inside a ValueMesh's repr)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _extent_text(extent: Extent) -> str:
    """An extent as Monarch prints it inside a ValueMesh: ``{hosts: 2, gpus: 4}`` (a label
    that is not an identifier in double quotes)."""
    parts = (
        f"{label if _IDENT.match(label) else json.dumps(label)}: {size}"
        for label, size in zip(extent.labels, extent.sizes, strict=True)
    )
    return "{" + ", ".join(parts) + "}"


# ---------------------------------------------------------------------------------------------


class Extent(Mapping[str, int]):
    """The labelled sizes of a mesh: a read-only mapping from label to size, in label order.

    ``len(extent)`` is the number of dims; `nelements` is the number of points. Two extents are
    equal when their labels and sizes are equal in order (a plain dict never equals one).
    """

    __slots__ = ("_labels", "_nelements", "_sizes")
    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _nelements: int

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        labels_t, sizes_t = _validated_dims("extent", labels, sizes)
        object.__setattr__(self, "_labels", labels_t)
        object.__setattr__(self, "_sizes", sizes_t)
        object.__setattr__(self, "_nelements", math.prod(sizes_t))

    @property
    def labels(self) -> tuple[str, ...]:
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def nelements(self) -> int:
        """Number of points: the product of the sizes (1 for an extent with no dims)."""
        return self._nelements

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Extent):
            return NotImplemented
        return self._labels == other._labels and self._sizes == other._sizes

    def __hash__(self) -> int:
        return hash((Extent, self._labels, self._sizes))

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes, strict=True))!r})"

    def __reduce__(self) -> tuple[type[Extent], tuple[tuple[str, ...], tuple[int, ...]]]:
        return (Extent, (self._labels, self._sizes))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Extent is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Extent is immutable (cannot delete {name!r})")


class Point(Mapping[str, int]):
    """One point of an extent: a read-only mapping from label to coordinate.

    `rank` is the point's row-major position within `extent` (the last label varies fastest),
    which is always relative to that extent, never a global rank. Equality is by
    (rank, extent).
    """

    __slots__ = ("_coords", "_extent", "_rank")
    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent) -> None:
        if not isinstance(extent, Extent):
            raise TypeError(f"Point needs an Extent (got {type(extent).__name__})")
        r = _check_rank(rank, extent)
        object.__setattr__(self, "_rank", r)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", _unravel(r, extent.sizes))

    @classmethod
    def from_coords(cls, extent: Extent, coords: Mapping[str, int]) -> Point:
        """The point of `extent` at `coords`, which must name every dim once.

        Unlike indexing a shape, coordinates here are canonical: negative values are refused.
        """
        for dim in coords:
            if dim not in extent:
                raise _unknown_dim(extent.labels, dim)
        missing = tuple(label for label in extent.labels if label not in coords)
        if missing:
            raise ValueError(f"Point.from_coords() needs coordinates for dims {missing!r}")
        rank = 0
        for label, size, stride in zip(
            extent.labels, extent.sizes, _strides(extent.sizes), strict=True
        ):
            rank += stride * _normalize_index(label, size, coords[label], allow_negative=False)
        return cls(rank, extent)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def extent(self) -> Extent:
        return self._extent

    def __getitem__(self, label: str) -> int:
        try:
            return self._coords[self._extent.labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return self._rank == other._rank and self._extent == other._extent

    def __hash__(self) -> int:
        return hash((Point, self._rank, self._extent))

    def __repr__(self) -> str:
        coords = dict(zip(self._extent.labels, self._coords, strict=True))
        return f"Point(rank={self._rank}, {coords!r})"

    def __str__(self) -> str:
        """As Monarch prints a rank: ``{'hosts': 0/1, 'gpus': 1/2}`` (coordinate/size)."""
        inner = ", ".join(
            f"{label!r}: {coord}/{size}"
            for label, coord, size in zip(
                self._extent.labels, self._coords, self._extent.sizes, strict=True
            )
        )
        return "{" + inner + "}"

    def __reduce__(self) -> tuple[type[Point], tuple[int, Extent]]:
        return (Point, (self._rank, self._extent))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Point is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Point is immutable (cannot delete {name!r})")


# ---------------------------------------------------------------------------------------------


@attrs.frozen(repr=False)
class Shape:
    """Labelled dims plus the global rank of every point, in row-major order.

    A mesh's shape says which global ranks (positions in the mesh it was sliced from) it
    covers and how they are arranged. Every operation returns a new Shape whose `ranks` are a
    subset (`slice`) or a rearrangement-free relabelling (`flatten`, `split`, `rename`) of
    these ranks. "Local" ranks are positions within this shape: ``ranks[local] == global``.
    """

    labels: tuple[str, ...] = attrs.field(converter=_str_tuple)
    sizes: tuple[int, ...] = attrs.field(converter=_int_tuple)
    # Invariant: distinct non-negative ints, len(ranks) == prod(sizes).
    ranks: tuple[int, ...] = attrs.field(converter=_int_tuple)
    _extent: Extent = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        labels, sizes = _validated_dims("shape", self.labels, self.sizes)
        n = math.prod(sizes)
        if len(self.ranks) != n:
            raise ValueError(
                f"shape {dict(zip(labels, sizes, strict=True))!r} has {n} points "
                f"but got {len(self.ranks)} ranks"
            )
        ranks: list[int] = []
        for raw in self.ranks:
            rank = _as_int(raw)
            if rank is None or rank < 0:
                raise ValueError(f"shape ranks must be non-negative integers (got {raw!r})")
            ranks.append(rank)
        if len(set(ranks)) != len(ranks):
            dup = next(r for r, count in Counter(ranks).items() if count > 1)
            raise ValueError(f"shape ranks must be distinct (rank {dup} appears more than once)")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "ranks", tuple(ranks))
        object.__setattr__(self, "_extent", Extent(labels, sizes))

    @classmethod
    def full(cls, labels: Sequence[str], sizes: Sequence[int]) -> Shape:
        """The shape of a whole mesh: global ranks ``0..n-1`` in row-major order."""
        labels_t, sizes_t = _validated_dims("shape", labels, sizes)
        return cls(labels_t, sizes_t, range(math.prod(sizes_t)))

    @property
    def extent(self) -> Extent:
        return self._extent

    @property
    def ndim(self) -> int:
        return len(self.labels)

    def __len__(self) -> int:
        return len(self.ranks)

    def _dim_pos(self, dim: str) -> int:
        try:
            return self.labels.index(dim)
        except ValueError:
            raise _unknown_dim(self.labels, dim) from None

    def size(self, dim: str) -> int:
        return self.sizes[self._dim_pos(dim)]

    def dim_sizes(self) -> dict[str, int]:
        return dict(zip(self.labels, self.sizes, strict=True))

    def slice(self, /, **dims: DimIndex) -> Shape:
        """Select along some dims: an int index removes the dim, a slice keeps it.

        Indices and slice bounds follow Python (negative counts from the end, slice bounds
        clamp); a slice that selects nothing is a ValueError, since meshes are never empty.
        """
        for dim in dims:
            self._dim_pos(dim)
        strides = _strides(self.sizes)
        labels: list[str] = []
        sizes: list[int] = []
        offsets = [0]
        for label, size, stride in zip(self.labels, self.sizes, strides, strict=True):
            pick: Sequence[int]
            if label not in dims:
                pick = range(size)
                labels.append(label)
                sizes.append(size)
            elif isinstance(sel := dims[label], _slice):
                pick = _slice_range(label, size, sel)
                labels.append(label)
                sizes.append(len(pick))
            else:
                pick = (_normalize_index(label, size, sel, allow_negative=True),)
            offsets = [off + i * stride for off in offsets for i in pick]
        return Shape(labels, sizes, [self.ranks[off] for off in offsets])

    def flatten(self, name: str) -> Shape:
        """One dim called `name` holding every point, in row-major order."""
        _check_labels("flatten()", (name,))
        return Shape((name,), (len(self.ranks),), self.ranks)

    def split(self, /, **kw: SplitArg) -> Shape:
        """Split dims into several, row-major, without reordering points.

        ``split(host=("dp", "pp"), pp=2)``: a keyword whose value is a tuple or list of new
        labels splits that existing dim into them, in place; a keyword whose value is an int
        gives the size of one of the new labels. At most one new label per split may be left
        without a size: it is inferred. The sizes must multiply to the dim's size.
        """
        specs: dict[str, tuple[str, ...]] = {}
        given: dict[str, int] = {}
        for key, value in kw.items():
            if isinstance(value, tuple | list):
                self._dim_pos(key)
                new = tuple(value)
                if not new:
                    raise ValueError(f"split() needs at least one new label for dim {key!r}")
                _check_labels("split()", new)
                specs[key] = new
                continue
            size = _as_int(value)
            if size is None:
                raise TypeError(
                    f"split() argument {key}= must be a tuple or list of new labels, "
                    f"or the int size of a new label (got {type(value).__name__})"
                )
            given[key] = size
        owners: dict[str, str] = {}
        for dim, new in specs.items():
            for label in new:
                if label in owners:
                    raise ValueError(
                        f"split() label {label!r} is given to both dim {owners[label]!r} "
                        f"and dim {dim!r}"
                    )
                owners[label] = dim
        for key, size in given.items():
            if key not in owners:
                raise ValueError(
                    f"split() got a size for {key!r}, which is not a new label of any split "
                    f"(new labels: {tuple(owners)!r})"
                )
            if size < 1:
                raise ValueError(
                    f"split() sizes must be positive integers (got {{{key!r}: {size}}})"
                )
        labels: list[str] = []
        sizes: list[int] = []
        for dim, size in zip(self.labels, self.sizes, strict=True):
            if dim not in specs:
                labels.append(dim)
                sizes.append(size)
                continue
            new = specs[dim]
            factors = {label: given[label] for label in new if label in given}
            unsized = tuple(label for label in new if label not in given)
            product = math.prod(factors.values())
            if len(unsized) > 1:
                raise ValueError(
                    f"cannot split dim {dim!r} of size {size} into {new!r}: sizes for "
                    f"{unsized!r} are missing (at most one can be inferred)"
                )
            if unsized:
                if size % product:
                    raise ValueError(
                        f"cannot split dim {dim!r} of size {size} with factors {factors!r}: "
                        f"{product} does not divide {size}"
                    )
                factors[unsized[0]] = size // product
            elif product != size:
                raise ValueError(
                    f"cannot split dim {dim!r} of size {size} into factors {factors!r}: "
                    f"their product is {product}"
                )
            labels.extend(new)
            sizes.extend(factors[label] for label in new)
        _check_labels("split() result", labels)
        return Shape(labels, sizes, self.ranks)

    def rename(self, /, **kw: str) -> Shape:
        """Relabel dims: ``rename(host="dp")``. Renames apply at once, so swaps work."""
        for old, new in kw.items():
            self._dim_pos(old)
            if not isinstance(new, str) or not new:
                raise ValueError(f"rename() needs non-empty string labels (got {old}={new!r})")
        labels = [kw.get(label, label) for label in self.labels]
        _check_labels("rename() result", labels)
        return Shape(labels, self.sizes, self.ranks)

    def point(self, rank_in_shape: int) -> Point:
        """The point at local rank `rank_in_shape`, relative to this shape's extent."""
        return Point(rank_in_shape, self._extent)

    def global_rank(self, local_rank: int) -> int:
        return self.ranks[_check_rank(local_rank, self._extent)]

    def coords(self, local_rank: int) -> dict[str, int]:
        return dict(self.point(local_rank))

    def index(self, /, **coords: int) -> int:
        """The local rank of the point at `coords`.

        Dims of size 1 may be left out; negative coordinates count from the end.
        """
        return self._local_rank(coords, "index()")

    def _local_rank(self, coords: Mapping[str, object], who: str) -> int:
        for dim in coords:
            self._dim_pos(dim)
        missing = tuple(
            label
            for label, size in zip(self.labels, self.sizes, strict=True)
            if label not in coords and size > 1
        )
        if missing:
            raise ValueError(f"{who} needs coordinates for dims {missing!r}")
        rank = 0
        for label, size, stride in zip(self.labels, self.sizes, _strides(self.sizes), strict=True):
            if label in coords:
                rank += stride * _normalize_index(label, size, coords[label], allow_negative=True)
        return rank

    def __repr__(self) -> str:
        ranks = self.ranks
        if len(ranks) > 1 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
            ranks_repr = f"{ranks[0]}..{ranks[-1]}"
        else:
            ranks_repr = _seq_repr(ranks)
        return f"Shape({self.dim_sizes()!r}, ranks={ranks_repr})"


def _slice_range(dim: str, size: int, sel: builtins.slice) -> range:
    try:
        picked = range(size)[sel]
    except ValueError as exc:
        raise ValueError(f"{sel!r} for dim {dim!r} is invalid: {exc}") from None
    except TypeError:
        raise TypeError(
            f"slice bounds for dim {dim!r} must be ints or None (got {sel!r})"
        ) from None
    if not picked:
        raise ValueError(f"{sel!r} selects no points of dim {dim!r} of size {size}")
    return picked


# ---------------------------------------------------------------------------------------------


class MeshAlgebra:
    """The mesh operations, for any immutable mesh described by a `Shape`.

    A subclass provides `_shape` and `_with_shape`, which returns a mesh of the same kind over
    another shape whose ranks are a subset of (or the same as) this one's. The operations
    then come for free and word their errors identically on every kind of mesh.
    """

    __slots__ = ()
    _shape: Shape

    def _with_shape(self, shape: Shape) -> Self:
        raise NotImplementedError(f"{type(self).__name__} must implement _with_shape()")

    def slice(self, /, **dims: DimIndex) -> Self:
        """Select along dims: ``m.slice(gpus=0, hosts=slice(0, 2))``. See `Shape.slice`."""
        return self._with_shape(self._shape.slice(**dims))

    def flatten(self, name: str) -> Self:
        return self._with_shape(self._shape.flatten(name))

    def split(self, /, **kw: SplitArg) -> Self:
        """Reshape dims: ``m.split(host=("dp", "pp"), pp=2)``. See `Shape.split`."""
        return self._with_shape(self._shape.split(**kw))

    def rename(self, /, **kw: str) -> Self:
        return self._with_shape(self._shape.rename(**kw))

    def size(self, dim: str | None = None) -> int:
        """The size of ``dim``; with no dim, the number of points (as Monarch's)."""
        return len(self._shape) if dim is None else self._shape.size(dim)

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.dim_sizes()

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)


class ValueMesh(MeshAlgebra, Generic[T]):
    """One value per point of a shape, as returned by ``endpoint.call()``.

    Iterating (like `items`) yields ``(Point, value)`` with points relative to this mesh's
    extent. Slicing keeps each value with its global rank. Equality compares the extent and
    the values, not the global ranks, so a result compares equal to a freshly built mesh.
    """

    __slots__ = ("_shape", "_values")
    _values: tuple[T, ...]  # Invariant: _values[i] belongs to the point at local rank i.

    def __init__(self, shape: Shape, values: Sequence[T]) -> None:
        if not isinstance(shape, Shape):
            raise TypeError(f"ValueMesh needs a Shape (got {type(shape).__name__})")
        values_t = tuple(values)
        if len(values_t) != len(shape):
            raise ValueError(
                f"ValueMesh needs one value per point: {shape.extent!r} has {len(shape)} "
                f"points but got {len(values_t)} values"
            )
        self._shape = shape
        self._values = values_t

    def _with_shape(self, shape: Shape) -> Self:
        if shape.ranks == self._shape.ranks:
            return type(self)(shape, self._values)
        by_rank = dict(zip(self._shape.ranks, self._values, strict=True))
        try:
            values = [by_rank[rank] for rank in shape.ranks]
        except KeyError as exc:
            raise ValueError(f"global rank {exc.args[0]} is not part of this ValueMesh") from None
        return type(self)(shape, values)

    def items(self) -> Iterator[tuple[Point, T]]:
        extent = self._shape.extent
        for rank, value in enumerate(self._values):
            yield Point(rank, extent), value

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def values(self) -> list[T]:
        return list(self._values)

    def item(self, /, **coords: int) -> T:
        """The value at `coords`; dims of size 1 may be left out, so ``item()`` works on a
        single-point mesh."""
        return self._values[self._shape._local_rank(coords, "item()")]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return self._shape.extent == other._shape.extent and self._values == other._values

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """As Monarch prints one: the extent, then every ``(point, value)`` pair, e.g.
        ``ValueMesh({gpus: 2}):\n  (({'gpus': 0/2}, 'a'), ({'gpus': 1/2}, 'b'))``."""
        import pprint
        import textwrap

        extent = Extent(self._shape.labels, self._shape.sizes)
        pairs = tuple(
            (_Shown(str(Point(rank, extent))), value) for rank, value in enumerate(self._values)
        )
        body = textwrap.indent(pprint.pformat(pairs), "  ")
        return f"ValueMesh({_extent_text(extent)}):\n{body}"

    def __reduce__(self) -> tuple[type[ValueMesh[T]], tuple[Shape, tuple[T, ...]]]:
        return (type(self), (self._shape, self._values))
