"""The loop takes back connections threads set aside (``Leader._hold`` / ``_reclaim``), per
connection, in virtual time: no sockets, no threads, so no load on the machine moves it.

The end-to-end form (a real proc, a real thread calling another proc) is in
test_leader.py; it cannot tell the per-connection reclaim from the old one reliably,
because under load any wait for the loop or a pause between calls also takes connections
back. This one can.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
import trio
import trio.testing

from regency.core._leader import HOLD, Leader


@attrs.define(eq=False)
class FakeConnection:
    """What ``_hold`` and ``_reclaim`` use of a ``SocketConnection``."""

    name: str
    held: bool = False
    reclaimed_at: list[float] = attrs.field(factory=list)

    def hold(self) -> None:
        self.held = True

    def reclaim(self) -> bool:
        if not self.held:
            return False
        self.held = False
        self.reclaimed_at.append(trio.current_time())
        return True


def _leader(nursery: trio.Nursery, conns: list[FakeConnection]) -> Leader:
    runtime: Any = SimpleNamespace(
        config=SimpleNamespace(spin_us=0),
        inbound=SimpleNamespace(leadable={i: conn for i, conn in enumerate(conns)}),
        nursery=nursery,
        call_soon=lambda fn: fn(),
    )
    return Leader(runtime)


async def test_a_connection_no_thread_sets_aside_again_goes_back_while_others_are_held(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A thread set A aside once, then keeps setting B aside every HOLD/2 (it calls another
    proc): A goes back to the loop within two HOLDs, B stays aside as long as the thread
    comes back for it, and goes back within two HOLDs once it stops."""
    a, b = FakeConnection("a"), FakeConnection("b")
    async with trio.open_nursery() as nursery:
        leader = _leader(nursery, [a, b])
        start = trio.current_time()
        leader._hold([a])
        for _ in range(40):  # 20 HOLDs of a thread calling B
            await trio.sleep(HOLD / 2)
            leader._hold([b])
            assert b.held, "a connection a thread keeps setting aside was taken back"
        assert a.reclaimed_at, (
            "the connection set aside once was not taken back while the thread went on "
            "setting another aside"
        )
        assert a.reclaimed_at[0] - start <= 2 * HOLD + 1e-9, a.reclaimed_at
        assert not b.reclaimed_at
        stopped = trio.current_time()
        await trio.sleep(3 * HOLD)
        assert not b.held and b.reclaimed_at[0] - stopped <= 2 * HOLD + 1e-9
        assert not leader._reclaiming, "the reclaim task goes on with nothing set aside"


async def test_nothing_is_set_aside_while_a_thread_waits_for_the_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While a thread waits for the loop to read for it, what is held goes back at once,
    and a hold made meanwhile is undone before it returns."""
    a, b = FakeConnection("a"), FakeConnection("b")
    async with trio.open_nursery() as nursery:
        leader = _leader(nursery, [a, b])
        leader._hold([a])
        assert a.held
        with leader.loop_waiting():
            assert not a.held and a.reclaimed_at
            leader._hold([b])
            assert not b.held, "a connection was set aside while a thread waited for the loop"
        leader._hold([b])
        assert b.held
        await trio.sleep(3 * HOLD)
        assert not b.held
