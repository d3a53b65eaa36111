"""What the nng backend adds to the conformance suite: its flow control, TLS settings, refusals."""

from __future__ import annotations

import functools
import logging
import os
import re
import select
import socket
import struct
import tempfile
import threading

import pynng
import pytest
import trio
import trustme

from regency.transports import (
    AuthenticationError,
    Connection,
    ConnectionBroken,
    _nng,
    open_transport,
)
from regency.transports._nng import TlsSettings

from .test_conformance import SECRET, Recorder, Server

NNG = ["nng+tcp", "nng+ipc", "nng+tls+tcp"]


def address_for(kind: str, sockdir: str) -> str:
    if kind == "nng+ipc":
        return f"nng+ipc://{sockdir}/nng.sock"
    return f"{kind}://127.0.0.1:0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Flood(Recorder):
    """Answers the first frame with ``count`` frames, all sent at once from the listener."""

    def __init__(self, frames: list[bytes]) -> None:
        super().__init__()
        self.to_send = frames

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        for f in self.to_send:
            conn.send_nowait(f)
        self.to_send = []


@pytest.mark.parametrize("kind", ["nng+tcp", "nng+tls+tcp"])
async def test_listen_reports_the_bound_port(kind: str) -> None:
    async with open_transport(SECRET) as transport:
        listener = await transport.listen(f"{kind}://127.0.0.1:0", Server())
        host, port = listener.address.removeprefix(f"{kind}://").rsplit(":", 1)
        assert host == "127.0.0.1"
        assert int(port) > 0


@pytest.mark.parametrize("kind", NNG)
async def test_listener_flood_is_not_dropped(kind: str, sockdir: str) -> None:
    # A polyamorous nng socket drops what a pipe cannot take at once; the window must stop that.
    frames = [os.urandom(i % 3000) for i in range(5000)]
    frames[1000:1000] = [os.urandom(300_000), os.urandom(1 << 20)]
    flood = Flood(frames)
    async with open_transport(SECRET) as transport:
        listener = await transport.listen(address_for(kind, sockdir), lambda conn: flood)
        client = Recorder()
        conn = await transport.connect(listener.address, client)
        conn.send_nowait(b"go")
        await client.wait_for(lambda: len(client.frames) == len(frames))
        assert client.frames == frames


async def test_list_frames_arrive_joined() -> None:
    async with open_transport(SECRET) as transport:
        server = Server()
        listener = await transport.listen("nng+tcp://127.0.0.1:0", server)
        client = Recorder()
        conn = await transport.connect(listener.address, client)
        conn.send_nowait([b"ab", memoryview(b"cd"), b""])
        await client.wait_for(lambda: client.frames == [b"abcd"])


async def test_oversized_frame_is_refused_by_the_sender() -> None:
    async with open_transport(SECRET, max_frame_bytes=1024) as transport:
        listener = await transport.listen("nng+tcp://127.0.0.1:0", Server())
        conn = await transport.connect(listener.address, Recorder())
        with pytest.raises(ValueError, match=r"frame of 2000 bytes exceeds max_frame_bytes=1024"):
            conn.send_nowait(b"x" * 2000)


@pytest.mark.parametrize(
    "address",
    ["nng+tcp://127.0.0.1:{port}", "nng+ipc://{sockdir}/nobody.sock"],
    ids=["tcp", "ipc"],
)
async def test_connecting_to_nothing_is_broken_quickly(address: str, sockdir: str) -> None:
    address = address.format(port=free_port(), sockdir=sockdir)
    async with open_transport(SECRET) as transport:
        with trio.fail_after(5):
            with pytest.raises(ConnectionBroken, match=re.escape(f"cannot connect to {address}: ")):
                await transport.connect(address, Recorder())


