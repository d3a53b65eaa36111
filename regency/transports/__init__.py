"""Frame transports: move whole frames between addresses, report connection loss.

Backends, chosen by address scheme:

* ``tcp://HOST:PORT``, ``unix:///PATH`` — trio-native sockets (the default, fastest here)
* ``nng+tcp://``, ``nng+ipc://``, ``nng+tls+tcp://`` — nng through pynng
* ``inproc://NAME`` — in-process, for actors in the controller's process

:func:`open_transport` opens one object that serves every scheme, owning the nursery that
all their tasks live in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from ._base import (
    DEFAULT_MAX_FRAME_BYTES,
    NNG_NETWORK,
    AuthenticationError,
    Connection,
    ConnectionBroken,
    ConnectionClosed,
    ConnectionRefused,
    Frame,
    FrameSink,
    IncompatiblePeer,
    Listener,
    SinkFactory,
    ThreadReadable,
    ThreadSink,
    Transport,
    TransportError,
    frame_size,
    join_frame,
    thread_readable,
)
from ._inproc import InprocTransport
from ._sockets import SocketTransport

if TYPE_CHECKING:
    from ._nng import TlsSettings

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "AuthenticationError",
    "Connection",
    "ConnectionBroken",
    "ConnectionClosed",
    "ConnectionRefused",
    "Frame",
    "FrameSink",
    "IncompatiblePeer",
    "Listener",
    "MultiTransport",
    "SinkFactory",
    "ThreadReadable",
    "ThreadSink",
    "Transport",
    "TransportError",
    "frame_size",
    "join_frame",
    "open_transport",
    "scheme_of",
    "thread_readable",
]


def scheme_of(address: str) -> str:
    scheme, sep, _ = address.partition("://")
    if not sep:
        raise ValueError(f"address must look like SCHEME://... (got {address!r})")
    return scheme


class MultiTransport(Transport):
    """Dispatches on the address scheme to the backend that serves it."""

    def __init__(self, backends: list[Transport]) -> None:
        self._by_scheme: dict[str, Transport] = {}
        for backend in backends:
            for scheme in backend.schemes:
                self._by_scheme[scheme] = backend
        self.schemes = tuple(self._by_scheme)

    def backend(self, address: str) -> Transport:
        scheme = scheme_of(address)
        try:
            return self._by_scheme[scheme]
        except KeyError:
            raise ValueError(
                f"address scheme must be one of {self.schemes} (got {address!r})"
            ) from None

    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        return await self.backend(address).listen(address, sinks)

    async def connect(self, address: str, sink: FrameSink) -> Connection:
        return await self.backend(address).connect(address, sink)

    def refusal_is_final(self, address: str) -> bool:
        return self.backend(address).refusal_is_final(address)


class _LazyNng(Transport):
    """The nng backend, imported on its first use: importing pynng costs 35-100 ms here,
    which every proc and controller paid at start (before its first reply) and which only
    ``nng+...`` addresses need."""

    schemes = ("nng+tcp", "nng+ipc", "nng+tls+tcp")

    def __init__(
        self,
        nursery: trio.Nursery,
        secret: bytes,
        max_frame: int,
        tls: TlsSettings | None,
        protect_tcp: bool,
    ) -> None:
        self._args = (nursery, secret, max_frame, tls, protect_tcp)
        self._backend: Transport | None = None

    def refusal_is_final(self, address: str) -> bool:
        # Without importing pynng: the rule is the backend's (NngTransport's).
        return not address.startswith(NNG_NETWORK)

    def _nng(self) -> Transport:
        if self._backend is None:
            from ._nng import NngTransport

            nursery, secret, max_frame, tls, protect_tcp = self._args
            self._backend = NngTransport(nursery, secret, max_frame, tls, protect_tcp=protect_tcp)
            assert self._backend.schemes == self.schemes
        return self._backend

    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        return await self._nng().listen(address, sinks)

    async def connect(self, address: str, sink: FrameSink) -> Connection:
        return await self._nng().connect(address, sink)


@asynccontextmanager
async def open_transport(
    secret: bytes,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    tls: TlsSettings | None = None,
    protect_tcp: bool = True,
    shm_lane: bool = True,
) -> AsyncIterator[MultiTransport]:
    """Open every backend; closing the context cancels all their connections.

    ``protect_tcp``: seal every frame on ``tcp://`` and ``nng+tcp://`` links with keys from
    the handshake (:mod:`._protect`); both ends of a link must agree. Off only to measure
    its cost.

    ``shm_lane``: offer a shared-memory lane on ``unix://`` connections, through which big
    frames travel instead of the socket (:mod:`._shm`); a connection has it when both ends
    offered it. Off only to measure the difference, or where shared memory is unwelcome.

    ``tls`` holds the certificates for ``nng+tls+tcp``; without it they are read from
    ``REGENCY_TLS_CERT``, ``REGENCY_TLS_KEY`` and ``REGENCY_TLS_CA``.
    """
    if len(secret) < 16:
        raise ValueError(f"job secret must be at least 16 bytes (got {len(secret)})")
    async with trio.open_nursery() as nursery:
        backends: list[Transport] = [
            SocketTransport(
                nursery, secret, max_frame_bytes, protect_tcp=protect_tcp, shm_lane=shm_lane
            ),
            InprocTransport(nursery),
        ]
        backends.append(_LazyNng(nursery, secret, max_frame_bytes, tls, protect_tcp))
        try:
            yield MultiTransport(backends)
        finally:
            nursery.cancel_scope.cancel()
