"""TCP port forwarding through a mesh (Monarch's ``monarch.job.PortForwarder``).

``PortForwarder.forward(dst_procs, dst_port, src_procs, src_address)`` pairs the procs of two
meshes of one shape point by point: each source proc listens on ``src_address`` and relays
every connection it accepts, through actor ports, to ``127.0.0.1:dst_port`` on the
destination proc at the same coordinates. Both directions carry data, a half-close (EOF) and
a reset (an abrupt close on one end is an abrupt close on the other). Stopping the forwarder
stops the relay actors it spawned, which close their listeners and connections.

Each side of a connection runs the same relay: socket to port, port to socket. Data sent
into a port is buffered by the receiving side, as in Monarch: a slow destination makes the
destination-side relay hold the bytes, not the sender wait.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Callable
from contextlib import suppress
from typing import Any, NamedTuple

import trio

from ..core._channel import Channel, Port, PortReceiver
from ..core._context import current_rank
from ..core._endpoint import Actor, endpoint
from ..core._proc_mesh import ProcMesh
from ..core._shape import Point
from ._background import Background

_HOST = "127.0.0.1"
_CHUNK = 64 * 1024

PortSpec = int | Callable[[Point], int]
AddressSpec = str | Callable[[Point], str]


class _Chunk(NamedTuple):
    data: bytes


class _Eof(NamedTuple):
    """The sending end will write no more (a half-close)."""


class _Reset(NamedTuple):
    """The sending end's connection broke or was aborted: abort this one too."""


_Piece = _Chunk | _Eof | _Reset


def _check_port(what: str, port: object) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{what} must be an int from 1 to 65535 (got {port!r})")
    return port


def _parse_address(address: object) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) to ``(host, port)``."""
    if not isinstance(address, str):
        raise ValueError(f"src_address must be a 'host:port' string (got {address!r})")
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        raise ValueError(f"src_address must be a 'host:port' string (got {address!r})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"src_address must end in a port number (got {address!r})") from None
    return host, _check_port("the port of src_address", number)


def _at(spec: Any, point: Point) -> Any:
    return spec(point) if callable(spec) else spec


def _abort(stream: trio.SocketStream) -> None:
    """Close with a reset (RST), so the other end sees an abrupt close, not an EOF."""
    with suppress(OSError):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


def _send_quietly(port: Port[_Piece], piece: _Piece) -> None:
    with suppress(Exception):  # the other side may be gone already; that is what we report
        port.send(piece)


class _Relay:
    """One forwarded connection on one side: ``stream`` to ``out``, ``inbox`` to ``stream``.

    Ends gracefully once both directions saw EOF; on a reset from either the socket or the
    other side (or on cancellation), aborts the socket and tells the other side to abort.
    A reset may follow an EOF (the other end half-closed, then broke), so the inbox is read
    until both directions are done."""

    def __init__(
        self, stream: trio.SocketStream, out: Port[_Piece], inbox: PortReceiver[_Piece]
    ) -> None:
        self.stream = stream
        self.out = out
        self.inbox = inbox
        self.sent_eof = False  # our socket's EOF went to the other side
        self.got_eof = False  # the other side's EOF was written to our socket
        self.broken = False  # our socket broke: reset the other side
        self.reset_by_peer = False  # the other side reset: abort our socket only

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                nursery.start_soon(self._socket_to_port)
                nursery.start_soon(self._port_to_socket)
        except BaseException:
            self.broken = True
            raise
        finally:
            if self.broken or self.reset_by_peer:
                if not self.reset_by_peer:
                    _send_quietly(self.out, _Reset())
                _abort(self.stream)
            else:
                with trio.CancelScope(shield=True), suppress(trio.BrokenResourceError):
                    await self.stream.aclose()

    def _done_if_both_eof(self) -> None:
        if self.sent_eof and self.got_eof:
            self._scope.cancel()

    async def _socket_to_port(self) -> None:
        try:
            while data := await self.stream.receive_some(_CHUNK):
                self.out.send(_Chunk(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True
            self._scope.cancel()
            return
        self.out.send(_Eof())
        self.sent_eof = True
        self._done_if_both_eof()

    async def _port_to_socket(self) -> None:
        while True:
            piece: _Piece = await self.inbox.recv()
            if isinstance(piece, _Chunk) and not self.got_eof:
                try:
                    await self.stream.send_all(piece.data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.broken = True
                    self._scope.cancel()
                    return
            elif isinstance(piece, _Eof):
                self.got_eof = True
                with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.stream.send_eof()
                self._done_if_both_eof()
            elif isinstance(piece, _Reset):
                self.reset_by_peer = True
                self._scope.cancel()
                return


class _ForwardExit(Actor):
    """Destination side: connects to the local service for each forwarded connection."""

    def __init__(self) -> None:
        self._port: int | None = None
        self._tasks = Background()

    @endpoint
    async def configure(self, dst_port: PortSpec) -> None:
        self._port = _check_port("dst_port", _at(dst_port, current_rank()))

    @endpoint
    async def open(self, to_entry: Port[_Piece]) -> Port[_Piece]:
        """Connect to the service; the port the source side sends this connection's data to."""
        if self._port is None:
            raise RuntimeError("this forward's destination port was never configured")
        stream = await trio.open_tcp_stream(_HOST, self._port)
        to_exit, inbox = Channel[_Piece].open()
        try:
            await self._tasks.start_soon(_Relay(stream, to_entry, inbox).run)
        except BaseException:
            _abort(stream)
            raise
        return to_exit

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await self._tasks.aclose()


