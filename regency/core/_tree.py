"""Casting trees, as pure functions: who forwards a mesh cast to whom.

A cast goes to ``n`` destination procs, listed in a fixed order (the mesh's rank order). The
sender does not send to each; it splits the list into at most ``fanout`` contiguous ranges of
nearly equal size and sends one frame to the first proc of each range, which delivers to its
own ranks and splits the rest of its range the same way. A range is its own subtree, so:

* every proc is reached exactly once, and at a depth of about ``log_fanout(n)`` hops;
* who forwards to whom depends only on ``(n, fanout)``: two casts over the same list take
  the same paths (what keeps them in order, see docs/concepts.md), and a proc that takes over
  for a lost forwarder computes the very ranges that forwarder would have sent.

No trio, no I/O: the runtime side is :mod:`regency.core._casting`.
"""

from __future__ import annotations

Range = tuple[int, int]  # [lo, hi): positions in the destination list


def split(lo: int, hi: int, parts: int) -> list[Range]:
    """``[lo, hi)`` cut into at most ``parts`` contiguous, non-empty ranges whose sizes differ
    by at most one (the larger ones first)."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1 (got {parts})")
    count = hi - lo
    if count <= 0:
        return []
    parts = min(parts, count)
    size, extra = divmod(count, parts)
    out: list[Range] = []
    start = lo
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def root_ranges(n: int, fanout: int) -> list[Range]:
    """The ranges the sender sends to (the first proc of each range is a child)."""
    return split(0, n, fanout)


def child_ranges(lo: int, hi: int, fanout: int) -> list[Range]:
    """The ranges the proc at ``lo`` forwards to, for its range ``[lo, hi)``."""
    return split(lo + 1, hi, fanout)


def depth(n: int, fanout: int) -> int:
    """Hops from the sender to the deepest proc (1: the sender reaches every proc itself)."""
    if n <= 0:
        return 0
    todo = [(r, 1) for r in root_ranges(n, fanout)]
    deepest = 0
    while todo:
        (lo, hi), level = todo.pop()
        deepest = max(deepest, level)
        todo.extend((r, level + 1) for r in child_ranges(lo, hi, fanout))
    return deepest


def path(n: int, fanout: int, target: int) -> list[int]:
    """The positions a frame passes through from the sender to ``target`` (``target`` last)."""
    if not 0 <= target < n:
        raise ValueError(f"target must be in [0, {n}) (got {target})")
    ranges = root_ranges(n, fanout)
    out: list[int] = []
    while True:
        lo, hi = next(r for r in ranges if r[0] <= target < r[1])
        out.append(lo)
        if lo == target:
            return out
        ranges = child_ranges(lo, hi, fanout)


def subtree(n: int, fanout: int, node: int) -> Range:
    """The range whose first proc is ``node`` (the positions behind it, itself included)."""
    if not 0 <= node < n:
        raise ValueError(f"node must be in [0, {n}) (got {node})")
    ranges = root_ranges(n, fanout)
    while True:
        lo, hi = next(r for r in ranges if r[0] <= node < r[1])
        if lo == node:
            return (lo, hi)
        ranges = child_ranges(lo, hi, fanout)
