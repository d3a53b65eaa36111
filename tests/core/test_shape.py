"""Mesh algebra: pinned error messages, and properties checked against a nested-list model."""

from __future__ import annotations

import itertools
import math
import pickle
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regency.core._shape import DimIndex, Extent, MeshAlgebra, Point, Shape, ValueMesh

HG = Shape.full(("hosts", "gpus"), (2, 4))


# ---------------------------------------------------------------------------------------------
# Reference model: a shape as nested lists of global ranks, indexed the way Python indexes.


def nested(shape: Shape) -> Any:
    """The shape's ranks as nested lists, one level per dim (a bare int for no dims)."""
    flat: Any = list(shape.ranks)
    for size in reversed(shape.sizes[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat if shape.ndim else flat[0]


def leaves(tree: Any, ndim: int) -> list[int]:
    if ndim == 0:
        return [tree]
    return [leaf for sub in tree for leaf in leaves(sub, ndim - 1)]


def picks(size: int, sel: DimIndex | None) -> list[int] | int:
    """Positions a selector picks along one dim: a list (dim kept) or an int (dim removed)."""
    if sel is None:
        return list(range(size))
    if isinstance(sel, slice):
        return list(range(size))[sel]
    return list(range(size))[sel]


# ---------------------------------------------------------------------------------------------
# Strategies

LABELS = ("hosts", "gpus", "dp", "pp", "tp")


@st.composite
def shapes(draw: st.DrawFn, max_dims: int = 3, max_size: int = 4) -> Shape:
    ndim = draw(st.integers(0, max_dims))
    labels = draw(st.permutations(LABELS))[:ndim]
    sizes = draw(st.lists(st.integers(1, max_size), min_size=ndim, max_size=ndim))
    n = math.prod(sizes)
    ranks = draw(
        st.one_of(
            st.just(list(range(n))),
            st.lists(st.integers(0, 3 * n), min_size=n, max_size=n, unique=True),
        )
    )
    return Shape(labels, sizes, ranks)


def selector(size: int) -> st.SearchStrategy[DimIndex | None]:
    bound = st.none() | st.integers(-size - 2, size + 2)
    step = st.none() | st.integers(-3, 3).filter(bool)
    return st.one_of(
        st.none(),
        st.integers(-size, size - 1),
        st.builds(slice, bound, bound, step),
    )


@st.composite
def selections(draw: st.DrawFn, shape: Shape) -> dict[str, DimIndex]:
    sels = {
        label: draw(selector(size)) for label, size in zip(shape.labels, shape.sizes, strict=True)
    }
    return {label: sel for label, sel in sels.items() if sel is not None}


def empty(shape: Shape, sel: dict[str, DimIndex]) -> bool:
    return any(picks(shape.size(dim), s) == [] for dim, s in sel.items())


# ---------------------------------------------------------------------------------------------
# Extent


def test_extent_mapping() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert e.labels == ("hosts", "gpus")
    assert e.sizes == (2, 4)
    assert e.nelements == 8
    assert len(e) == 2
    assert repr(e) == "Extent({'hosts': 2, 'gpus': 4})"
    assert Extent([], []).nelements == 1
    assert e == Extent(("hosts", "gpus"), (2, 4))
    assert e != Extent(("gpus", "hosts"), (4, 2))
    assert e != {"hosts": 2, "gpus": 4}
    assert hash(e) == hash(Extent(("hosts", "gpus"), (2, 4)))
    with pytest.raises(AttributeError):
        e._labels = ()


@pytest.mark.parametrize(
    ("labels", "sizes", "message"),
    [
        (["hosts", "gpus"], [2, 0], "extent sizes must be positive integers (got {'gpus': 0})"),
        (["gpus"], [2.0], "extent sizes must be positive integers (got {'gpus': 2.0})"),
        (["gpus"], [True], "extent sizes must be positive integers (got {'gpus': True})"),
        (
            ["hosts", "gpus"],
            [2],
            "extent labels and sizes must have the same length (got 2 labels and 1 sizes)",
        ),
        (["gpus", "gpus"], [2, 2], "extent labels must be unique (got duplicates ('gpus',))"),
        (["", "gpus"], [2, 2], "extent labels must be non-empty strings (got '')"),
        ([3], [2], "extent labels must be non-empty strings (got 3)"),
    ],
)
def test_extent_errors(labels: list[Any], sizes: list[Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        Extent(labels, sizes)
    assert str(info.value) == message


# ---------------------------------------------------------------------------------------------
# Point


def test_point_row_major() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    p = Point(5, e)
    assert dict(p) == {"hosts": 1, "gpus": 1}
    assert p.rank == 5
    assert p.extent is e
    assert repr(p) == "Point(rank=5, {'hosts': 1, 'gpus': 1})"
    assert Point.from_coords(e, {"gpus": 1, "hosts": 1}) == p
    assert p != Point(5, Extent(["a", "b"], [2, 4]))
    assert {p, Point(5, e)} == {p}
    assert dict(Point(0, Extent([], []))) == {}


def test_point_errors() -> None:
    e = Extent(["gpus"], [4])
    with pytest.raises(IndexError) as info:
        Point(9, e)
    assert str(info.value) == "rank 9 is out of range for Extent({'gpus': 4}) (valid: 0..3)"
    with pytest.raises(IndexError) as info:
        Point(-1, e)
    assert str(info.value) == "rank -1 is out of range for Extent({'gpus': 4}) (valid: 0..3)"
    with pytest.raises(TypeError, match=r"rank must be an int \(got str\)"):
        Point("1", e)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as v_info:
        Point.from_coords(e, {"gpu": 1})
    assert str(v_info.value) == "dims must be one of ('gpus',) (got 'gpu')"
    with pytest.raises(ValueError) as v_info:
        Point.from_coords(Extent(["hosts", "gpus"], [2, 4]), {"gpus": 1})
    assert str(v_info.value) == "Point.from_coords() needs coordinates for dims ('hosts',)"
    with pytest.raises(IndexError) as info:
        Point.from_coords(e, {"gpus": -1})
    assert str(info.value) == "index -1 out of range for dim 'gpus' of size 4 (valid: 0..3)"


# ---------------------------------------------------------------------------------------------
# Shape examples and pinned errors


def test_shape_basics() -> None:
    assert HG.extent == Extent(["hosts", "gpus"], [2, 4])
    assert len(HG) == 8
    assert HG.ndim == 2
    assert HG.size("gpus") == 4
    assert HG.dim_sizes() == {"hosts": 2, "gpus": 4}
    assert HG.point(5) == Point(5, HG.extent)
    assert HG.coords(6) == {"hosts": 1, "gpus": 2}
    assert HG.index(hosts=1, gpus=2) == 6
    assert HG.index(hosts=-1, gpus=-2) == 6
    assert repr(HG) == "Shape({'hosts': 2, 'gpus': 4}, ranks=0..7)"


def test_shape_slice_examples() -> None:
    s = HG.slice(gpus=slice(1, 3))
    assert s.dim_sizes() == {"hosts": 2, "gpus": 2}
    assert s.ranks == (1, 2, 5, 6)
    assert s.global_rank(2) == 5
    assert s.index(hosts=1, gpus=0) == 2
    t = HG.slice(hosts=1, gpus=slice(None, None, -2))
    assert t.dim_sizes() == {"gpus": 2}
    assert t.ranks == (7, 5)
    u = HG.slice(hosts=0, gpus=-1)
    assert (u.labels, u.ranks, len(u)) == ((), (3,), 1)
    assert HG.slice() == HG


@pytest.mark.parametrize(
    ("dims", "exc", "message"),
    [
        ({"gpu": 0}, ValueError, "dims must be one of ('hosts', 'gpus') (got 'gpu')"),
        (
            {"gpus": 5},
            IndexError,
            "index 5 out of range for dim 'gpus' of size 4 (valid: 0..3)",
        ),
        (
            {"gpus": -5},
            IndexError,
            "index -5 out of range for dim 'gpus' of size 4 (valid: 0..3)",
        ),
        (
            {"gpus": "0"},
            TypeError,
            "index for dim 'gpus' must be an int or a slice (got str)",
        ),
        (
            {"gpus": True},
            TypeError,
            "index for dim 'gpus' must be an int or a slice (got bool)",
        ),
        (
            {"gpus": slice(3, 1)},
            ValueError,
            "slice(3, 1, None) selects no points of dim 'gpus' of size 4",
        ),
        (
            {"gpus": slice(0, 4, 0)},
            ValueError,
            "slice(0, 4, 0) for dim 'gpus' is invalid: slice step cannot be zero",
        ),
        (
            {"gpus": slice("a", 2)},
            TypeError,
            "slice bounds for dim 'gpus' must be ints or None (got slice('a', 2, None))",
        ),
    ],
)
def test_shape_slice_errors(dims: dict[str, Any], exc: type[Exception], message: str) -> None:
    with pytest.raises(exc) as info:
        HG.slice(**dims)
    assert str(info.value) == message


def test_shape_index_and_rank_errors() -> None:
    with pytest.raises(ValueError) as info:
        HG.index(gpus=1)
    assert str(info.value) == "index() needs coordinates for dims ('hosts',)"
    with pytest.raises(ValueError) as info:
        HG.index(hosts=0, gpu=1)
    assert str(info.value) == "dims must be one of ('hosts', 'gpus') (got 'gpu')"
    with pytest.raises(IndexError) as i_info:
        HG.index(hosts=2, gpus=0)
    assert str(i_info.value) == "index 2 out of range for dim 'hosts' of size 2 (valid: 0..1)"
    with pytest.raises(IndexError) as i_info:
        HG.global_rank(8)
    assert str(i_info.value) == (
        "rank 8 is out of range for Extent({'hosts': 2, 'gpus': 4}) (valid: 0..7)"
    )
    with pytest.raises(ValueError) as info:
        HG.size("gpu")
    assert str(info.value) == "dims must be one of ('hosts', 'gpus') (got 'gpu')"
    # Dims of size 1 need no coordinate.
    assert HG.slice(hosts=slice(1, 2)).index(gpus=3) == 3


@pytest.mark.parametrize(
    ("args", "exc", "message"),
    [
        (
            (("a", "b"), (2, 3), range(5)),
            ValueError,
            "shape {'a': 2, 'b': 3} has 6 points but got 5 ranks",
        ),
        (
            (("a",), (2,), (1, 1)),
            ValueError,
            "shape ranks must be distinct (rank 1 appears more than once)",
        ),
        ((("a",), (2,), (0, -1)), ValueError, "shape ranks must be non-negative integers (got -1)"),
        ((("a",), (0,), ()), ValueError, "shape sizes must be positive integers (got {'a': 0})"),
        (
            ("ab", (1, 1), (0,)),
            TypeError,
            "labels must be a sequence of strings, not a str (got 'ab')",
        ),
    ],
)
def test_shape_construction_errors(
    args: tuple[Any, Any, Any], exc: type[Exception], message: str
) -> None:
    with pytest.raises(exc) as info:
        Shape(*args)
    assert str(info.value) == message


def test_flatten_example() -> None:
    f = HG.slice(gpus=slice(None, None, 2)).flatten("rank")
    assert f.dim_sizes() == {"rank": 4}
    assert f.ranks == (0, 2, 4, 6)
    assert Shape.full((), ()).flatten("r").dim_sizes() == {"r": 1}
    with pytest.raises(ValueError) as info:
        HG.flatten("")
    assert str(info.value) == "flatten() labels must be non-empty strings (got '')"


def test_split_examples() -> None:
    s = Shape.full(("host", "gpus"), (8, 2))
    t = s.split(host=("dp", "pp"), pp=2)
    assert t.dim_sizes() == {"dp": 4, "pp": 2, "gpus": 2}
    assert t.ranks == s.ranks
    assert t.index(dp=1, pp=1, gpus=0) == s.index(host=3, gpus=0)
    assert s.split(host=["a", "b", "c"], a=2, c=2).dim_sizes() == {
        "a": 2,
        "b": 2,
        "c": 2,
        "gpus": 2,
    }
    assert s.split(host=("host", "x"), x=4).dim_sizes() == {"host": 2, "x": 4, "gpus": 2}
    assert s.split() == s


@pytest.mark.parametrize(
    ("kw", "exc", "message"),
    [
        ({"hots": ("a", "b")}, ValueError, "dims must be one of ('host', 'gpus') (got 'hots')"),
        (
            {"host": ("dp", "pp"), "pp": 3},
            ValueError,
            "cannot split dim 'host' of size 8 with factors {'pp': 3}: 3 does not divide 8",
        ),
        (
            {"host": ("dp", "pp"), "pp": 2, "dp": 2},
            ValueError,
            "cannot split dim 'host' of size 8 into factors {'dp': 2, 'pp': 2}: their product is 4",
        ),
        (
            {"host": ("a", "b", "c"), "a": 2},
            ValueError,
            "cannot split dim 'host' of size 8 into ('a', 'b', 'c'): sizes for ('b', 'c') are "
            "missing (at most one can be inferred)",
        ),
        (
            {"host": ("dp", "gpus"), "dp": 2},
            ValueError,
            "split() result labels must be unique (got duplicates ('gpus',))",
        ),
        (
            {"host": ("dp", "dp")},
            ValueError,
            "split() labels must be unique (got duplicates ('dp',))",
        ),
        (
            {"host": ("a", "x"), "gpus": ("b", "x"), "a": 8, "b": 2},
            ValueError,
            "split() label 'x' is given to both dim 'host' and dim 'gpus'",
        ),
        (
            {"host": ("dp", "pp"), "tp": 2},
            ValueError,
            "split() got a size for 'tp', which is not a new label of any split "
            "(new labels: ('dp', 'pp'))",
        ),
        (
            {"host": ("dp", "pp"), "pp": 0},
            ValueError,
            "split() sizes must be positive integers (got {'pp': 0})",
        ),
        ({"host": ()}, ValueError, "split() needs at least one new label for dim 'host'"),
        (
            {"host": "dp"},
            TypeError,
            "split() argument host= must be a tuple or list of new labels, or the int size "
            "of a new label (got str)",
        ),
    ],
)
def test_split_errors(kw: dict[str, Any], exc: type[Exception], message: str) -> None:
    with pytest.raises(exc) as info:
        Shape.full(("host", "gpus"), (8, 2)).split(**kw)
    assert str(info.value) == message


def test_rename_examples_and_errors() -> None:
    assert HG.rename(hosts="dp").dim_sizes() == {"dp": 2, "gpus": 4}
    assert HG.rename(hosts="gpus", gpus="hosts").dim_sizes() == {"gpus": 2, "hosts": 4}
    with pytest.raises(ValueError) as info:
        HG.rename(host="dp")
    assert str(info.value) == "dims must be one of ('hosts', 'gpus') (got 'host')"
    with pytest.raises(ValueError) as info:
        HG.rename(hosts="gpus")
    assert str(info.value) == "rename() result labels must be unique (got duplicates ('gpus',))"
    with pytest.raises(ValueError) as info:
        HG.rename(hosts="")
    assert str(info.value) == "rename() needs non-empty string labels (got hosts='')"


# ---------------------------------------------------------------------------------------------
# Shape properties


@settings(max_examples=60)
@given(st.data())
def test_slice_matches_nested_list_model(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    sel = data.draw(selections(shape))
    if empty(shape, sel):
        with pytest.raises(ValueError, match="selects no points"):
            shape.slice(**sel)
        return
    got = shape.slice(**sel)
    ref = nested(shape)
    want: Any = ref

    def apply(tree: Any, dim: int) -> Any:
        if dim == shape.ndim:
            return tree
        p = picks(shape.sizes[dim], sel.get(shape.labels[dim]))
        if isinstance(p, int):
            return apply(tree[p], dim + 1)
        return [apply(tree[i], dim + 1) for i in p]

    want = apply(ref, 0)
    assert nested(got) == want
    assert got.labels == tuple(
        label for label in shape.labels if not isinstance(sel.get(label), int)
    )


@settings(max_examples=60)
@given(st.data())
def test_slicing_composes(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    sel1 = data.draw(selections(shape))
    if empty(shape, sel1):
        return
    once = shape.slice(**sel1)
    sel2 = data.draw(selections(once))
    if empty(once, sel2):
        return
    twice = once.slice(**sel2)
    # Compose per dim: the positions the second slice picks out of the first one's picks.
    composed: list[list[int]] = []
    for label, size in zip(shape.labels, shape.sizes, strict=True):
        first = picks(size, sel1.get(label))
        if isinstance(first, int):
            composed.append([first])
            continue
        second = picks(len(first), sel2.get(label))
        composed.append([first[second]] if isinstance(second, int) else [first[i] for i in second])
    strides = [math.prod(shape.sizes[i + 1 :]) for i in range(shape.ndim)]
    want = [
        shape.ranks[sum(i * s for i, s in zip(idx, strides, strict=True))]
        for idx in itertools.product(*composed)
    ]
    assert list(twice.ranks) == want


@settings(max_examples=50)
@given(shapes())
def test_flatten_preserves_rank_order(shape: Shape) -> None:
    flat = shape.flatten("r")
    assert flat.ranks == shape.ranks
    assert flat.ranks == tuple(leaves(nested(shape), shape.ndim))
    assert flat.dim_sizes() == {"r": len(shape)}


@settings(max_examples=50)
@given(st.data())
def test_split_then_flatten_equals_flatten(data: st.DataObject) -> None:
    shape = data.draw(shapes(max_dims=2, max_size=12).filter(lambda s: s.ndim > 0))
    dim = data.draw(st.sampled_from(shape.labels))
    size = shape.size(dim)
    first = data.draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    given_label = data.draw(st.sampled_from(["x", "y"]))
    sizes = {"x": first, "y": size // first}
    split = shape.split(**{dim: ("x", "y")}, **{given_label: sizes[given_label]})
    assert split.size("x") * split.size("y") == size
    assert split.size("x") == first
    assert split.flatten("r") == shape.flatten("r")
    # The split dim's coordinate factors row-major; the other coordinates are unchanged.
    for local in range(len(shape)):
        before, after = shape.coords(local), split.coords(local)
        assert before.pop(dim) == after.pop("x") * split.size("y") + after.pop("y")
        assert before == after


@settings(max_examples=50)
@given(shapes())
def test_rename_round_trips(shape: Shape) -> None:
    forward = {label: label.upper() for label in shape.labels}
    back = {new: old for old, new in forward.items()}
    renamed = shape.rename(**forward)
    assert renamed.labels == tuple(forward.values())
    assert renamed.ranks == shape.ranks
    assert renamed.rename(**back) == shape


@settings(max_examples=50)
@given(st.data())
def test_point_coords_rank_round_trip(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    local = data.draw(st.integers(0, len(shape) - 1))
    point = shape.point(local)
    assert Point.from_coords(shape.extent, point) == point
    assert shape.index(**shape.coords(local)) == local
    assert point.rank == local
    assert shape.global_rank(local) == shape.ranks[local]


@settings(max_examples=50)
@given(shapes())
def test_pickle_round_trip(shape: Shape) -> None:
    mesh = ValueMesh(shape, [f"v{r}" for r in shape.ranks])
    for obj in (shape.extent, shape.point(len(shape) - 1), shape, mesh):
        clone = pickle.loads(pickle.dumps(obj))
        assert clone == obj
        assert repr(clone) == repr(obj)
    assert pickle.loads(pickle.dumps(mesh)).slice() == mesh


# ---------------------------------------------------------------------------------------------
# ValueMesh


def test_value_mesh_examples() -> None:
    vm = ValueMesh(HG, [r * 10 for r in range(8)])
    assert len(vm) == 8
    assert vm.sizes == {"hosts": 2, "gpus": 4}
    assert vm.extent == HG.extent
    assert vm.size("gpus") == 4
    assert vm.values() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert list(vm) == list(vm.items())
    first_point, first_value = next(iter(vm))
    assert (dict(first_point), first_value) == ({"hosts": 0, "gpus": 0}, 0)
    assert vm.item(hosts=1, gpus=2) == 60
    col = vm.slice(gpus=2)
    assert col.values() == [20, 60]
    assert [(dict(p), v) for p, v in col.items()] == [({"hosts": 0}, 20), ({"hosts": 1}, 60)]
    assert col.slice(hosts=1).item() == 60
    assert vm.flatten("r").values() == vm.values()
    assert vm.split(gpus=("a", "b"), a=2).item(hosts=1, a=1, b=0) == 60
    assert vm.rename(hosts="h").sizes == {"h": 2, "gpus": 4}
    # Monarch's form: the extent, then every (point, value).
    assert repr(col) == "ValueMesh({hosts: 2}):\n  (({'hosts': 0/2}, 20), ({'hosts': 1/2}, 60))"
    assert repr(vm).splitlines()[:2] == [
        "ValueMesh({hosts: 2, gpus: 4}):",
        "  (({'hosts': 0/2, 'gpus': 0/4}, 0),",
    ]
    assert repr(vm).splitlines()[-1] == "   ({'hosts': 1/2, 'gpus': 3/4}, 70))"
    # Equality ignores global ranks: a sliced result equals a freshly built mesh.
    assert col == ValueMesh(Shape.full(["hosts"], [2]), [20, 60])
    assert col != ValueMesh(Shape.full(["h"], [2]), [20, 60])
    assert vm != col


def test_value_mesh_errors() -> None:
    with pytest.raises(ValueError) as info:
        ValueMesh(HG, [1, 2, 3])
    assert str(info.value) == (
        "ValueMesh needs one value per point: Extent({'hosts': 2, 'gpus': 4}) has 8 points "
        "but got 3 values"
    )
    vm = ValueMesh(HG, list(range(8)))
    with pytest.raises(ValueError) as info:
        vm.slice(hosts=0).item()
    assert str(info.value) == "item() needs coordinates for dims ('gpus',)"
    with pytest.raises(ValueError) as info:
        vm.item(gpu=1)
    assert str(info.value) == "dims must be one of ('hosts', 'gpus') (got 'gpu')"
    with pytest.raises(IndexError) as i_info:
        vm.item(hosts=0, gpus=4)
    assert str(i_info.value) == "index 4 out of range for dim 'gpus' of size 4 (valid: 0..3)"
    with pytest.raises(ValueError) as info:
        vm.slice(hosts=0)._with_shape(HG)
    assert str(info.value) == "global rank 4 is not part of this ValueMesh"
    with pytest.raises(TypeError):
        hash(vm)


@settings(max_examples=60)
@given(st.data())
def test_value_mesh_slice_matches_value_lists(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    values = data.draw(st.lists(st.integers(), min_size=len(shape), max_size=len(shape)))
    vm = ValueMesh(shape, values)
    sel = data.draw(selections(shape))
    if empty(shape, sel):
        return
    sliced = vm.slice(**sel)
    # The same selection applied to the nested list of values.
    value_shape = Shape(shape.labels, shape.sizes, range(len(shape)))
    positions = value_shape.slice(**sel).ranks
    assert sliced.values() == [values[i] for i in positions]
    assert sliced._shape == shape.slice(**sel)
    for point, value in sliced.items():
        assert sliced.item(**point) == value


def test_mesh_algebra_on_an_attrs_mesh() -> None:
    @attrs.frozen
    class Mesh(MeshAlgebra):
        _shape: Shape
        name: str

        def _with_shape(self, shape: Shape) -> Mesh:
            return attrs.evolve(self, shape=shape)

    m = Mesh(HG, "m")
    sub = m.slice(gpus=slice(0, 2)).rename(hosts="h")
    assert (sub.name, sub.sizes, len(sub)) == ("m", {"h": 2, "gpus": 2}, 4)
    assert sub.extent == Extent(["h", "gpus"], [2, 2])
    assert m.flatten("r").split(r=("a", "b"), b=2).size("a") == 4

    class Bare(MeshAlgebra):
        def __init__(self) -> None:
            self._shape = HG

    with pytest.raises(NotImplementedError, match=r"Bare must implement _with_shape\(\)"):
        Bare().slice(gpus=0)


def test_point_prints_as_monarch_does() -> None:
    point = Point(3, Extent(["hosts", "gpus"], [2, 2]))
    assert str(point) == "{'hosts': 1/2, 'gpus': 1/2}"
    assert str(Point(0, Extent([], []))) == "{}"


def test_mesh_size_without_a_dim_is_the_number_of_points() -> None:
    class M(MeshAlgebra):
        def __init__(self, shape: Shape) -> None:
            self._shape = shape

        def _with_shape(self, shape: Shape) -> M:
            return M(shape)

    mesh = M(Shape.full(["hosts", "gpus"], [2, 3]))
    assert mesh.size() == 6 and mesh.size("gpus") == 3
    assert mesh.slice(gpus=0).size() == 2
