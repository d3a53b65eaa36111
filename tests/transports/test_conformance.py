"""One conformance suite, run against every transport backend."""

from __future__ import annotations

import functools
import os
import random
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from regency.sim import SimNetwork
from regency.transports import (
    AuthenticationError,
    Connection,
    ConnectionBroken,
    IncompatiblePeer,
    MultiTransport,
    _auth,
    open_transport,
)
from regency.transports._sockets import LANE_MIN

SECRET = b"s" * 32
BACKENDS = ["tcp", "unix", "inproc", "nng+tcp", "nng+ipc", "nng+tls+tcp", "sim"]
AUTHENTICATED = ["tcp", "unix", "nng+tcp", "nng+ipc", "nng+tls+tcp"]
STREAM = ["tcp", "unix"]


def address_for(kind: str, sockdir: str) -> str:
    return {
        "tcp": "tcp://127.0.0.1:0",
        "unix": f"unix://{sockdir}/listener.sock",
        "inproc": "inproc://",
        "nng+tcp": "nng+tcp://127.0.0.1:0",
        "nng+ipc": f"nng+ipc://{sockdir}/nng.sock",
        "nng+tls+tcp": "nng+tls+tcp://127.0.0.1:0",
        "sim": "sim://h0/",
    }[kind]


class Recorder:
    """A sink that records frames and losses and can echo."""

    #: Seconds :meth:`wait_for` waits.
    timeout = 10.0

    def __init__(self, echo: bool = False, explode_on: bytes | None = None) -> None:
        self.frames: list[bytes] = []
        self.lost: list[BaseException | None] = []
        self.echo = echo
        self.explode_on = explode_on
        self.changed = trio.Event()

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        data = bytes(frame)
        if self.explode_on is not None and data == self.explode_on:
            raise ValueError("sink refuses this frame")
        self.frames.append(data)
        if self.echo:
            conn.send_nowait(data)
        self._poke()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        self.lost.append(exc)
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, pred: Any) -> None:
        with trio.fail_after(self.timeout):
            while not pred():
                await self.changed.wait()


@pytest.fixture
async def transport() -> AsyncIterator[MultiTransport]:
    async with open_transport(SECRET) as t, trio.open_nursery() as nursery:
        sim = SimNetwork(random.Random(0)).transport("h0", nursery)
        yield MultiTransport([t, sim])
        nursery.cancel_scope.cancel()


class Server:
    def __init__(self) -> None:
        self.sinks: list[Recorder] = []
        self.accepted = trio.Event()

    def __call__(self, conn: Connection) -> Recorder:
        r = Recorder(echo=True, explode_on=b"explode")
        self.sinks.append(r)
        self.accepted.set()
        return r


