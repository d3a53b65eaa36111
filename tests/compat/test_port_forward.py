"""``regency.job.PortForwarder`` as a Monarch program uses it: real procs, real TCP."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from regency.actor import ActorError, ProcMesh, this_host, this_proc
from regency.job import PortForwarder

T = 30
HOST = "127.0.0.1"


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class _Server:
    """A TCP server on a thread: ``echo`` echoes until EOF, ``flood`` writes until the
    connection breaks (then sets ``broken``)."""

    def __init__(self, mode: str) -> None:
        self.sock = socket.create_server((HOST, 0))
        self.port: int = self.sock.getsockname()[1]
        self.mode = mode
        self.connected = threading.Event()
        self.broken = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        self.connected.set()
        with conn:
            try:
                if self.mode == "echo":
                    while data := conn.recv(65536):
                        conn.sendall(data)
                    conn.shutdown(socket.SHUT_WR)
                else:
                    while True:
                        conn.sendall(b"x" * 65536)
            except OSError:
                self.broken.set()

    def close(self) -> None:
        self.sock.close()


def _round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection((HOST, port), timeout=T) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)  # half-close: the echo still comes back
        got = bytearray()
        while chunk := conn.recv(65536):
            got += chunk
        return bytes(got)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"procs": 2})
    try:
        yield mesh
    finally:
        mesh.stop().get(T)


@pytest.mark.slow
def test_forward_round_trip_reset_and_stop(procs: ProcMesh) -> None:
    echo, flood = _Server("echo"), _Server("flood")
    echo_port, flood_port = _free_ports(2)
    forwarder: Any = this_proc().spawn("forwarder", PortForwarder)
    try:
        # Source proc 1 listens; its connections reach the server through proc 0.
        forwarder.forward.call_one(
            procs.slice(procs=0), echo.port, procs.slice(procs=1), f"{HOST}:{echo_port}"
        ).get(T)
        # Per-point ports: both procs listen on one address (SO_REUSEPORT).
        destination = flood.port
        forwarder.forward.call_one(
            procs, lambda point: destination, procs, f"{HOST}:{flood_port}"
        ).get(T)

        payload = bytes(range(256)) * 4096  # 1 MiB, then EOF; the echo and its EOF return
        assert _round_trip(echo_port, payload) == payload
        assert _round_trip(echo_port, b"") == b""

        # An abrupt close (RST) on the source side is an abrupt close at the destination.
        client = socket.create_connection((HOST, flood_port), timeout=T)
        assert flood.connected.wait(T)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        assert flood.broken.wait(T), "the destination never saw the reset"
    finally:
        forwarder.stop().get(T)
        forwarder.stop().get(T)  # idempotent
        echo.close()
        flood.close()
    for port in (echo_port, flood_port):  # stopping the forwarder closed its listeners
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, port), timeout=T).close()


@pytest.mark.slow
def test_forward_refuses_and_cleans_up(procs: ProcMesh) -> None:
    forwarder: Any = this_proc().spawn("forwarder_errors", PortForwarder)
    try:
        with pytest.raises(ActorError, match="must have the same shape"):
            forwarder.forward.call_one(procs, 1234, procs.slice(procs=0), f"{HOST}:1").get(T)
        with pytest.raises(ActorError, match=r"dst_port must be an int from 1 to 65535 \(got 0\)"):
            forwarder.forward.call_one(procs, 0, procs, f"{HOST}:1").get(T)
        with pytest.raises(ActorError, match="src_address must be a 'host:port' string"):
            forwarder.forward.call_one(procs, 1234, procs, "no-port").get(T)

        # Proc 1 cannot listen (its port is taken): nothing of the forward stays up.
        ports = _free_ports(2)
        with (
            socket.create_server((HOST, ports[1])),
            pytest.raises(ActorError, match="Address already in use"),
        ):
            forwarder.forward.call_one(
                procs, 1234, procs, lambda point: f"{HOST}:{ports[point['procs']]}"
            ).get(T)
        with socket.socket() as probe:
            probe.bind((HOST, ports[0]))  # proc 0's listener was closed again
    finally:
        forwarder.stop().get(T)
