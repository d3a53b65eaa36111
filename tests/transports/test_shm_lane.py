"""The shared-memory lane of unix-socket connections (``transports/_shm.py``): big frames go
through a ring in shared memory, their descriptors through the socket."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from regency.transports import (
    AuthenticationError,
    Connection,
    ConnectionBroken,
    _auth,
    _shm,
    _sockets,
)
from regency.transports._sockets import LANE_MIN, SocketConnection, SocketTransport

from .test_conformance import Recorder

SECRET = b"l" * 32
RING = 256 * 1024
SMALL = 4 * 1024  # lane_min of the small-ring transports below

pytestmark = pytest.mark.skipif(not _shm.available(), reason="no memfd seals on this platform")


class Sink(Recorder):
    """The conformance suite's recorder, also a sink factory that keeps the connections it
    was made for (a listener's side of each)."""

    timeout = 20.0

    def __init__(self, echo: bool = False) -> None:
        super().__init__(echo=echo)
        self.conns: list[SocketConnection] = []

    def __call__(self, conn: Connection) -> Sink:
        assert isinstance(conn, SocketConnection)
        self.conns.append(conn)
        return self


@asynccontextmanager
async def transport(secret: bytes = SECRET, **kwargs: Any) -> AsyncIterator[SocketTransport]:
    async with trio.open_nursery() as nursery:
        yield SocketTransport(nursery, secret, 1 << 30, **kwargs)
        nursery.cancel_scope.cancel()


async def pair(
    server_t: SocketTransport, client_t: SocketTransport, sockdir: str, echo: bool = False
) -> tuple[SocketConnection, Sink, Sink]:
    server = Sink(echo=echo)
    listener = await server_t.listen(f"unix://{sockdir}/s.sock", server)
    client = Sink()
    conn = await client_t.connect(listener.address, client)
    assert isinstance(conn, SocketConnection)
    await server.wait_for(lambda: server.conns)
    return conn, client, server


def _lane_fds() -> int:
    """Descriptors of this process that are lane rings (a mapping holds one each)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if "regency-lane" in os.readlink(f"/proc/self/fd/{name}"):
                count += 1
        except OSError:
            pass
    return count


def _lane_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("regency-lane" in line for line in f)


async def test_both_ends_agree_and_big_frames_take_the_lane(sockdir: str) -> None:
    async with transport() as t:
        conn, client, server = await pair(t, t, sockdir, echo=True)
        assert conn.lane and server.conns[0].lane
        sizes = [LANE_MIN - 1, LANE_MIN, LANE_MIN + 1, 3 << 20, 100, 1 << 20]
        sent = [os.urandom(n) for n in sizes]
        for frame in sent:
            conn.send_nowait(frame)
        await client.wait_for(lambda: len(client.frames) == len(sent))
        assert client.frames == sent
        assert conn._lane_out is not None and conn._lane_out.placed == 4
        back = server.conns[0]._lane_out
        assert back is not None and back.placed == 4
        assert conn._lane_out.in_use() == 0 and back.in_use() == 0  # all freed


@pytest.mark.parametrize("off", ["server", "client", "both"])
async def test_lane_is_off_unless_both_ends_offer_it(off: str, sockdir: str) -> None:
    async with transport(shm_lane=off == "client") as st, transport(shm_lane=off == "server") as ct:
        before = _lane_fds()
        conn, client, server = await pair(st, ct, sockdir, echo=True)
        assert not conn.lane and not server.conns[0].lane
        assert _lane_fds() == before  # what one side offered was closed
        big = os.urandom(2 << 20)
        conn.send_nowait(big)
        await client.wait_for(lambda: client.frames)
        assert client.frames == [big]


async def test_tcp_has_no_lane() -> None:
    async with transport() as t:
        server = Sink(echo=True)
        listener = await t.listen("tcp://127.0.0.1:0", server)
        client = Sink()
        conn = await t.connect(listener.address, client)
        assert isinstance(conn, SocketConnection) and not conn.lane
        conn.send_nowait(b"x" * (1 << 20))
        await client.wait_for(lambda: client.frames)


async def test_wrap_around_full_ring_and_order_with_small_frames(sockdir: str) -> None:
    """Many frames in flight through a small ring: it wraps, fills (frames then go over the
    socket), and every frame, big or small, arrives intact and in order."""
    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        conn, _client, server = await pair(t, t, sockdir)
        sink = server
        sent = []
        for i in range(400):
            size = [5, SMALL, 40_000, 90_000, SMALL - 1, 70_001, RING, RING + 1][i % 8]
            sent.append(i.to_bytes(4, "little") + os.urandom(size))
        for frame in sent:  # no checkpoint: the receiver frees nothing meanwhile
            conn.send_nowait(frame)
        ring = conn._lane_out
        assert ring is not None
        placed = ring.placed
        eligible = sum(SMALL <= len(f) <= RING for f in sent)
        assert 0 < placed < eligible  # some went through the ring, the rest (full) the socket
        await sink.wait_for(lambda: len(sink.frames) == len(sent))
        assert sink.frames == sent
        assert ring.in_use() == 0
        # Now one at a time: each fits, and lands where the last one was freed.
        for frame in sent[:50]:
            conn.send_nowait(frame)
            n = len(sink.frames)
            await sink.wait_for(lambda n=n: len(sink.frames) == n + 1)
            assert sink.frames[-1] == frame
        assert ring.placed == placed + sum(SMALL <= len(f) <= RING for f in sent[:50])


async def test_sends_from_threads_keep_order_through_the_lane(sockdir: str) -> None:
    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        conn, _client, server = await pair(t, t, sockdir)

        def blast(tag: int) -> None:
            for i in range(300):
                size = 9 if i % 3 else SMALL + i * 37
                conn.send_nowait(tag.to_bytes(1, "little") + i.to_bytes(4, "little") * (size // 4))

        threads = [threading.Thread(target=blast, args=(tag,)) for tag in range(3)]
        for thread in threads:
            thread.start()
        await trio.to_thread.run_sync(lambda: [th.join() for th in threads])
        await server.wait_for(lambda: len(server.frames) == 900)
        for tag in range(3):
            mine = [f for f in server.frames if f[0] == tag]
            assert [int.from_bytes(f[1:5], "little") for f in mine] == list(range(300))
            assert all(f[1:] == f[1:5] * (len(f[1:]) // 4) for f in mine)
        assert conn._lane_out is not None and conn._lane_out.placed > 0


@pytest.mark.parametrize(
    "descriptor, error",
    [
        (_shm.DESCRIPTOR.pack(4096, 10), "must name position 0"),
        (_shm.DESCRIPTOR.pack(0, 0), "length must be 1 to"),
        (_shm.DESCRIPTOR.pack(0, RING + 1), "length must be 1 to"),
        (_shm.DESCRIPTOR.pack(0, 1 << 63), "length must be 1 to"),
        (_shm.DESCRIPTOR.pack(2 * RING, 10), "must name position 0"),
    ],
    ids=["unwritten-space", "empty", "past-the-end", "huge", "too-far"],
)
async def test_a_bad_descriptor_closes_only_that_connection(
    descriptor: bytes, error: str, sockdir: str
) -> None:
    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        conn, client, server = await pair(t, t, sockdir)
        good = Sink()
        other = await t.connect(f"unix://{sockdir}/s.sock", good)
        conn._sock.send(_shm.MARK_BYTES + descriptor)
        await server.wait_for(lambda: server.lost)
        assert error in str(server.lost[0])
        assert server.frames == []
        await client.wait_for(lambda: client.lost)
        big = os.urandom(SMALL * 3)
        other.send_nowait(big)
        await server.wait_for(lambda: server.frames == [big])
        assert server.conns[1].lane


async def test_a_lane_frame_over_max_frame_bytes_closes_the_connection(sockdir: str) -> None:
    async with trio.open_nursery() as nursery:
        t = SocketTransport(nursery, SECRET, 100_000, lane_min=SMALL, lane_ring=RING)
        conn, _client, server = await pair(t, t, sockdir)
        ring = conn._lane_out
        assert ring is not None
        with conn._lock:  # as a sender that ignored the limit would
            descriptor = ring.place([os.urandom(150_000)], 150_000)
        assert descriptor is not None
        conn._sock.send(_shm.MARK_BYTES + descriptor)
        await server.wait_for(lambda: server.lost)
        assert "frame of 150000 bytes exceeds max_frame_bytes=100000" in str(server.lost[0])
        assert server.frames == []
        nursery.cancel_scope.cancel()


async def test_a_descriptor_without_a_lane_closes_the_connection(sockdir: str) -> None:
    async with transport(shm_lane=False) as t:
        conn, _client, server = await pair(t, t, sockdir)
        conn._sock.send(_shm.MARK_BYTES + _shm.DESCRIPTOR.pack(0, 10))
        await server.wait_for(lambda: server.lost)
        assert "lane descriptor on a connection without a shared-memory lane" in str(
            server.lost[0]
        )


async def test_a_descriptor_split_across_reads_waits_for_the_rest(sockdir: str) -> None:
    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        conn, _client, server = await pair(t, t, sockdir)
        # Place a frame by hand, then send its descriptor in two pieces.
        ring = conn._lane_out
        assert ring is not None
        payload = os.urandom(SMALL * 2)
        with conn._lock:
            descriptor = ring.place([payload], len(payload))
        assert descriptor is not None
        wire = _shm.MARK_BYTES + descriptor
        conn._sock.send(wire[:7])
        await trio.testing.wait_all_tasks_blocked()  # the reader has the piece, waits on
        assert server.frames == [] and not server.lost
        conn._sock.send(wire[7:])
        await server.wait_for(lambda: server.frames)
        assert server.frames == [payload] and not server.lost


async def test_close_and_loss_unmap_the_rings(sockdir: str) -> None:
    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        before_fds, before_maps = _lane_fds(), _lane_maps()
        conn, client, server = await pair(t, t, sockdir, echo=True)
        conn.send_nowait(os.urandom(SMALL * 4))
        await client.wait_for(lambda: client.frames)
        # Two connections' ends in this process, each mapping its ring and its peer's.
        assert _lane_fds() == before_fds + 4
        assert _lane_maps() >= before_maps + 4
        conn.close()
        await server.wait_for(lambda: server.lost)
        assert _lane_fds() == before_fds
        assert _lane_maps() == before_maps
        # Loss (the peer's socket goes away without a close) unmaps too.
        conn2, client2, _ = await pair_again(t, sockdir, server)
        assert _lane_fds() == before_fds + 4
        server.conns[-1]._sock.shutdown(socket.SHUT_RDWR)
        await client2.wait_for(lambda: client2.lost)
        await server.wait_for(lambda: len(server.lost) == 2)
        assert _lane_fds() == before_fds
        assert _lane_maps() == before_maps
        with pytest.raises(ConnectionBroken):
            conn2.send_nowait(os.urandom(SMALL * 4))


async def pair_again(
    t: SocketTransport, sockdir: str, server: Sink
) -> tuple[SocketConnection, Sink, Sink]:
    client = Sink()
    n = len(server.conns)
    conn = await t.connect(f"unix://{sockdir}/s.sock", client)
    assert isinstance(conn, SocketConnection)
    await server.wait_for(lambda: len(server.conns) == n + 1)
    return conn, client, server


def _handshake_as_client(address: str, fd: int | None) -> tuple[socket.socket, list[int]]:
    """An old (or odd) peer: the handshake by hand, passing ``fd`` with the proof."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(address)
    hello = sock.recv(_auth.SERVER_HELLO_BYTES)
    proof, _ = _auth.client_proof(SECRET, hello)
    if fd is None:
        sock.sendall(proof)
    else:
        sock.sendmsg([proof], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))])
    _, ancillary, _, _ = sock.recvmsg(_auth.SERVER_PROOF_BYTES, socket.CMSG_SPACE(16))
    fds = [int.from_bytes(d[:4], "little") for _, _, d in ancillary]
    return sock, fds


