"""A thread takes over reading a socket connection from the loop, and hands it back
(``SocketConnection.lead`` / ``read_led`` / ``give_back``; used by ``core/_leader.py``)."""

from __future__ import annotations

import select
import time
from typing import Any

import trio
import trio.testing

from regency.transports import Connection, open_transport
from regency.transports._sockets import SocketConnection, _loop_epoll

SECRET = b"t" * 32


class Sink:
    """Takes frames starting with ``T`` on a thread; everything else is left to the loop."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.lost: list[BaseException | None] = []
        self.conn: SocketConnection | None = None
        self.changed = trio.Event()

    def __call__(self, conn: Connection) -> Sink:
        assert isinstance(conn, SocketConnection)
        self.conn = conn
        return self

    def frame_on_thread(self, conn: Connection, frame: memoryview) -> bool:
        if bytes(frame[:1]) != b"T":
            return False
        self.seen.append(("thread", bytes(frame)))
        return True

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        self.seen.append(("loop", bytes(frame)))
        self.changed.set()
        self.changed = trio.Event()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        self.lost.append(exc)
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, pred: Any) -> None:
        with trio.fail_after(10):
            while not pred():
                await self.changed.wait()


class Client:
    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        pass

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


def read_until_handed_back(conn: SocketConnection, within: float = 10.0) -> int:
    """On a thread: poll and read until ``read_led`` hands the connection back; how many
    reads it took."""
    deadline = time.monotonic() + within
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    reads = 0
    while time.monotonic() < deadline:
        if poller.poll(100):
            reads += 1
            if not conn.read_led():
                return reads
    raise AssertionError("the thread never handed the connection back")


async def test_a_thread_reads_between_loop_reads_in_order(sockdir: str) -> None:
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        assert _loop_epoll() is not None  # trio's epoll is where we expect it (pinned trio)
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        server = sink.conn
        assert server is not None
        await trio.testing.wait_all_tasks_blocked()  # its reader waits for data
        assert await trio.to_thread.run_sync(server.lead)
        assert not await trio.to_thread.run_sync(server.lead)  # one reader at a time
        for frame in (b"T1", b"T2", b"N3", b"T4"):
            conn.send_nowait(frame)
        await trio.to_thread.run_sync(read_until_handed_back, server)
        # N3 is the loop's: the thread stopped before it, so N3 and what follows are the loop's.
        await sink.wait_for(lambda: len(sink.seen) == 5)
        conn.send_nowait(b"T5")
        await sink.wait_for(lambda: len(sink.seen) == 6)
        assert sink.seen == [
            ("loop", b"L0"),
            ("thread", b"T1"),
            ("thread", b"T2"),
            ("loop", b"N3"),
            ("loop", b"T4"),
            ("loop", b"T5"),
        ]


async def test_given_back_idle_the_loop_reads_again_without_being_woken(sockdir: str) -> None:
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        server = sink.conn
        assert server is not None
        for round_ in range(20):
            await trio.testing.wait_all_tasks_blocked()
            assert await trio.to_thread.run_sync(server.lead)
            await trio.to_thread.run_sync(server.give_back)  # nothing came: just re-armed
            conn.send_nowait(b"L%d" % (round_ + 1))
            await sink.wait_for(lambda n=round_ + 2: len(sink.seen) == n)
        assert [who for who, _ in sink.seen] == ["loop"] * 21


async def test_a_peer_that_goes_away_while_a_thread_reads_is_reported_by_the_loop(
    sockdir: str,
) -> None:
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        server = sink.conn
        assert server is not None
        await trio.testing.wait_all_tasks_blocked()
        assert await trio.to_thread.run_sync(server.lead)
        conn.send_nowait(b"T1")
        conn.close()
        await trio.to_thread.run_sync(read_until_handed_back, server)
        await sink.wait_for(lambda: len(sink.lost) == 1)
        assert sink.seen == [("loop", b"L0"), ("thread", b"T1")]
        assert server.closed and not server.lead()


async def test_an_illegal_move_of_the_baton_fails_the_connection(sockdir: str) -> None:
    """An event the baton's state cannot see (a bug) breaks it for good: the connection
    fails, the reader task is woken to report it, and no thread leads it again."""
    from regency.transports import _baton

    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        server = sink.conn
        assert server is not None
        await trio.testing.wait_all_tasks_blocked()
        with server._read_lock:
            assert server._move_locked(_baton.SILENCE_FAILED) == _baton.ILLEGAL
        await sink.wait_for(lambda: len(sink.lost) == 1)
        assert "the read baton went loop_waiting --silence_failed--> broken" in str(sink.lost[0])
        assert server.closed and not server.lead() and server._baton == _baton.BROKEN


async def test_sealed_connections_are_never_led() -> None:
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen("tcp://127.0.0.1:0", sink)
        conn = await t.connect(listener.address, Client())
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        await trio.testing.wait_all_tasks_blocked()
        assert sink.conn is not None and not await trio.to_thread.run_sync(sink.conn.lead)


async def test_a_held_connection_stays_silent_until_a_thread_or_the_loop_takes_it(
    sockdir: str,
) -> None:
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        server = sink.conn
        assert server is not None
        await trio.testing.wait_all_tasks_blocked()
        assert await trio.to_thread.run_sync(server.lead)
        await trio.to_thread.run_sync(server.hold)
        assert server.held
        conn.send_nowait(b"T1")  # nobody reads it: the loop's interest is still silenced
        await trio.testing.wait_all_tasks_blocked()
        # Another lead takes it as it is (a thread, not the loop, reads T1).
        assert await trio.to_thread.run_sync(server.lead)
        assert not server.held
        conn.send_nowait(b"T2")
        poller = select.poll()
        poller.register(server.fileno(), select.POLLIN)
        assert await trio.to_thread.run_sync(poller.poll, 10_000)
        assert await trio.to_thread.run_sync(server.read_led)
        await trio.to_thread.run_sync(server.hold)
        assert sink.seen == [("loop", b"L0"), ("thread", b"T1"), ("thread", b"T2")]
        # The loop takes it back: what came while it was held is the loop's.
        conn.send_nowait(b"T3")
        assert server.reclaim() and not server.held
        assert not server.reclaim()  # once
        await sink.wait_for(lambda: len(sink.seen) == 4)
        assert sink.seen[-1] == ("loop", b"T3")
        # Given back (not reclaimed) from held, the loop reads on as after any give_back.
        await trio.testing.wait_all_tasks_blocked()
        assert await trio.to_thread.run_sync(server.lead)
        await trio.to_thread.run_sync(server.hold)
        await trio.to_thread.run_sync(server.give_back)
        conn.send_nowait(b"T4")
        await sink.wait_for(lambda: len(sink.seen) == 5)
        assert sink.seen[-1] == ("loop", b"T4")


async def test_a_connection_the_loop_must_read_is_given_back_not_held(sockdir: str) -> None:
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        conn.send_nowait(b"L0")
        await sink.wait_for(lambda: len(sink.seen) == 1)
        server = sink.conn
        assert server is not None
        await trio.testing.wait_all_tasks_blocked()
        assert await trio.to_thread.run_sync(server.lead)
        conn.send_nowait(b"N1")  # the loop's: the thread stops at it, unread
        await trio.to_thread.run_sync(read_until_handed_back, server)
        await trio.to_thread.run_sync(server.hold)  # handed back already: nothing to hold
        assert not server.held
        await sink.wait_for(lambda: len(sink.seen) == 2)
        # Closed while led: held would leave the end unreported; it goes back instead.
        await trio.testing.wait_all_tasks_blocked()
        assert await trio.to_thread.run_sync(server.lead)
        conn.close()
        poller = select.poll()
        poller.register(server.fileno(), select.POLLIN)
        assert await trio.to_thread.run_sync(poller.poll, 10_000)
        assert not await trio.to_thread.run_sync(server.read_led)  # end of stream
        await trio.to_thread.run_sync(server.hold)
        assert not server.held
        await sink.wait_for(lambda: len(sink.lost) == 1)
        assert sink.seen == [("loop", b"L0"), ("loop", b"N1")]


class _Clock:
    """A stand-in for ``_sockets._perf_counter``: the time a frame is sent at."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_reply_goes_out_at_once_and_back_to_back_frames_are_coalesced(
    sockdir: str, monkeypatch: Any
) -> None:
    """Frames sent back to back (pipelined calls, a burst of replies) are coalesced for the
    writer task; a frame sent a fast round trip (40 us) after the previous one is not a burst
    and goes out at once, and so does a frame sent as an answer (``answer=True``: the first
    frame a thread sends after it waited for a message), however soon after the previous one.
    Before, a 60 us window took a reply to a round trip that fast for a burst: it waited for
    the loop to wake up and write it, which a round trip of about 50 us met on one reply in
    five."""
    from regency.transports import _sockets

    clock = _Clock()
    monkeypatch.setattr(_sockets, "_perf_counter", clock)
    async with open_transport(SECRET) as t:
        sink = Sink()
        listener = await t.listen(f"unix://{sockdir}/l.sock", sink)
        conn = await t.connect(listener.address, Client())
        assert isinstance(conn, SocketConnection)

        def queued() -> bool:
            return bool(conn._pending) or conn._kicked

        conn.send_nowait(b"L0")
        assert not queued()
        clock.now += 40e-6  # a fast round trip later
        conn.send_nowait(b"L1")
        assert not queued()
        clock.now += 5e-6  # back to back: the writer task sends the rest in one go
        conn.send_nowait(b"L2")
        conn.send_nowait(b"L3")
        assert queued()
        await sink.wait_for(lambda: len(sink.seen) == 4)
        assert not queued()
        clock.now += 40e-6
        conn.send_nowait(b"L4")
        assert not queued()
        clock.now += 5e-6  # this thread waited for a message: L5 answers it
        conn.send_nowait(b"L5", answer=True)
        assert not queued()
        conn.send_nowait(b"L6")  # the answer's own follow-up is a burst again
        assert queued()
        await sink.wait_for(lambda: len(sink.seen) == 7)
        assert [frame for _, frame in sink.seen] == [b"L%d" % i for i in range(7)]


