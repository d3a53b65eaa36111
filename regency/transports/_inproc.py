"""In-process transport (``inproc://NAME``) for actors in the controller's own process.

Frames are handed over as Python objects, never through the kernel. Delivery still goes
through the receiving side's trio loop, one frame at a time and in order, so code above sees
exactly the semantics of a socket. No handshake: a peer in the same process already shares the
job secret and every object in memory.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque

import trio

from ._base import (
    Connection,
    ConnectionBroken,
    ConnectionClosed,
    Frame,
    FrameSink,
    Listener,
    SinkFactory,
    Transport,
    join_frame,
    log,
)

_registry_lock = threading.Lock()
_listeners: dict[str, InprocListener] = {}
_names = itertools.count()


class InprocConnection(Connection):
    #: Frames are handed over as objects to the receiving loop's pump, not through a
    #: descriptor: only the loop reads (a waiting thread of this process waits on its lock).
    readable_by_threads = False

    def __init__(self, peer: str, token: trio.lowlevel.TrioToken) -> None:
        self.peer = peer
        self.sink: FrameSink | None = None
        self.other: InprocConnection | None = None
        self._token = token
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._inbox: deque[bytes | bytearray | memoryview] = deque()
        self._wakeup = trio.Event()
        self._scheduled = False
        self._closed = False
        self._error: BaseException | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def send_nowait(self, frame: Frame, answer: bool = False) -> None:
        other = self.other
        if self._closed or other is None:
            raise ConnectionClosed(f"connection to {self.peer} is closed")
        other._deliver(join_frame(frame))

    def _deliver(self, frame: bytes | bytearray | memoryview) -> None:
        with self._lock:
            if self._closed:
                raise ConnectionBroken(f"connection to {self.peer} is broken: peer closed")
            self._inbox.append(frame)
            if self._scheduled:
                return
            self._scheduled = True
        if threading.get_ident() == self._thread:
            self._wakeup.set()
        else:
            try:
                self._token.run_sync_soon(self._wakeup.set)
            except trio.RunFinishedError:
                pass

    async def pump(self) -> None:
        """Deliver queued frames to the sink, in order, on this side's trio thread."""
        assert self.sink is not None
        try:
            while not self._closed:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                with self._lock:
                    batch = list(self._inbox)
                    self._inbox.clear()
                    self._scheduled = False
                for frame in batch:
                    if self._closed:
                        break
                    self.sink.frame_received(self, memoryview(frame))
                await trio.lowlevel.checkpoint()
        except Exception as exc:
            log.error("closing in-process connection to %s after bad frame: %r", self.peer, exc)
            self._error = exc
            self._shutdown(exc)

    def _shutdown(self, exc: BaseException | None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wakeup.set()
        if self.sink is not None:
            self.sink.connection_lost(self, exc)
        other = self.other
        if other is not None:
            other._peer_gone()

    def _peer_gone(self) -> None:
        def lost() -> None:
            self._shutdown(ConnectionBroken(f"{self.peer} closed the connection"))

        if threading.get_ident() == self._thread:
            lost()
        else:
            try:
                self._token.run_sync_soon(lost)
            except trio.RunFinishedError:
                pass

    def close(self) -> None:
        self._shutdown(None)


class InprocListener(Listener):
    def __init__(self, address: str, transport: InprocTransport, sinks: SinkFactory) -> None:
        self.address = address
        self.transport = transport
        self.sinks = sinks

    def close(self) -> None:
        with _registry_lock:
            if _listeners.get(self.address) is self:
                del _listeners[self.address]


class InprocTransport(Transport):
    schemes = ("inproc",)

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._trio_token = trio.lowlevel.current_trio_token()

    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        if not address.startswith("inproc://"):
            raise ValueError(f"inproc address must look like inproc://NAME (got {address!r})")
        if address == "inproc://":
            address = f"inproc://{next(_names)}"
        listener = InprocListener(address, self, sinks)
        with _registry_lock:
            if address in _listeners:
                raise OSError(f"inproc address already in use: {address}")
            _listeners[address] = listener
        return listener

    async def connect(self, address: str, sink: FrameSink) -> Connection:
        with _registry_lock:
            listener = _listeners.get(address)
        if listener is None:
            raise ConnectionBroken(f"cannot connect to {address}: nothing listens there")
        token = trio.lowlevel.current_trio_token()
        mine = InprocConnection(address, token)
        mine.sink = sink
        server_side = listener.transport
        theirs = InprocConnection("inproc peer", token)
        mine.other, theirs.other = theirs, mine
        # The accepting side's pump must run on the listener's trio loop.
        accept_done = trio.Event()

        def accept() -> None:
            theirs._token = trio.lowlevel.current_trio_token()
            theirs._thread = threading.get_ident()
            theirs.sink = listener.sinks(theirs)
            server_side._nursery.start_soon(theirs.pump)

        if server_side._trio_token is token:
            accept()
        else:
            # The listener lives on another trio loop in this process (another thread).
            def accept_remote() -> None:
                accept()
                token.run_sync_soon(accept_done.set)

            server_side._trio_token.run_sync_soon(accept_remote)
            await accept_done.wait()
        self._nursery.start_soon(mine.pump)
        return mine