async def test_an_old_peer_gets_no_lane_and_frames_still_arrive(sockdir: str) -> None:
    async with transport() as t:
        server = Sink()
        await t.listen(f"unix://{sockdir}/s.sock", server)
        sock, fds = await trio.to_thread.run_sync(
            _handshake_as_client, f"{sockdir}/s.sock", None
        )
        with sock:
            assert fds == []  # the server offers no ring to a peer that offered none
            await server.wait_for(lambda: server.conns)
            assert not server.conns[0].lane
            big = os.urandom(1 << 20)
            await trio.to_thread.run_sync(sock.sendall, len(big).to_bytes(4, "little") + big)
            await server.wait_for(lambda: server.frames)
            assert server.frames == [big]


@pytest.mark.parametrize("ring", ["unsealed", "too-small", "a-socket"])
async def test_a_peer_offering_a_bad_ring_is_refused(ring: str, sockdir: str) -> None:
    async with transport() as t:
        server = Sink()
        await t.listen(f"unix://{sockdir}/s.sock", server)
        if ring == "a-socket":
            a, b = socket.socketpair()
            fd = a.detach()
            b.close()
        else:
            fd = os.memfd_create("odd")
            os.ftruncate(fd, _shm.CONTROL + (RING if ring == "unsealed" else 4096))
        try:
            sock, fds = await trio.to_thread.run_sync(
                _handshake_as_client, f"{sockdir}/s.sock", fd
            )
        finally:
            os.close(fd)
        with sock:
            for passed in fds:
                os.close(passed)
            sock.settimeout(5)
            assert await trio.to_thread.run_sync(sock.recv, 10) == b""  # dropped
        assert server.conns == []


