"""Grouping similar log lines for the aggregated display (pure: no I/O, no clock).

Lines are similar when their normalized edit distance (Levenshtein distance over the longer
length) is below a threshold, 0.15 as in Monarch. Grouping is per stream, across ranks and
within a rank; a group shows its first line and the rank that printed it.
"""

from __future__ import annotations

import math
import time

import attrs

#: Lines whose normalized edit distance is below this are one group.
SIMILARITY = 0.15
#: Only this many leading characters take part in the comparison: the banded distance costs
#: O(n * 0.15 n), and two lines that agree on their first 1 KiB are alike for a reader.
_COMPARE_CHARS = 1024


def edit_distance_below(a: str, b: str, limit: int) -> int | None:
    """The Levenshtein distance of ``a`` and ``b`` when it is below ``limit``, else None.

    A banded dynamic programme: only cells within ``limit`` of the diagonal can hold a
    distance below ``limit``.
    """
    if limit <= 0:
        return None
    if len(a) < len(b):
        a, b = b, a
    if len(a) - len(b) >= limit:
        return None
    if not b:
        return len(a)
    big = limit
    previous = [j if j < limit else big for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        lo = max(1, i - limit + 1)
        hi = min(len(b), i + limit - 1)
        current = [big] * (len(b) + 1)
        current[0] = i if i < limit else big
        best = current[0]
        ai = a[i - 1]
        for j in range(lo, hi + 1):
            cost = previous[j - 1] + (ai != b[j - 1])
            up = previous[j] + 1
            left = current[j - 1] + 1
            value = min(cost, up, left)
            if value > big:
                value = big
            current[j] = value
            if value < best:
                best = value
        if best >= limit:
            return None
        previous = current
    result = previous[len(b)]
    return result if result < limit else None


def similar(a: str, b: str, threshold: float = SIMILARITY) -> bool:
    """Normalized edit distance of ``a`` and ``b`` below ``threshold``."""
    a, b = a[:_COMPARE_CHARS], b[:_COMPARE_CHARS]
    longest = max(len(a), len(b))
    if longest == 0:
        return True
    distance = edit_distance_below(a, b, math.ceil(threshold * longest) + 1)
    return distance is not None and distance / longest < threshold


@attrs.define
class Group:
    """Lines judged alike: the first one, who printed it, and how many there were."""

    line: str
    rank: int
    count: int = 1


@attrs.define
class Aggregator:
    """Similar lines of one stream over one window."""

    threshold: float = SIMILARITY
    groups: list[Group] = attrs.field(factory=list)
    #: Wall-clock (or, in the simulator, virtual) time of the window's first line.
    started: float | None = None

    def add(self, rank: int, line: str, timestamp: float) -> None:
        if self.started is None:
            self.started = timestamp
        for group in self.groups:
            if similar(group.line, line, self.threshold):
                group.count += 1
                return
        self.groups.append(Group(line, rank))

    def __len__(self) -> int:
        return len(self.groups)

    def render(self) -> str:
        """The block printed at the end of a window (empty when nothing arrived)."""
        if not self.groups:
            return ""
        stamp = format_timestamp(self.started or 0.0)
        body = "".join(
            f"\x1b[33m[{g.count} similar log lines]\x1b[0m [{g.rank}] {g.line}\n"
            for g in self.groups
        )
        return (
            f"\x1b[36m>>> Aggregated Logs ({stamp}) >>>\x1b[0m\n"
            f"{body}"
            f"\x1b[36m<<< Aggregated Logs ({stamp}) <<<\x1b[0m\n"
        )

    def reset(self) -> None:
        self.groups.clear()
        self.started = None


def format_timestamp(timestamp: float) -> str:
    """``2026-11-22 23:59:01.123`` (UTC) for wall-clock times; virtual times print as
    seconds since the simulation started."""
    if timestamp < 1e9:  # a simulator's virtual clock
        return f"t={timestamp:.6f}"
    whole = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(timestamp))
    return f"{whole}.{int((timestamp % 1) * 1000):03d}"