async def test_unauthenticated_nng_peer_is_refused_and_listener_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_transport(SECRET) as transport:
        server = Server()
        listener = await transport.listen("nng+tcp://127.0.0.1:0", server)
        url = listener.address.removeprefix("nng+")
        gone = threading.Event()

        def intrude() -> bool:
            # A receive buffer keeps the pipe reading, so it sees the close after the greeting.
            with pynng.Pair1(send_timeout=2000, recv_buffer_size=8) as raw:
                raw.add_post_pipe_remove_cb(lambda pipe: gone.set())
                raw.dial(url, block=True)
                raw.send(b"\x00" * 4 + b"payload from nowhere")
                return gone.wait(5)

        with caplog.at_level(logging.WARNING, "regency.transports"):
            assert await trio.to_thread.run_sync(intrude)
        assert server.sinks == []
        assert "refused connection from nng+tcp://127.0.0.1:" in caplog.text
        client = Recorder()
        conn = await transport.connect(listener.address, client)
        conn.send_nowait(b"ok")
        await client.wait_for(lambda: client.frames == [b"ok"])


@pytest.mark.parametrize("kind", NNG)
async def test_closed_listener_keeps_connections_and_refuses_new_ones(
    kind: str, sockdir: str
) -> None:
    async with open_transport(SECRET) as transport:
        listener = await transport.listen(address_for(kind, sockdir), Server())
        client = Recorder()
        conn = await transport.connect(listener.address, client)
        listener.close()
        conn.send_nowait(b"still")
        await client.wait_for(lambda: client.frames == [b"still"])
        with trio.fail_after(5), pytest.raises(ConnectionBroken):
            await transport.connect(listener.address, Recorder())


async def test_closing_the_transport_closes_nng_sockets() -> None:
    async with open_transport(SECRET) as transport:
        listener = await transport.listen("nng+tcp://127.0.0.1:0", Server())
    with pynng.Pair1() as raw, pytest.raises(pynng.ConnectionRefused):
        raw.dial(listener.address.removeprefix("nng+"), block=True)