async def test_a_thread_reads_lane_frames_and_leaves_declined_ones_to_the_loop(
    sockdir: str,
) -> None:
    """``read_led`` (a thread reading): a lane frame it takes is freed at once; one it
    declines stays (descriptor and ring bytes) for the loop, in order."""

    class ThreadSink(Sink):
        def frame_on_thread(self, conn: Connection, frame: memoryview) -> bool:
            if bytes(frame[:1]) != b"T":
                return False
            self.frames.append(b"thread:" + bytes(frame))
            return True

    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        server = ThreadSink()
        listener = await t.listen(f"unix://{sockdir}/s.sock", server)
        conn = await t.connect(listener.address, Sink())
        assert isinstance(conn, SocketConnection)
        await server.wait_for(lambda: server.conns)
        receiving = server.conns[0]
        await trio.testing.wait_all_tasks_blocked()
        assert receiving.lead()
        frames = [b"T" + os.urandom(SMALL * 2), b"L" + os.urandom(SMALL * 3), b"T" + b"small"]
        for frame in frames:
            conn.send_nowait(frame)

        def read() -> None:
            while receiving.read_led():
                pass
            receiving.give_back()

        with trio.fail_after(10):
            while not server.frames:
                await trio.to_thread.run_sync(read)
        assert server.frames[0] == b"thread:" + frames[0]
        await server.wait_for(lambda: len(server.frames) == 3)
        assert server.frames[1] == frames[1]  # the loop took the declined one, in order
        assert server.frames[2] in (frames[2], b"thread:" + frames[2])
        assert conn._lane_out is not None and conn._lane_out.in_use() == 0


