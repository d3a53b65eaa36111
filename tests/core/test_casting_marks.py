"""The marks a sender keeps of its direct messages not yet acknowledged, which send a tree
cast to those procs directly too (``Casting._split``): written by direct sends without the
casting lock, so a cast that reads them must never drop one it did not read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from regency.core._casting import Casting


class _StoredMeanwhile(dict[str, int]):
    """Marks where another thread's direct send stores a newer mark for an address just
    after the cast read the old one (direct sends store without the casting lock)."""

    def __init__(self, marks: dict[str, int], newer: int) -> None:
        super().__init__(marks)
        self.newer = newer

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        self[key] = self.newer
        return value


def _casting(acked: int) -> Casting:
    box = SimpleNamespace(_machine=SimpleNamespace(acked=acked))
    runtime: Any = SimpleNamespace(_outboxes={"p1": box})
    return Casting(runtime)


def test_a_mark_stored_while_a_cast_reads_the_old_one_is_kept() -> None:
    """The old mark (3) is acknowledged (5), so this cast goes down the tree; the direct
    message sent meanwhile (mark 9, not acknowledged) must keep its mark, so that the next
    cast to that proc goes directly behind it instead of overtaking it down the tree.
    Before, the cast deleted the entry after reading the old mark, and lost the new one."""
    casting = _casting(acked=5)
    casting._direct = _StoredMeanwhile({"p1": 3}, newer=9)
    direct, tree = casting._split((("p1", (0,)),))
    assert (direct, tree) == ((), (("p1", (0,)),))
    assert dict(casting._direct) == {"p1": 9}
    casting._direct = dict(casting._direct)
    direct, tree = casting._split((("p1", (0,)),))
    assert direct == (("p1", (0,)),)  # 9 is not acknowledged: directly, in order


def test_an_acknowledged_mark_sends_the_cast_down_the_tree() -> None:
    casting = _casting(acked=9)
    casting._direct = {"p1": 9}
    assert casting._split((("p1", (0,)),)) == ((), (("p1", (0,)),))
