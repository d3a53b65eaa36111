"""The pure casting-tree planner (regency.core._tree): every proc reached once, by at most
``fanout`` children per proc, in about log_fanout(n) hops."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regency.core._tree import child_ranges, depth, path, root_ranges, split, subtree


def walk(n: int, fanout: int) -> dict[int, int | None]:
    """position -> the position it is sent from (None: the sender)."""
    parent: dict[int, int | None] = {}
    todo: list[tuple[tuple[int, int], int | None]] = [(r, None) for r in root_ranges(n, fanout)]
    while todo:
        (lo, hi), by = todo.pop()
        assert lo not in parent, f"position {lo} reached twice"
        parent[lo] = by
        todo.extend((r, lo) for r in child_ranges(lo, hi, fanout))
    return parent


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 3000), st.integers(2, 70))
def test_every_proc_is_reached_once_and_fanout_is_kept(n: int, fanout: int) -> None:
    parent = walk(n, fanout)
    assert sorted(parent) == list(range(n))
    children: dict[int | None, int] = {}
    for by in parent.values():
        children[by] = children.get(by, 0) + 1
    assert max(children.values()) <= fanout
    assert len(root_ranges(n, fanout)) == min(n, fanout)


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 400), st.integers(2, 40), st.data())
def test_path_and_subtree_agree_with_the_walk(n: int, fanout: int, data: st.DataObject) -> None:
    parent = walk(n, fanout)
    target = data.draw(st.integers(0, n - 1))
    hops = path(n, fanout, target)
    assert hops[-1] == target
    for by, to in zip([None, *hops], hops, strict=False):
        assert parent[to] == by
    lo, hi = subtree(n, fanout, target)
    assert lo == target
    behind = {p for p in range(lo, hi)}
    # Exactly the positions whose path passes through target.
    assert behind == {p for p in range(n) if target in path(n, fanout, p)}


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 5000), st.integers(2, 64))
def test_depth_is_about_log_fanout(n: int, fanout: int) -> None:
    d = depth(n, fanout)
    parent = walk(n, fanout)
    levels: dict[int, int] = {}
    for p in range(n):  # parents come before children in position order
        by = parent[p]
        levels[p] = 1 if by is None else levels[by] + 1
    assert d == max(levels.values())
    assert d <= math.ceil(math.log(n, fanout)) + 2 if n > 1 else d == 1


def test_the_default_fanout_makes_big_meshes_shallow() -> None:
    assert depth(4096, 16) == 3
    assert depth(16384, 16) == 4
    assert depth(1024, 16) == 3
    assert len(root_ranges(1024, 16)) == 16


@given(st.integers(0, 500), st.integers(0, 500), st.integers(1, 40))
def test_split_is_balanced_and_contiguous(lo: int, extra: int, parts: int) -> None:
    hi = lo + extra
    ranges = split(lo, hi, parts)
    if extra == 0:
        assert ranges == []
        return
    assert ranges[0][0] == lo and ranges[-1][1] == hi
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [b - a for a, b in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert len(ranges) == min(parts, extra)


def test_bad_arguments_say_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"parts must be at least 1 \(got 0\)"):
        split(0, 4, 0)
    with pytest.raises(ValueError, match=r"target must be in \[0, 4\) \(got 4\)"):
        path(4, 2, 4)
    with pytest.raises(ValueError, match=r"node must be in \[0, 4\) \(got -1\)"):
        subtree(4, 2, -1)


def test_the_config_keys_are_checked() -> None:
    from regency.core._config import Config

    with pytest.raises(ValueError, match=r"cast_fanout must be an int of at least 2 \(got 1\)"):
        Config(cast_fanout=1)
    with pytest.raises(ValueError, match=r"cast_tree_min must be positive \(got 0\)"):
        Config(cast_tree_min=0)
    assert Config().cast_fanout == 16 and Config().cast_tree_min == 64


def test_monarchs_max_cast_dimension_size_sets_the_fanout() -> None:
    import regency.config

    with regency.config.configured(max_cast_dimension_size=8) as config:
        assert config["cast_fanout"] == 8
    with pytest.raises(ValueError, match=r"cast_fanout must be an int of at least 2 \(got 1\)"):
        regency.config.configure(max_cast_dimension_size=1)
