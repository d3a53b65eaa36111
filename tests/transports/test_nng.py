"""What the nng backend adds to the conformance suite: its flow control, TLS settings, refusals."""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import threading
from collections.abc import Iterator

import pynng
import pytest
import trio
import trustme

from regency.transports import (
    AuthenticationError,
    Connection,
    ConnectionBroken,
    open_transport,
)
from regency.transports._nng import TlsSettings

from .test_conformance import SECRET, Recorder, Server

NNG = ["nng+tcp", "nng+ipc", "nng+tls+tcp"]


@pytest.fixture
def sockdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="regency-test-") as d:
        os.chmod(d, 0o700)
        yield d


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
            ValueError,
            match=r"dialing nng\+tls\+tcp needs TlsSettings.ca_file .* or set REGENCY_TLS_CA",
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