def _tls_server_that_negotiates_and_leaves(ready: list[int], rounds: int) -> None:
    """A raw TLS listener that completes nng's protocol negotiation as a Pair1 peer, then
    closes at once: its last data and its close reach the dialer together, which nng 1.11's
    TLS transport can lose (no removal event for the pipe ever comes)."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.environ["REGENCY_TLS_CERT"], os.environ["REGENCY_TLS_KEY"])
    pair1_header = b"\x00SP\x00\x00\x11\x00\x00"
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        ready.append(server.getsockname()[1])
        for _ in range(rounds):
            raw, _ = server.accept()
            raw.settimeout(10)
            with context.wrap_socket(raw, server_side=True) as tls:
                header = b""
                while len(header) < len(pair1_header):
                    header += tls.recv(len(pair1_header) - len(header))
                tls.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                tls.sendall(pair1_header)


async def test_tls_listener_that_leaves_during_the_handshake_fails_the_dial_quickly() -> None:
    rounds = 3
    ready: list[int] = []
    async with open_transport(SECRET) as transport, trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(
                trio.to_thread.run_sync,
                _tls_server_that_negotiates_and_leaves,
                ready,
                rounds,
                abandon_on_cancel=True,
            )
        )
        while not ready:
            await trio.sleep(0.01)
        address = f"nng+tls+tcp://127.0.0.1:{ready[0]}"
        for _ in range(rounds):
            # Without the handshake's liveness check this waited out the 10 s timeout.
            with trio.fail_after(5), pytest.raises(
                ConnectionBroken, match=r"connection closed during handshake|cannot connect"
            ):
                await transport.connect(address, Recorder())


async def test_tls_peer_that_sends_and_leaves_is_reported_lost() -> None:
    # nng 1.11 loses a TLS peer's close that arrives together with its last data.
    async with open_transport(SECRET) as transport:
        server = Server()
        listener = await transport.listen("nng+tls+tcp://127.0.0.1:0", server)
        for i in range(5):
            client = Recorder()
            conn = await transport.connect(listener.address, client)
            conn.send_nowait(b"bye")
            await client.wait_for(lambda c=client: c.frames == [b"bye"])
            conn.send_nowait(b"last words")
            conn.close()
            sink = server.sinks[i]
            await sink.wait_for(lambda s=sink: s.lost)


async def test_tls_without_settings_names_them() -> None:
    async with open_transport(SECRET, tls=TlsSettings()) as transport:
        with pytest.raises(
            ValueError,
            match=r"listening on nng\+tls\+tcp needs TlsSettings.cert_file .* "
            r"or set REGENCY_TLS_CERT and REGENCY_TLS_KEY",
        ):
            await transport.listen("nng+tls+tcp://127.0.0.1:0", Server())
        with pytest.raises(
            AuthenticationError,
            match=r"cannot connect to nng\+tls\+tcp://127.0.0.1:1: dialing nng\+tls\+tcp needs "
            r"TlsSettings.ca_file .* or set REGENCY_TLS_CA",
        ):
            await transport.connect("nng+tls+tcp://127.0.0.1:1", Recorder())


async def test_tls_refuses_a_listener_it_cannot_verify(tls_environment: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        other_ca = os.path.join(d, "other-ca.pem")
        trustme.CA().cert_pem.write_to_path(other_ca)
        async with (
            open_transport(SECRET) as server_side,
            open_transport(SECRET, tls=TlsSettings(ca_file=other_ca)) as client_side,
        ):
            listener = await server_side.listen("nng+tls+tcp://127.0.0.1:0", Server())
            with (
                trio.fail_after(5),
                pytest.raises(
                    AuthenticationError,
                    match=re.escape(f"cannot connect to {listener.address}: "),
                ),
            ):
                await client_side.connect(listener.address, Recorder())


def test_tls_settings_from_env() -> None:
    env = {"REGENCY_TLS_CERT": "/c.pem", "REGENCY_TLS_KEY": "/k.pem", "REGENCY_TLS_CA": ""}
    assert TlsSettings.from_env(env) == TlsSettings("/c.pem", "/k.pem", None)


@pytest.mark.parametrize("kind", NNG)
async def test_frames_larger_than_a_message_span_several_both_ways(
    kind: str, sockdir: str
) -> None:
    # No nng message exceeds _BATCH_BYTES (+ headers): larger frames are cut across messages
    # and joined again; sizes around every boundary, as bytes and as lists of parts.
    b = _nng._BATCH_BYTES
    sizes = [b - 8, b - 4, b - 3, b, b + 1, 3 * b + 7, 10, 3 * b // 4, 1, 5 << 20, 0, b // 2]
    sent: list[bytes] = [os.urandom(n) for n in sizes]
    async with open_transport(SECRET) as transport:
        server = Server()  # echoes every frame: listener to dialer too
        listener = await transport.listen(address_for(kind, sockdir), server)
        client = Recorder()
        conn = await transport.connect(listener.address, client)
        for i, frame in enumerate(sent):
            if i % 2:
                conn.send_nowait([frame[: len(frame) // 3], memoryview(frame)[len(frame) // 3 :]])
            else:
                conn.send_nowait(frame)
        await client.wait_for(lambda: len(client.frames) == len(sent))
        assert [len(f) for f in client.frames] == sizes
        assert client.frames == sent
        assert server.sinks[0].frames == sent


LISTENER = """
import sys, trio
from regency.transports import open_transport

class Count:
    frames = 0
    def frame_received(self, conn, frame):
        Count.frames += 1
    def connection_lost(self, conn, exc):
        print("lost:", exc, file=sys.stderr, flush=True)

