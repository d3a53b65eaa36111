"""A runtime on its way out starts nothing more, and says nothing about it.

A proc's connection can break while it shuts down (its controller exits at the same time):
the transport, which closes after the runtime's nursery, reported the loss, the outbox asked
for a reconnect, and ``Runtime.start_soon`` found the nursery closed. The proc then logged
``proc ... failed ... RuntimeError: Nursery is closed to new arrivals`` and exited 1, though
the program itself ended well.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import trio

from regency import transports
from regency.core._config import Config
from regency.core._delivery import DIALING, Dial
from regency.core._outbox import Outbox
from regency.core._runtime import Runtime


def _runtime(name: str) -> Runtime:
    return Runtime(
        name,
        secret=b"s" * 32,
        jobdir="/nowhere",
        config=Config(thread_reads=False),
        address=f"inproc://{name}-{os.getpid()}",
    )


class _Link:
    """A connection the outbox takes for up: it records what is written and whether it was
    closed."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.closed = False

    def send_nowait(self, frame: Any, answer: bool = False) -> None:
        self.sent.append(frame)

    def close(self) -> None:
        self.closed = True


def _connected(rt: Runtime) -> tuple[Outbox, Any]:
    """An outbox of ``rt`` connected (as far as its session knows) over a fake link."""
    box = Outbox(rt, "inproc://the-peer")
    dial = box._machine.queued(b"a frame")
    assert isinstance(dial, Dial) and dial.first and box._begin_dial(dial)
    link: Any = _Link()
    box._resume(link)
    assert link.sent[-1] == b"a frame"  # (after the session's header)
    return box, link


@pytest.fixture(autouse=True)
def _no_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_ZYGOTE", "0")  # a controller's serve would start one


def test_a_connection_lost_after_the_nursery_closed_starts_no_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = _runtime("quiet")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve)
            closing_while_open = rt.closing
            box, link = _connected(rt)
            rt.stop()
        assert not closing_while_open
        # serve returned: its nursery is closed. The transport closes its connections after
        # it, on this thread, and a peer exiting now breaks one first: the exact path.
        assert rt.closing
        box._connection_lost(link, transports.ConnectionBroken("the peer exited"))
        # The session would dial again, but no attempt began: nothing was started.
        assert box._machine.state == DIALING and not box._machine.attempt

    with caplog.at_level(logging.WARNING):
        trio.run(main)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_start_soon_on_a_closed_runtime_is_dropped_quietly() -> None:
    rt = _runtime("dropped")
    ran: list[str] = []

    async def task() -> None:
        ran.append("ran")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve)
            rt.start_soon(task)  # (open: runs)
            await trio.sleep(0.01)
            rt.stop()
        rt.start_soon(task)  # closed: neither raises nor runs
        await trio.sleep(0.01)

    trio.run(main)
    assert ran == ["ran"]


def test_a_task_started_while_closing_still_runs_its_cancellation() -> None:
    # Between the nursery's cancellation and its close, a task still starts and is
    # cancelled at its first checkpoint: its handler runs (a transfer's future, say, is
    # failed there rather than left unresolved).
    rt = _runtime("cancelled")
    seen: list[str] = []

    async def task() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            seen.append("cancelled")
            raise

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve)
            rt.nursery.cancel_scope.cancel()  # what serve does on its way out
            assert rt.closing
            rt.start_soon(task)

    trio.run(main)
    assert seen == ["cancelled"]