def test_rings_reuse_freed_space_wrap_and_restart_when_empty() -> None:
    """The rings without sockets: where frames land, when the ring is full, and what a
    receiver accepts."""
    out = _shm.OutRing(RING)
    assert out.fd is not None
    ring_in = _shm.InRing(os.dup(out.fd))
    out.fd_sent()
    try:
        n = 100_000

        def place(tag: bytes) -> tuple[int, int] | None:
            descriptor = out.place([tag * (n // 2), memoryview(tag * (n - n // 2))], n)
            return None if descriptor is None else _shm.DESCRIPTOR.unpack(descriptor)

        def take(where: tuple[int, int], tag: bytes, free: bool = True) -> None:
            frame = ring_in.take(_shm.DESCRIPTOR.pack(*where))
            assert bytes(frame) == tag * n
            frame.release()
            if free:
                ring_in.free()

        a = place(b"a")
        assert a == (0, n)
        take(a, b"a")
        b = place(b"b")
        assert b == (RING, n)  # empty: starts again at offset 0
        c = place(b"c")
        assert c == (RING + n, n)  # b is not freed: c follows it
        assert place(b"d") is None  # it would cross the end, and offset 0 holds b: full
        take(b, b"b")
        take(c, b"c", free=False)
        d = place(b"d")
        assert d == (2 * RING, n)  # skips the ring's tail, lands where b was
        take(c, b"c")  # taken again (a thread declined it, the loop takes it): the same
        with pytest.raises(_shm.LaneError, match=f"must name position {RING + 2 * n} or the ring.s next start"):
            ring_in.take(_shm.DESCRIPTOR.pack(2 * RING + 8, n))
        take(d, b"d")
        assert out.in_use() == 0 and out.placed == 4
        # A receiver that writes nonsense into the control page breaks the lane.
        ring_in._freed[0] = 1 << 40
        with pytest.raises(_shm.LaneError, match="freed position must lie between"):
            out.place([b"e" * n], n)
    finally:
        out.close()
        ring_in.close()


def test_ring_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match=r"lane ring size must be a multiple of 4096 bytes .* \(got 5000\)"):
        _shm.OutRing(5000)
    with pytest.raises(ValueError, match=r"lane ring size must be .* \(got 4096\)"):
        SocketTransport(None, SECRET, 1 << 20, lane_ring=4096)  # type: ignore[arg-type]


async def test_failed_and_cancelled_handshakes_leave_no_ring_behind(sockdir: str) -> None:
    async with transport() as t, transport(b"w" * 32) as impostor:
        before = _lane_fds()
        server = Sink()
        await t.listen(f"unix://{sockdir}/s.sock", server)
        with pytest.raises(AuthenticationError):
            await impostor.connect(f"unix://{sockdir}/s.sock", Sink())
        # A server that never answers: the dial is cancelled with its ring offered.
        silent = socket.socket(socket.AF_UNIX)
        silent.bind(f"{sockdir}/silent.sock")
        silent.listen(1)
        with silent, trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(t.connect, f"unix://{sockdir}/silent.sock", Sink())
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        await trio.testing.wait_all_tasks_blocked()
        assert _lane_fds() == before
        assert server.conns == []


def _lane_blocks() -> int:
    """512-byte blocks of shared memory the lane rings of this process hold committed."""
    rings: dict[int, int] = {}  # inode: blocks (a ring is mapped by both ends)
    for name in os.listdir("/proc/self/fd"):
        try:
            if "regency-lane" in os.readlink(f"/proc/self/fd/{name}"):
                st = os.stat(f"/proc/self/fd/{name}")
                rings[st.st_ino] = st.st_blocks
        except OSError:
            pass
    return sum(rings.values())


def test_a_ring_gives_its_pages_back_once_every_frame_is_read() -> None:
    out = _shm.OutRing(RING)
    assert out.fd is not None
    ring_in = _shm.InRing(os.dup(out.fd))
    out.fd_sent()
    try:
        base = _lane_blocks()
        descriptor = out.place([os.urandom(200_000)], 200_000)
        assert descriptor is not None and out.holds_memory
        assert _lane_blocks() - base >= 200_000 // 512
        assert not out.release()  # not read yet: the pages stay
        frame = ring_in.take(descriptor)
        frame.release()
        ring_in.free()
        assert out.release() and not out.holds_memory
        assert _lane_blocks() - base <= 8  # the control page the receiver wrote, at most
        again = out.place([b"z" * 100_000], 100_000)  # and the ring works on
        assert again is not None and bytes(ring_in.take(again)) == b"z" * 100_000
    finally:
        out.close()
        ring_in.close()


async def test_the_writer_gives_an_idle_rings_pages_back(
    sockdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sockets, "_KEEP_BIG", 0.0)  # idle at once: released at once
    async with transport(lane_min=SMALL, lane_ring=RING) as t:
        conn, client, server = await pair(t, t, sockdir, echo=True)
        base = _lane_blocks()
        big = os.urandom(200_000)
        conn.send_nowait(big)
        await client.wait_for(lambda: client.frames == [big])
        await trio.testing.wait_all_tasks_blocked()
        ring, back = conn._lane_out, server.conns[0]._lane_out
        assert ring is not None and back is not None
        assert ring.placed == back.placed == 1
        assert not ring.holds_memory and not back.holds_memory
        assert _lane_blocks() <= base + 16  # the control pages, at most