def test_an_acknowledgement_a_waiting_thread_sends_is_not_an_answer() -> None:
    """A thread that reads while it waits sends the receiver's acknowledgement itself now
    and then; that frame is not the answer it waited for, so it goes without the answer
    mark (the answer that follows skips the burst window, not the acknowledgement)."""
    from types import SimpleNamespace

    from regency.core._inbound import InboundSink

    sent: list[bool] = []

    class Conn:
        closed = False

        def send_nowait(self, frame: Any, answer: bool = False) -> None:
            sent.append(answer)

    sink: Any = object.__new__(InboundSink)
    sink._ack_pending, sink._conn = True, Conn()
    sink._receiver = SimpleNamespace(ack=lambda: 7)
    sink._ack()
    assert sent == [False]


def test_an_interrupt_inside_an_acknowledgements_write_closes_its_connection() -> None:
    """Ctrl-C on a main thread that reads, inside the write of an acknowledgement: it may be
    half written, and the next one's bytes would be read as its rest; the connection is
    closed (on the loop) and its sender resumes the session on a new one."""
    from types import SimpleNamespace

    from regency.core._inbound import InboundSink

    class Conn:
        closed = False

        def send_nowait(self, frame: Any, answer: bool = False) -> None:
            raise KeyboardInterrupt

        def close(self) -> None:
            self.closed = True

    scheduled: list[Any] = []
    sink: Any = object.__new__(InboundSink)
    conn = Conn()
    sink._ack_pending, sink._conn = True, conn
    sink._receiver = SimpleNamespace(ack=lambda: 7)
    sink._rt = SimpleNamespace(call_soon=scheduled.append)
    try:
        sink._ack()
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was swallowed")
    assert scheduled == [conn.close]
