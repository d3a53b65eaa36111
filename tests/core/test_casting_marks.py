"""The marks a sender keeps of its direct messages not yet acknowledged, which send a tree
cast to those procs directly too (``Casting._split``, ``Outbox.direct_mark``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from regency.core._casting import Casting
from regency.core._outbox import Outbox

DESTS = (("p1", (0,)),)


def _casting(**outboxes: Any) -> Casting:
    runtime: Any = SimpleNamespace(outboxes=outboxes)
    return Casting(runtime)


class _Box:
    """An outbox's mark and its machine's count, with the outbox's own test of them."""

    direct_unacked = Outbox.direct_unacked

    def __init__(self, acked: int, mark: int) -> None:
        self._machine = SimpleNamespace(acked=acked)
        self.direct_mark = mark


def _box(acked: int, mark: int) -> Any:
    return _Box(acked, mark)


def test_a_proc_with_a_direct_message_not_acknowledged_gets_the_cast_directly() -> None:
    box = _box(acked=5, mark=9)
    casting = _casting(p1=box)
    assert casting._split(DESTS) == (DESTS, ())  # behind message 9, on the same connection
    box._machine.acked = 9
    assert casting._split(DESTS) == ((), DESTS)
    # The mark stays (no cast deletes it: direct sends store marks without the casting
    # lock, and before, a delete after a newer store lost that mark): the next direct
    # message raises it, and the cast after it goes directly again.
    box.direct_mark = 10
    assert casting._split(DESTS) == (DESTS, ())


def test_an_outbox_that_replaces_one_at_the_same_address_starts_without_a_mark() -> None:
    """The mark goes with its outbox: a proc at a reused address (a new session, counted
    from 0) is not sent casts directly for a message of the old one."""
    casting = _casting(p1=_box(acked=0, mark=0))
    assert casting._split(DESTS) == ((), DESTS)
    assert _casting()._split(DESTS) == ((), DESTS)  # no outbox yet: down the tree
