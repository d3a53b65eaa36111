"""The frame transport interface.

A transport moves whole frames (byte strings) between two endpoints and reports when a
connection is lost. It knows nothing of actors, messages or pickling: the layer above hands it
bytes and gets bytes back. Every backend (trio sockets, nng, in-process, the simulator) passes the
same conformance suite in ``tests/transports/``.

Threading contract: :meth:`Connection.send_nowait` may be called from any thread and never
blocks; everything else runs on the trio thread that opened the transport. Received frames are
delivered by calling :meth:`FrameSink.frame_received` on that trio thread, in the order the peer
sent them; on a connection a thread can read (:class:`ThreadReadable`), a thread that took it
over hands them to :meth:`ThreadSink.frame_on_thread` instead, still in order.
"""

from __future__ import annotations

import abc
import logging
from typing import Protocol, cast

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


class ThreadSink(FrameSink, Protocol):
    """A sink that also takes frames a thread read (:class:`ThreadReadable`)."""

    def frame_on_thread(self, conn: Connection, frame: memoryview) -> bool:
        """On the thread that leads ``conn``: take ``frame`` (True) or leave it to the loop
        (False: the thread stops reading, and this frame and all after it reach
        :meth:`frame_received` on the loop, in order). Called for each whole frame in the
        order the peer sent them, never for one the loop handles too.

        ``frame`` is only valid during the call. An exception means the frame was not taken
        (it stays for the loop) and goes up to the thread.
        """
        ...