async def main():
    async with open_transport(sys.argv[1].encode()) as transport:
        listener = await transport.listen("nng+tcp://127.0.0.1:0", lambda c: Count())
        print(listener.address, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _wait_removed(sock: pynng.Socket) -> threading.Event:
    gone = threading.Event()
    sock.add_post_pipe_remove_cb(lambda pipe: gone.set())
    return gone


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
def test_peers_cannot_make_a_listener_buffer_more_than_a_message() -> None:
    import subprocess
    import sys

    from regency.transports import _auth, _protect

    server = subprocess.Popen(
        [sys.executable, "-c", LISTENER, SECRET.decode()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip().removeprefix("nng+")
        before = _peak_rss_mib(server.pid)
        # 1. A peer that never authenticated sends a 256 MiB message: nng refuses it at its
        #    length header (the receive cap), buffering none of it.
        with pynng.Pair1(recv_max_size=0) as raw:
            gone = _wait_removed(raw)
            raw.dial(url, block=True)
            raw.recv()  # the server's greeting
            raw.send(bytes(256 << 20))
            assert gone.wait(30), "the listener kept the pipe that sent 256 MiB unauthenticated"
        grown = _peak_rss_mib(server.pid) - before
        assert grown < 32, f"an unauthenticated 256 MiB message grew the listener by {grown} MiB"
        # 2. An authenticated peer declares a frame of nearly 2 GiB and sends one message of
        #    it: the listener holds what arrived, not what the header claims.
        with pynng.Pair1(recv_max_size=0) as raw:
            gone = _wait_removed(raw)
            raw.dial(url, block=True)
            hello = raw.recv()
            proof, nonce_c = _auth.client_proof(SECRET, hello)
            raw.send(proof)
            nonce_s = hello[len(_auth.PREFIX) :]
            _auth.check_server_proof(SECRET, nonce_c, nonce_s, raw.recv())
            # nng+tcp seals every message with the connection's keys.
            sealer, _ = _protect.keys_for("client", SECRET, nonce_s, nonce_c)
            body = bytes(_nng._BATCH_BYTES - 4)
            raw.send(bytes(sealer.seal(struct.pack("<II", 1, (1 << 31) - 1) + body)))
            raw.send(bytes(sealer.seal(struct.pack("<I", 0) + body)))
            # Acknowledging messages never sent closes the connection: once it is closed, the
            # listener has handled everything before.
            raw.send(bytes(sealer.seal(struct.pack("<I", 5))))
            assert gone.wait(30), "the listener did not close a connection that broke protocol"
        # The sealed messages were opened and taken in: the connection ended on the bad acks.
        assert server.stderr is not None
        assert select.select([server.stderr], [], [], 30)[0], "the listener reported no loss"
        lost = server.stderr.readline()
        assert "acknowledged messages it was never sent" in lost, lost
        grown = _peak_rss_mib(server.pid) - before
        assert grown < 32, f"a 2 GiB frame header grew the listener by {grown} MiB at once"
        assert server.poll() is None
    finally:
        server.kill()
        server.communicate()


class _Relay:
    """An on-path relay for nng+tcp without the job secret: forwards every message both ways
    (so the handshake succeeds) and can add messages of its own toward the listener."""

    def __init__(self, target: str) -> None:
        self.port = free_port()
        self.down = pynng.Pair1(listen=f"tcp://127.0.0.1:{self.port}", recv_max_size=0)
        self.up = pynng.Pair1(dial=target.removeprefix("nng+"), recv_max_size=0)
        for a, b in ((self.down, self.up), (self.up, self.down)):
            threading.Thread(target=self._forward, args=(a, b), daemon=True).start()

    @staticmethod
    def _forward(src: pynng.Socket, dst: pynng.Socket) -> None:
        while True:
            try:
                dst.send(src.recv())
            except pynng.NNGException:
                return

    def close(self) -> None:
        self.down.close()
        self.up.close()


@pytest.mark.parametrize("protect", [True, False], ids=["sealed", "unsealed"])
async def test_a_relay_cannot_inject_a_frame_on_nng_tcp(protect: bool) -> None:
    injected = b"frame the relay made up"
    async with trio.open_nursery() as nursery:
        transport = _nng.NngTransport(nursery, SECRET, 1 << 20, protect_tcp=protect)
        server = Server()
        listener = await transport.listen("nng+tcp://127.0.0.1:0", server)
        relay = _Relay(listener.address)
        try:
            client = Recorder()
            conn = await transport.connect(f"nng+tcp://127.0.0.1:{relay.port}", client)
            conn.send_nowait(b"genuine")
            await client.wait_for(lambda: client.frames == [b"genuine"])
            sink = server.sinks[0]
            # The relay adds a message in the unsealed format after the genuine one.
            relay.up.send(struct.pack("<II", 0, len(injected)) + injected)
            await sink.wait_for(lambda: len(sink.frames) > 1 or sink.lost)
            if protect:
                assert sink.frames == [b"genuine"]
                assert isinstance(sink.lost[0], ConnectionBroken)
                assert re.search(r"record \d+ (failed authentication|declares a body)", str(sink.lost[0])), sink.lost[0]
            else:  # what the sealing is for: unsealed, the made-up frame is delivered
                assert sink.frames == [b"genuine", injected]
        finally:
            relay.close()
        nursery.cancel_scope.cancel()