@pytest.mark.parametrize("kind", BACKENDS)
async def test_frames_arrive_whole_and_in_order(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    client = Recorder()
    conn = await transport.connect(listener.address, client)
    sizes = [0, 1, 5, 1000, 70_000, 3 << 20, *range(100)]
    sent = [os.urandom(n) for n in sizes]
    for frame in sent:
        conn.send_nowait(frame)
    await client.wait_for(lambda: len(client.frames) == len(sent))
    assert client.frames == sent
    listener.close()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_big_and_small_frames_in_flight_keep_order(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    """Big frames around the unix sockets' shared-memory lane threshold (and, on unix, more
    than its ring holds at once: the rest go over the socket), interleaved with small ones,
    all sent before any arrives."""
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    client = Recorder()
    conn = await transport.connect(listener.address, client)
    big = [LANE_MIN - 1, LANE_MIN, LANE_MIN + 1, 1 << 20, 3 << 20]
    sent = [
        i.to_bytes(4, "little") + os.urandom(big[i % 5] if i % 2 else i)
        for i in range(40)
    ]
    for frame in sent:
        conn.send_nowait(frame)
    await client.wait_for(lambda: len(client.frames) == len(sent))
    assert client.frames == sent


@pytest.mark.parametrize("kind", BACKENDS)
async def test_send_from_other_threads_keeps_order(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    client = Recorder()
    conn = await transport.connect(listener.address, client)

    def blast() -> None:
        for i in range(2000):
            conn.send_nowait(i.to_bytes(4, "little") * (1 + i % 50))

    await trio.to_thread.run_sync(blast)
    await client.wait_for(lambda: len(client.frames) == 2000)
    assert [int.from_bytes(f[:4], "little") for f in client.frames] == list(range(2000))


@pytest.mark.parametrize("kind", BACKENDS)
async def test_close_is_reported_to_the_peer(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    client = Recorder()
    conn = await transport.connect(listener.address, client)
    conn.send_nowait(b"hello")
    await client.wait_for(lambda: client.frames == [b"hello"])
    conn.close()
    assert conn.closed
    await server.sinks[0].wait_for(lambda: server.sinks[0].lost)
    assert client.lost == [None]
    with pytest.raises((ConnectionBroken, Exception)):
        conn.send_nowait(b"after close")


@pytest.mark.parametrize("kind", BACKENDS)
async def test_sink_error_closes_only_that_connection(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    bad, good = Recorder(), Recorder()
    bad_conn = await transport.connect(listener.address, bad)
    good_conn = await transport.connect(listener.address, good)
    bad_conn.send_nowait(b"explode")
    await bad.wait_for(lambda: bad.lost)
    good_conn.send_nowait(b"still here")
    await good.wait_for(lambda: good.frames == [b"still here"])


@pytest.mark.parametrize("kind", AUTHENTICATED)
async def test_wrong_secret_is_refused_and_server_keeps_serving(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    async with open_transport(b"w" * 32) as impostor:
        with pytest.raises(AuthenticationError, match="secret"):
            with trio.fail_after(10):
                c = await impostor.connect(listener.address, Recorder())
                # Message-based backends may only learn of the refusal on first use.
                c.send_nowait(b"payload from an impostor")
                await trio.sleep(0.5)
                raise AuthenticationError("not refused: job secret was not checked")
    assert server.sinks == [] or all(s.frames == [] for s in server.sinks)
    client = Recorder()
    conn = await transport.connect(listener.address, client)
    conn.send_nowait(b"ok")
    await client.wait_for(lambda: client.frames == [b"ok"])


@pytest.mark.slow
async def test_a_peer_of_another_wire_version_is_refused_by_name(
    transport: MultiTransport, sockdir: str
) -> None:
    """A process whose wire version differs (an older `regency worker`, say) is refused in the
    handshake with both versions named, on every authenticated backend, at once (no retry can
    help); a peer of our own version still connects after it."""
    older = _auth.WIRE_VERSION - 1
    addresses = [address_for(kind, sockdir).replace("listener.sock", "old.sock")
                 .replace("nng.sock", "old-nng.sock") for kind in AUTHENTICATED]
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, "-m", "tests.transports.other_version", str(older), *addresses],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
        )
        assert proc.stdout is not None and proc.stdin is not None
        bound: list[str] = []
        buffered = b""
        with trio.fail_after(60):
            while len(bound) < len(addresses):
                buffered += await proc.stdout.receive_some()
                *lines, rest = buffered.split(b"\n")
                bound += [line.decode() for line in lines]
                buffered = rest
        for address in bound:
            with trio.fail_after(10):
                with pytest.raises(IncompatiblePeer) as caught:
                    await transport.connect(address, Recorder())
            message = str(caught.value)
            assert address in message
            assert f"wire version {older}" in message
            assert f"version {_auth.WIRE_VERSION}" in message
        await proc.stdin.aclose()
    server = Server()
    listener = await transport.listen(address_for("unix", sockdir), server)
    client = Recorder()
    conn = await transport.connect(listener.address, client)
    conn.send_nowait(b"ok")
    await client.wait_for(lambda: client.frames == [b"ok"])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kind", STREAM)
async def test_a_dial_that_fails_or_is_cancelled_in_the_handshake_leaves_no_socket_open(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    """A peer that accepts and never greets (the dial is cancelled), and one that accepts and
    hangs up: each failed dial closes its socket then, not when the garbage collector finds it."""
    if kind == "tcp":
        mute = socket.create_server(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{mute.getsockname()[1]}"
    else:
        mute = socket.socket(socket.AF_UNIX)
        mute.bind(f"{sockdir}/mute.sock")
        mute.listen()
        address = f"unix://{sockdir}/mute.sock"
    with mute:
        before = _open_fds()
        for _ in range(3):
            with trio.move_on_after(0.05) as attempt:
                await transport.connect(address, Recorder())
            assert attempt.cancelled_caught
        accepted = [mute.accept()[0] for _ in range(3)]
        for peer in accepted:
            peer.close()
        assert _open_fds() == before

        async def hang_up() -> None:
            peer, _ = await trio.to_thread.run_sync(mute.accept)
            peer.close()

        for _ in range(2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hang_up)
                with pytest.raises(ConnectionBroken, match="cannot connect to"):
                    await transport.connect(address, Recorder())
        assert _open_fds() == before


def _raw_connect(address: str) -> socket.socket:
    scheme, rest = address.split("://", 1)
    if scheme == "tcp":
        host, port = rest.rsplit(":", 1)
        return socket.create_connection((host, int(port)))
    s = socket.socket(socket.AF_UNIX)
    s.connect(rest)
    return s


@pytest.mark.parametrize("kind", STREAM)
@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\n\r\n" * 10,
        _auth.PREFIX + b"\x00" * 64,
        _auth.MAGIC + bytes((_auth.WIRE_VERSION + 1,)) + b"\x00" * 64,
        b"\xff" * 4096,
    ],
    ids=["http", "bad-proof", "other-version", "noise"],
)
async def test_garbage_before_handshake_unpickles_nothing(
    kind: str, garbage: bytes, transport: MultiTransport, sockdir: str
) -> None:
    server = Server()
    listener = await transport.listen(address_for(kind, sockdir), server)
    raw = await trio.to_thread.run_sync(_raw_connect, listener.address)
    with raw:
        raw.sendall(garbage)
        raw.settimeout(5)
        # The server greets, then drops us once the proof is wrong.
        with pytest.raises(ConnectionResetError):
            while await trio.to_thread.run_sync(raw.recv, 4096):
                pass
            raise ConnectionResetError("closed cleanly")
    assert server.sinks == []
    client = Recorder()
    conn = await transport.connect(listener.address, client)
    conn.send_nowait(b"ok")
    await client.wait_for(lambda: client.frames == [b"ok"])


@pytest.mark.parametrize("kind", STREAM)
async def test_truncated_and_oversized_frames_close_one_connection(
    kind: str, sockdir: str
) -> None:
    async with open_transport(SECRET, max_frame_bytes=1 << 20) as transport:
        server = Server()
        listener = await transport.listen(address_for(kind, sockdir), server)
        # Truncated: header promises 100 bytes, 10 arrive, then the peer goes.
        trunc = Recorder()
        conn = await transport.connect(listener.address, trunc)
        await server.accepted.wait()
        sock = conn._sock  # type: ignore[attr-defined]
        sock.send((100).to_bytes(4, "little") + b"x" * 10)
        conn.close()
        await server.sinks[0].wait_for(lambda: server.sinks[0].lost)
        assert server.sinks[0].frames == []
        # Oversized: header claims more than max_frame_bytes. On tcp, where frames travel as
        # sealed records (transports/_protect.py), a real oversized frame is refused as its
        # records arrive.
        big = Recorder()
        conn2 = await transport.connect(listener.address, big)
        if kind == "tcp":
            conn2.send_nowait(b"x" * (2 << 20))
        else:
            conn2._sock.send((2 << 20).to_bytes(4, "little"))  # type: ignore[attr-defined]
        await big.wait_for(lambda: big.lost)
        assert server.sinks[1].frames == []
        assert "exceeds max_frame_bytes" in str(server.sinks[1].lost[0])
        ok = Recorder()
        conn3 = await transport.connect(listener.address, ok)
        conn3.send_nowait(b"fine")
        await ok.wait_for(lambda: ok.frames == [b"fine"])


async def test_unix_socket_refuses_shared_directory(transport: MultiTransport) -> None:
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        with pytest.raises(PermissionError, match="only this user can open"):
            await transport.listen(f"unix://{d}/x.sock", Server())


async def test_unknown_scheme(transport: MultiTransport) -> None:
    with pytest.raises(ValueError, match=r"address scheme must be one of .* \(got 'carrier://x'\)"):
        await transport.connect("carrier://x", Recorder())


#: Whether a refused dial is final at each backend's addresses: on a local path the proc
#: is gone; on a network address something in between may be restarting.
REFUSAL_IS_FINAL = {
    "tcp": False, "unix": True, "inproc": True, "nng+tcp": False, "nng+ipc": True,
    "nng+tls+tcp": False, "sim": True,  # sim://h0/ seen from h0: the same host
}  # fmt: skip


@pytest.mark.parametrize("kind", BACKENDS)
async def test_each_backend_says_whether_a_refusal_is_final(
    kind: str, transport: MultiTransport, sockdir: str
) -> None:
    listener = await transport.listen(address_for(kind, sockdir), Server())
    assert transport.refusal_is_final(listener.address) is REFUSAL_IS_FINAL[kind]
    listener.close()