class Connection(abc.ABC):
    """One established, authenticated, bidirectional frame connection."""

    #: Human-readable description of the peer, for logs and errors.
    peer: str

    #: Whether a thread may read this connection itself (it implements
    #: :class:`ThreadReadable`; see :func:`thread_readable`). A class or instance attribute:
    #: a backend may offer it on some connections only (sockets: not on sealed TCP).
    readable_by_threads: bool = False

    @abc.abstractmethod
    def send_nowait(self, frame: Frame, answer: bool = False) -> None:
        """Queue ``frame`` for delivery, in order. Thread-safe, never blocks.

        ``answer``: the frame answers a message the calling thread waited for (a reply to a
        call, read by ``Future.get`` or an actor thread's wait for its next call): it goes
        out at once rather than being coalesced with frames sent just before or after it
        (a backend that coalesces bursts, as sockets do, would otherwise delay a reply of a
        fast round trip). Backends that do not coalesce ignore it.

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


class ThreadReadable(Protocol):
    """A connection a thread can read itself, taking turns with the loop's reader task.

    A thread that waits for a reply (core/_leader.py) may *lead* a connection whose reader
    task is idle: the loop stops watching it, the thread waits until it is readable (polling
    :meth:`fileno`, or what its environment gives it) and reads (:meth:`read_led`), handing
    each whole frame to the sink's :meth:`ThreadSink.frame_on_thread`; then it gives the
    connection back (:meth:`give_back`) or sets it aside to lead it again soon
    (:meth:`hold`), which the loop ends with :meth:`reclaim`. Who reads is the connection's
    *baton* (``transports/_baton.py``: its states, events and transitions as data).

    Guarantees, whatever the interleaving of threads and the loop:

    * The frames of one connection are handled in the order the peer sent them, each exactly
      once, by exactly one reader at a time: no frame is lost, duplicated or reordered when
      the baton moves.
    * A frame the sink leaves to the loop (``frame_on_thread`` returned False or raised), a
      frame too big for the thread to read, end of stream or an error hands the connection
      back to the loop with that frame and everything after it unread; the loop handles
      them in order, and only the loop reports the connection's loss to the sink.
    * Bytes a thread read but did not hand to the sink (a partial frame) are the loop's
      once the connection goes back: the loop is woken for them, without waiting for more
      data. Given back with nothing unread, the loop is not woken until data comes.
    * While a thread leads or holds the connection, the loop does not read it; once given
      back or reclaimed, the loop reads it again without any further call.

    Threads: :meth:`lead` from any thread but the loop's. :meth:`read_led`, :meth:`hold` and
    :meth:`give_back` only from the thread whose :meth:`lead` returned True, until it gave
    the connection back (or :meth:`read_led` returned False, which gave it back); after
    :meth:`hold` that thread no longer leads it. :meth:`reclaim` from any thread. None of
    them blocks for long (they take the connection's read lock, held only around reads).
    """

    #: Always True on a connection that is one (see :func:`thread_readable`).
    readable_by_threads: bool

    @property
    def closed(self) -> bool: ...

    def lead(self) -> bool:
        """Take over reading from the loop. True: the calling thread now leads the
        connection (the loop reads nothing until it is given back or held). False, having
        changed nothing, when it cannot: the loop is reading it, another thread leads it,
        it is closed, or the backend cannot silence the loop now (writes queued on the same
        descriptor). A connection set aside (:meth:`hold`) is led again at no cost."""
        ...

    def read_led(self) -> bool:
        """On the leading thread, once the connection is readable: read what is there and
        hand each whole frame to the sink's ``frame_on_thread``, in order. True: the thread
        still leads it (a partial frame may wait in the buffer for more bytes). False: the
        connection went back to the loop (a frame left to the loop, a frame too big, end of
        stream, an error, the connection closed, or the loop woke meanwhile and waits for
        it); the thread must not call :meth:`hold` or :meth:`give_back` for it any more
        (they would do nothing)."""
        ...

    def hold(self) -> None:
        """On the leading thread: stop reading for now, leaving the loop silenced (no
        syscall now, none when a thread leads it again); any thread may :meth:`lead` it.
        Given back instead (as :meth:`give_back`) when bytes are left unread, the loop woke
        meanwhile, or it is closed. Whoever set it aside must see that the loop gets it
        back (:meth:`reclaim`) if no thread comes for it: until then frames on it wait."""
        ...

    def reclaim(self) -> bool:
        """The loop takes back a connection set aside by :meth:`hold` (from any thread):
        its interest re-armed, or the loop woken when it has something to handle. False,
        changing nothing, when it was not set aside (the loop has it, or a thread leads
        it)."""
        ...

    def give_back(self) -> None:
        """On the leading thread (or on a connection set aside): the loop reads again. Bytes
        left unread wake it at once; else it wakes when data comes."""
        ...

    def fileno(self) -> int:
        """The descriptor to poll for readability while leading (stable for the
        connection's life; a closed connection's may be reused: poll only while leading)."""
        ...


def thread_readable(conn: Connection) -> ThreadReadable | None:
    """``conn`` as a :class:`ThreadReadable` when a thread may read it, else None (its
    frames reach only ``frame_received``, on the loop)."""
    return cast(ThreadReadable, conn) if conn.readable_by_threads else None


class Listener(abc.ABC):
    """A bound address accepting connections."""

    #: The address peers dial, with any ephemeral port filled in.
    address: str

    @abc.abstractmethod
    def close(self) -> None:
        """Stop accepting. Established connections stay open."""


class SinkFactory(Protocol):
    def __call__(self, conn: Connection) -> FrameSink: ...


#: Address prefixes of nng's network schemes (``nng+ipc`` is a path on this host).
NNG_NETWORK = ("nng+tcp://", "nng+tls+tcp://")


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

    def refusal_is_final(self, address: str) -> bool:
        """Whether a refused dial to ``address`` means nothing will listen there again (a
        local socket's path: its proc is gone), or may pass (a network address: a relay,
        proxy or load balancer in between may be restarting, and a dialer keeps trying for
        ``reconnect_refused_s``). Final unless a transport says otherwise."""
        return True

    @abc.abstractmethod
    async def connect(self, address: str, sink: FrameSink) -> Connection:
        """Dial ``address``, authenticate, and return the connection.

        Raises :class:`ConnectionBroken` (or its subclass :class:`AuthenticationError`) with the
        address in the message when that fails.
        """
