"""The frame transport interface.

A transport moves whole frames (byte strings) between two endpoints and reports when a
connection is lost. It knows nothing of actors, messages or pickling: the layer above hands it
bytes and gets bytes back. Every backend (trio sockets, nng, in-process, the simulator) passes the
same conformance suite in ``tests/transports/``.

Threading contract: :meth:`Connection.send_nowait` may be called from any thread and never
blocks; everything else runs on the trio thread that opened the transport. Received frames are
delivered by calling :meth:`FrameSink.frame_received` on that trio thread, in the order the peer
sent them.
"""

from __future__ import annotations

import abc
import logging
from typing import Protocol

log = logging.getLogger("regency.transports")

#: Frames larger than this are refused (the connection that sent one is closed). Configurable
#: through ``regency.configure(max_frame_bytes=...)``.
DEFAULT_MAX_FRAME_BYTES = 1 << 31


#: A frame: one buffer, or a list of buffers that together form the frame (sent without
#: joining them where the backend can gather).
Frame = bytes | bytearray | memoryview | list[bytes | memoryview]


def frame_size(frame: Frame) -> int:
    if isinstance(frame, list):
        return sum(memoryview(part).nbytes for part in frame)
    return memoryview(frame).nbytes


def join_frame(frame: Frame) -> bytes | bytearray | memoryview:
    return b"".join(frame) if isinstance(frame, list) else frame


class TransportError(Exception):
    """Base class of transport failures."""


class ConnectionClosed(TransportError):
    """The connection was closed by this side (trio's ``ClosedResourceError`` analogue)."""


class ConnectionBroken(TransportError):
    """Something outside broke the connection: the peer went away or sent bad data."""


class ConnectionRefused(ConnectionBroken):
    """Nothing listens at the address (the process there is gone, or not started yet)."""


class AuthenticationError(ConnectionBroken):
    """The peer failed the challenge-response handshake on the job secret."""


class IncompatiblePeer(ConnectionBroken):
    """The peer is a Regency process of another wire version (``transports._auth``): it
    would misread our frames and we its, so the handshake refuses it. Retrying cannot help."""


class FrameSink(Protocol):
    """Receives what arrives on one connection. Called on the transport's trio thread."""

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        """Handle one whole frame.

        ``frame`` is only valid during the call: copy what must outlive it. Must not block; an
        exception raised here is logged and closes this one connection.
        """

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        """The connection is gone; ``exc`` is None after a local close."""


class Connection(abc.ABC):
    """One established, authenticated, bidirectional frame connection."""

    #: Human-readable description of the peer, for logs and errors.
    peer: str

    @abc.abstractmethod
    def send_nowait(self, frame: Frame) -> None:
        """Queue ``frame`` for delivery, in order. Thread-safe, never blocks.

        Raises :class:`ConnectionClosed` or :class:`ConnectionBroken` when the connection can no
        longer carry frames. The caller must not mutate ``frame`` afterwards.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection (idempotent). The sink's ``connection_lost`` gets ``None``."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once the connection can no longer carry frames."""


class Listener(abc.ABC):
    """A bound address accepting connections."""

    #: The address peers dial, with any ephemeral port filled in.
    address: str

    @abc.abstractmethod
    def close(self) -> None:
        """Stop accepting. Established connections stay open."""


class SinkFactory(Protocol):
    def __call__(self, conn: Connection) -> FrameSink: ...


class Transport(abc.ABC):
    """Opens listeners and connections for one family of address schemes.

    Instances are made by :func:`regency.transports.open_transport`, which owns the nursery
    that every reader and writer task of the transport lives in.
    """

    #: Address schemes this backend serves, e.g. ``("tcp", "unix")``.
    schemes: tuple[str, ...]

    @abc.abstractmethod
    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        """Bind ``address`` and accept connections; each accepted, authenticated connection
        gets its sink from ``sinks``. A port of 0 / an empty path picks a free one."""

    @abc.abstractmethod
    async def connect(self, address: str, sink: FrameSink) -> Connection:
        """Dial ``address``, authenticate, and return the connection.

        Raises :class:`ConnectionBroken` (or its subclass :class:`AuthenticationError`) with the
        address in the message when that fails.
        """