class _ForwardEntry(Actor):
    """Source side: listens, and relays each accepted connection to its destination proc."""

    def __init__(self) -> None:
        self._tasks = Background()

    @endpoint
    async def start(self, exits: _ForwardExit, src_address: AddressSpec) -> None:
        point = current_rank()
        host, port = _parse_address(_at(src_address, point))
        coords = dict(point)
        exit_here = exits.slice(**coords) if coords else exits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Several source procs of one host may share one address (the kernel spreads
            # the connections over them), as Monarch's do.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            await sock.bind((host, port))
            sock.listen()
        except BaseException:
            sock.close()
            raise
        await self._tasks.start_soon(self._serve, trio.SocketListener(sock), exit_here)

    async def _serve(self, listener: trio.SocketListener, exit_here: Any) -> None:
        async with listener, trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._connect, stream, exit_here)

    async def _connect(self, stream: trio.SocketStream, exit_here: Any) -> None:
        to_entry, inbox = Channel[_Piece].open()
        try:
            to_exit = await exit_here.open.call_one(to_entry)
        except BaseException:
            _abort(stream)
            raise
        await _Relay(stream, to_exit, inbox).run()

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await self._tasks.aclose()


class PortForwarder(Actor):
    """Owns TCP port forwards between proc meshes. Spawn it on the local proc
    (``this_proc().spawn("fwd", PortForwarder)``), call :meth:`forward` once per forward,
    and stop it to close every forward it made."""

    @endpoint
    async def forward(
        self,
        dst_proc_mesh: ProcMesh,
        dst_port: PortSpec,
        src_proc_mesh: ProcMesh,
        src_address: AddressSpec,
    ) -> None:
        """Forward ``src_address`` (``"host:port"``, on each proc of ``src_proc_mesh``) to
        ``127.0.0.1:dst_port`` on the proc of ``dst_proc_mesh`` at the same coordinates.
        ``dst_port`` and ``src_address`` may be functions of the point. The two meshes must
        have the same shape. Returns once every source proc listens; raises (nothing left
        running) if any side could not be set up."""
        if dst_proc_mesh.extent != src_proc_mesh.extent:
            raise ValueError(
                "the destination and source proc meshes must have the same shape "
                f"(got {dst_proc_mesh.extent} and {src_proc_mesh.extent})"
            )
        if not callable(dst_port):
            _check_port("dst_port", dst_port)
        if not callable(src_address):
            _parse_address(src_address)
        tag = uuid.uuid4().hex[:12]
        exits: Any = None
        entries: Any = None
        try:
            exits = dst_proc_mesh.spawn(f"port_forward_exit_{tag}", _ForwardExit)
            await exits.configure.call(dst_port)
            entries = src_proc_mesh.spawn(f"port_forward_entry_{tag}", _ForwardEntry)
            await entries.start.call(exits, src_address)
        except BaseException:
            with trio.CancelScope(shield=True):
                for mesh in (entries, exits):
                    if mesh is not None:
                        with suppress(Exception):
                            await mesh.stop()
            raise
