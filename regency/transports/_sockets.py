"""Trio-native stream sockets: ``tcp://host:port`` and ``unix:///path``.

The fastest backend measured here (see docs/transports.md), hence the default. Sockets are
plain non-blocking stdlib sockets driven by ``trio.lowlevel.wait_readable/wait_writable``
rather than ``trio.SocketStream``: that lets :meth:`SocketConnection.send_nowait` write
straight into the kernel from whichever thread calls it (the controller's user thread, an
actor's thread) without hopping onto the trio thread, and lets the reader parse every frame a
single ``recv`` brought in. Frames are ``u32 little-endian length`` + payload.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import select
import socket
import stat
import struct
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import trio

from . import _auth, _baton, _protect, _shm
from ._base import (
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
    Transport,
    frame_size,
)

log = logging.getLogger("regency.transports")

_HEADER = 4
#: A frame's length, read in place (no slice of the receive buffer per frame).
_size_at = struct.Struct("<I").unpack_from
_RECV_BUFFER = 256 * 1024
# Frames at or above this size are sent with sendmsg([header, frame]) to avoid a copy.
_GATHER_THRESHOLD = 16 * 1024
# Frames sent less than this many seconds after the previous one are queued for the writer
# task, which sends a whole burst with one sendmsg; an isolated frame goes out at once, and
# so does a frame sent with ``answer=True`` (the first frame a thread sends after it waited
# for a message: a reply, however fast the round trip; see ``Connection.send_nowait``).
# Back-to-back sends (pipelined calls, a burst of replies) come 5-15 us apart. At 60 us
# without the answer rule, one fast round trip in five took its reply for a burst and waited
# for the loop to write it (docs/performance.md, "Idle vCPUs, spinning callees and the burst
# window"); 25 us also keeps frames a thread sends 30-60 us apart without waiting from
# costing a loop wake-up each.
_BURST_WINDOW = 25e-6
_MAX_IOV = 512
_perf_counter = time.perf_counter  # (read per frame sent: a global, not an attribute too)
_KERNEL_BUFFER = 4 << 20
# A frame bigger than the receive buffer is received into a buffer of its own: anonymous
# memory that the kernel commits page by page as the bytes arrive (never as the header
# claims). That buffer is kept for the next big frame that fits it, because fresh memory
# costs a page fault per 4 KiB (64 MiB: 250-350 ms here, against 25 ms to refill a warm
# buffer), and released once no frame needed it for this many seconds.
_KEEP_BIG = 1.0
#: Seconds a reader may hold its loop while its socket stays readable: a peer (or several)
#: that floods a connection would otherwise keep its reader decoding frame after frame,
#: and the loop would send no heartbeat and no acknowledgement until the flood ends (its
#: senders then give its links up). Past this, the reader lets the loop turn once.
_READ_SLICE = 0.005

# The shared-memory lane (see _shm.py) between procs of one host: frames at or above
# LANE_MIN bytes travel through a ring of LANE_RING bytes per direction when both ends of a
# unix-socket connection offered one in the handshake. Below LANE_MIN a frame goes over the
# socket (a descriptor round trip through the ring costs more than copying a small frame).
LANE_MIN = 64 * 1024
LANE_RING = 16 << 20
_NEVER = 1 << 62  # the lane threshold of a connection without a lane

# Who reads an unprotected connection (the loop's reader task or a thread: see
# SocketConnection.lead) is the connection's baton, a state of the machine in ``_baton.py``.
# Its states, events and actions, as module globals (read on the hot path).
_BROKEN = _baton.BROKEN
_GIVE_BACK = _baton.GIVE_BACK
_GIVE_BACK_UNREAD = _baton.GIVE_BACK_UNREAD
_HAND_BACK = _baton.HAND_BACK
_HELD = _baton.HELD
_HOLD = _baton.HOLD
_HOLD_UNREAD = _baton.HOLD_UNREAD
_ILLEGAL = _baton.ILLEGAL
_LEAD = _baton.LEAD
_LEADABLE = _baton.LEADABLE
_LOOP = _baton.LOOP
_LOOP_WAITING = _baton.LOOP_WAITING
_LOOP_WAITS = _baton.LOOP_WAITS
_LOOP_WAKES = _baton.LOOP_WAKES
_NOTHING = _baton.NOTHING
_PARK = _baton.PARK
_REARM = _baton.REARM
_REARM_FAILED = _baton.REARM_FAILED
_RECLAIM = _baton.RECLAIM
_RECLAIM_UNREAD = _baton.RECLAIM_UNREAD
_REFUSED = _baton.REFUSED
_SILENCE = _baton.SILENCE
_SILENCE_FAILED = _baton.SILENCE_FAILED
_STEP = _baton.STEP
_THREAD_READS = _baton.THREAD_READS
_WAKE_LOOP = _baton.WAKE_LOOP
_describe = _baton.describe
# The loop's interest in a socket, re-armed when a thread hands it back (as trio arms it).
_REARM_FLAGS = select.EPOLLIN | select.EPOLLONESHOT


def _loop_epoll() -> Any:
    """The running trio loop's epoll object, or None where trio does not use epoll.

    A thread that takes over reading a connection silences the loop's interest in the
    socket with one ``epoll_ctl`` (and restores it when it hands back) instead of waking
    the loop twice. trio arms each fd with ``EPOLLONESHOT`` on every ``wait_readable`` and
    re-arms only then, so a silenced fd stays silent until the thread re-arms it; a wake-up
    that races with the take-over is harmless (the reader task sees the baton and parks).
    This reads trio internals (trio is pinned); ``tests/transports`` checks that the path
    is taken, so an upgrade that moves them fails there rather than going slow silently.
    """
    try:
        manager = trio._core._run.GLOBAL_RUN_CONTEXT.runner.io_manager
        epoll = manager._epoll
    except AttributeError:
        return None
    return epoll if isinstance(epoll, select.epoll) else None


def parse_address(address: str) -> tuple[str, Any]:
    """Split ``tcp://h:p`` into ("tcp", (h, p)) and ``unix:///p`` into ("unix", "/p")."""
    parts = urlsplit(address)
    if parts.scheme == "tcp":
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"tcp address must look like tcp://HOST:PORT (got {address!r})")
        return "tcp", (parts.hostname, parts.port)
    if parts.scheme == "unix":
        path = parts.netloc + parts.path
        if not path:
            raise ValueError(f"unix address must look like unix:///PATH (got {address!r})")
        return "unix", path
    raise ValueError(f"address scheme must be one of ('tcp', 'unix') (got {address!r})")


async def _recv_exactly(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    """Read ``n`` handshake bytes. With ``fds``, also collect the descriptors passed with
    them (``SCM_RIGHTS``: a peer's lane ring); without, the kernel drops any."""
    chunks = bytearray()
    while len(chunks) < n:
        try:
            if fds is None:
                data = sock.recv(n - len(chunks))
            else:
                data, ancillary, _, _ = sock.recvmsg(
                    n - len(chunks), socket.CMSG_SPACE(4 * 4), _CMSG_CLOEXEC
                )
                fds.extend(_fds_in(ancillary))
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        if not data:
            raise ConnectionBroken("connection closed during handshake")
        chunks += data
    return bytes(chunks)


_CMSG_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)


def _fds_in(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(int.from_bytes(data[i : i + 4], "little", signed=True) for i in range(0, usable, 4))
    return fds


async def _send_all(sock: socket.socket, data: bytes, fd: int | None = None) -> None:
    """Write handshake bytes; ``fd`` (a lane ring) travels with the first of them."""
    view = memoryview(data)
    while view:
        try:
            if fd is not None:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, "little"))]
                sent = sock.sendmsg([view], rights)
                fd = None
            else:
                sent = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[sent:]


def _lane_of(offered: _shm.OutRing | None, fds: list[int]) -> _Lane | None:
    """After the handshake: the connection's lane, when this side offered a ring and the
    peer passed one (both sides then agree it is on); else None, and what was offered or
    passed is closed. A ring the peer passed that is not fit for use raises ValueError
    (as a bad handshake does): the peer would otherwise send descriptors we refuse."""
    passed = fds[:]
    fds.clear()  # taken: a second call (an error path) closes nothing twice
    fds = passed
    if offered is not None:
        offered.fd_sent()
    if offered is None or len(fds) != 1:
        if offered is not None:
            offered.close()
        for fd in fds:
            os.close(fd)
        if offered is not None and len(fds) > 1:
            raise ValueError(f"peer passed {len(fds)} descriptors in the handshake (expected 1)")
        return None
    try:
        incoming = _shm.InRing(fds[0])
    except BaseException:
        offered.close()
        raise
    return offered, incoming


_Lane = tuple[_shm.OutRing, _shm.InRing]


class SocketConnection(Connection):
    """A connected, authenticated stream socket."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        token: trio.lowlevel.TrioToken,
        max_frame: int,
        protection: tuple[_protect.Sealer, _protect.Opener] | None = None,
        lane: _Lane | None = None,
        lane_min: int = LANE_MIN,
    ) -> None:
        self.peer = peer
        #: Records sealed with per-connection keys (TCP); None: frames go as they are (unix
        #: sockets in the job's 0700 directory).
        self._sealer: _protect.Sealer | None = None
        self._opener: _protect.Opener | None = None
        if protection is not None:
            self._sealer, self._opener = protection
        self._sock = sock
        self._token = token
        self._trio_thread = threading.get_ident()
        self._max_frame = max_frame
        # A length above this is a lane descriptor (its MARK) or a bad frame: one check on
        # the read path covers both.
        self._size_limit = min(max_frame, _shm.MARK - 1)
        # The shared-memory lane (_shm.py), or None. The outgoing ring is used under _lock;
        # the incoming one by whoever holds the baton (the reader task or a leading thread).
        self._lane_out: _shm.OutRing | None = None
        self._lane_in: _shm.InRing | None = None
        self._lane_min = _NEVER  # frames of at least this many bytes go through the lane
        if lane is not None:
            self._lane_out, self._lane_in = lane
            self._lane_in.limit = max_frame
            self._lane_min = lane_min
        self._lock = threading.Lock()
        # Bytes accepted by send_nowait but not yet taken by the kernel, oldest first. While it
        # is non-empty, new frames queue behind it (order) and the writer task owns flushing.
        self._pending: deque[bytes | memoryview] = deque()
        self._writer_wakeup = trio.Event()
        # True while the writer task has been asked to flush and has not started yet.
        self._kicked = False
        # True while the writer task is sending a batch it took off the queue.
        self._writing = False
        self._last_send = 0.0
        self._closed = False
        self._error: BaseException | None = None
        self.sink: FrameSink | None = None
        # Reading by a thread (lead/read_led/hold/give_back: ThreadReadable). The baton
        # (a state of _baton.py's machine, changed only under _read_lock, by _STEP) says who
        # may read; the receive buffer and its parse position live here so either reader
        # goes on where the other stopped. Lock order: _read_lock, then _lock. Closing the
        # socket takes _read_lock, so a thread never reads a closed (or reused) descriptor.
        self._read_lock = threading.Lock()
        self._baton = _LOOP
        # Sealed connections are read by their reader task alone: records are opened in
        # sequence by one opener, which assembles frames of several records in its own
        # buffer (sharing it with threads is possible, not done: sealed links cross hosts,
        # where the network, not a loop wake-up, dominates a round trip).
        self._epoll: Any = _loop_epoll() if protection is None else None
        self._fd = sock.fileno()
        self._rview: memoryview | None = None
        self._rstart = self._rend = 0
        # The reader task's buffer for frames bigger than the receive buffer (see
        # _KEEP_BIG), or None. The reader task's alone: a thread that reads hands such a
        # frame back unread, so the reader task may drop it while a thread leads.
        self._big: mmap.mmap | None = None
        self._wait_scope: trio.CancelScope | None = None
        self._handed_back: trio.Event | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def readable_by_threads(self) -> bool:  # type: ignore[override]
        """Unsealed, and trio waits on epoll (whose interest a thread silences)."""
        return self._epoll is not None

    def send_nowait(self, frame: Frame, answer: bool = False) -> None:
        if self._sealer is not None:
            self._send_sealed(frame, answer)
            return
        if isinstance(frame, list):
            size = frame_size(frame)
            if size < _GATHER_THRESHOLD:
                frame = b"".join(frame)
        else:
            size = len(frame)
        header = size.to_bytes(_HEADER, "little")
        now = _perf_counter()
        # ``with``, not acquire()/try/release(): see Outbox.send (an interrupt raised as
        # acquire() returns would leave the lock held for good).
        with self._lock:
            if self._closed:
                if self._error is not None:
                    raise ConnectionBroken(f"connection to {self.peer} is broken: {self._error}")
                raise ConnectionClosed(f"connection to {self.peer} is closed")
            if size >= self._lane_min:
                descriptor = self._place_locked(frame, size)
                if descriptor is not None:  # the frame is in the ring: send its descriptor
                    frame, size, header = descriptor, len(descriptor), _shm.MARK_BYTES
            burst = not answer and now - self._last_send < _BURST_WINDOW
            self._last_send = now
            if self._pending or self._writing or burst:
                # Coalesce: the writer task sends everything queued in one sendmsg.
                if isinstance(frame, list):
                    self._pending.append(memoryview(header))
                    self._pending.extend(memoryview(part) for part in frame)
                elif size < _GATHER_THRESHOLD:
                    self._pending.append(header + frame)  # (bytes: no view to make per frame)
                else:
                    self._pending.append(memoryview(header))
                    self._pending.append(memoryview(frame))
                if self._kicked:
                    return
                self._kicked = True
            else:
                try:
                    if size >= _GATHER_THRESHOLD:
                        sent = self._sock.sendmsg(_parts(header, frame))
                    else:
                        sent = self._sock.send(header + frame)  # type: ignore[operator]
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._fail_locked(exc)
                    raise ConnectionBroken(f"connection to {self.peer} is broken: {exc}") from exc
                if sent == size + _HEADER:
                    return
                parts: list[bytes | memoryview] = [memoryview(p) for p in _parts(header, frame)]
                self._pending.extend(_unsent(parts, sent))
                self._kicked = True
        self._kick_writer()

    def _place_locked(self, frame: Frame, size: int) -> bytes | None:
        """Copy a big frame into the lane's ring (``_lock`` held, so ring order is stream
        order); the descriptor to send in its place (after ``_shm.MARK_BYTES``), or None:
        it goes over the socket."""
        assert self._lane_out is not None
        if size >= _shm.MARK:
            raise ValueError(f"frame of {size} bytes is too big for this connection")
        ring = self._lane_out
        idle = not ring.holds_memory
        try:
            placed = ring.place(frame if isinstance(frame, list) else (frame,), size)
            if idle and placed is not None:  # the writer starts its idle timer (see writer)
                self._call_on_loop(self._wake_writer)
            return placed
        except _shm.LaneError as exc:
            self._fail_locked(exc)
            raise ConnectionBroken(f"connection to {self.peer} is broken: {exc}") from exc

    def _wake_writer(self) -> None:
        self._writer_wakeup.set()

    def _send_sealed(self, frame: Frame, answer: bool) -> None:
        """``send_nowait`` on a protected connection: seal under the lock, so records reach
        the wire in the order of their sequence numbers."""
        assert self._sealer is not None
        now = _perf_counter()
        with self._lock:
            if self._closed:
                if self._error is not None:
                    raise ConnectionBroken(f"connection to {self.peer} is broken: {self._error}")
                raise ConnectionClosed(f"connection to {self.peer} is closed")
            wire = self._sealer.seal(frame)
            burst = not answer and now - self._last_send < _BURST_WINDOW
            self._last_send = now
            if self._pending or self._writing or burst:
                self._pending.append(memoryview(wire))
                if self._kicked:
                    return
                self._kicked = True
            else:
                try:
                    sent = self._sock.send(wire)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._fail_locked(exc)
                    raise ConnectionBroken(f"connection to {self.peer} is broken: {exc}") from exc
                if sent == len(wire):
                    return
                self._pending.append(memoryview(wire)[sent:])
                self._kicked = True
        self._kick_writer()

    def _kick_writer(self) -> None:
        if threading.get_ident() == self._trio_thread:
            self._writer_wakeup.set()
        else:
            try:
                self._token.run_sync_soon(self._writer_wakeup.set)
            except trio.RunFinishedError:
                pass

    async def writer(self) -> None:
        """Flush what ``send_nowait`` queued. Runs as one task per connection.

        The lock is not held during ``sendmsg``: senders keep queueing behind the batch in
        flight (``_writing`` keeps them from writing around it), and what the kernel did not
        take goes back to the front of the queue.
        """
        while not self._closed:
            if self._lane_out is not None and self._lane_out.holds_memory:
                # Frames went through the lane: give its pages back once it has been idle
                # for _KEEP_BIG (emptied), as the reader does with its big buffer.
                with trio.move_on_after(_KEEP_BIG) as idle:
                    await self._writer_wakeup.wait()
                if idle.cancelled_caught:
                    with self._lock:
                        if not self._closed:
                            self._lane_out.release()
                    continue
            else:
                await self._writer_wakeup.wait()
            self._writer_wakeup = trio.Event()
            while True:
                with self._lock:
                    self._kicked = False
                    if self._closed or not self._pending:
                        break
                    pending = self._pending
                    if len(pending) <= _MAX_IOV:  # the whole queue (a copy in C, no loop)
                        batch = list(pending)
                        pending.clear()
                    else:
                        batch = [pending.popleft() for _ in range(_MAX_IOV)]
                    self._writing = True
                try:
                    sent = self._sock.sendmsg(batch)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    with self._lock:
                        self._writing = False
                        self._fail_locked(exc)
                    break
                blocked = sent < sum(map(len, batch))
                with self._lock:
                    self._writing = False
                    if blocked:
                        self._pending.extendleft(reversed(_unsent(batch, sent)))
                    # The kernel has what it took: keep no reference to the batch while
                    # idle (it may hold the last frames, hundreds of megabytes).
                    batch = []
                    if not self._pending:
                        break
                    self._kicked = True
                if blocked:
                    try:
                        await trio.lowlevel.wait_writable(self._sock)
                    except trio.ClosedResourceError:
                        return  # closed locally while waiting
        if self._error is not None:
            self._notify_lost()

    async def reader(self) -> None:
        """Receive frames and hand each to the sink, in order."""
        assert self.sink is not None
        try:
            try:
                if self._opener is not None:
                    await self._read_records(self._opener)
                else:
                    await self._read_frames()
            finally:
                self._big = None  # (the connection object may outlive its reader)
        except trio.ClosedResourceError:
            pass  # closed locally: close() already told the sink
        except ConnectionBroken as exc:
            if not self._closed:
                log.info("connection to %s lost: %s", self.peer, exc)
            with self._lock:
                self._fail_locked(exc)
            self._notify_lost()
        except _protect.ProtectionError as exc:
            log.error("closing connection to %s: %s", self.peer, exc)
            with self._lock:
                self._fail_locked(exc)
            self._notify_lost()
        except Exception as exc:
            log.error("closing connection to %s after bad frame: %r", self.peer, exc)
            with self._lock:
                self._fail_locked(exc)
            self._notify_lost()

    async def _read_frames(self) -> None:
        """Unprotected connections: ``u32 length + payload`` frames. A thread may read for a
        while instead (:meth:`lead`); the buffer and position are shared with it."""
        assert self.sink is not None
        sock = self._sock
        received, limit = self.sink.frame_received, self._size_limit  # (per frame: no lookups)
        buf = bytearray(_RECV_BUFFER)
        view = self._rview = memoryview(buf)
        big_used = 0.0  # trio time the big buffer (self._big) last took a frame
        turned = _perf_counter()  # when this task last let the loop turn
        while True:
            start, end = self._rstart, self._rend  # a thread may have read meanwhile
            if not _frame_ready(view, start, end):  # (a thread may have left one)
                try:
                    n = sock.recv_into(view[end:])
                except BlockingIOError:
                    if self._big is not None and trio.current_time() - big_used > _KEEP_BIG:
                        self._big = None  # no big frame for a while: give the buffer back
                    await self._await_readable(
                        None if self._big is None else big_used + _KEEP_BIG
                    )
                    turned = _perf_counter()
                    continue
                except OSError as exc:
                    raise ConnectionBroken(str(exc)) from exc
                if n == 0:
                    raise ConnectionBroken("peer closed the connection")
                end += n
            while end - start >= _HEADER:
                (size,) = _size_at(view, start)
                if size > limit:
                    lane = self._lane_of_descriptor(size)
                    if end - start < _shm.WIRE_BYTES:
                        break
                    frame = lane.take(view[start + _HEADER : start + _shm.WIRE_BYTES])
                    received(self, frame)
                    frame.release()
                    lane.free()
                    start += _shm.WIRE_BYTES
                    if self._closed:
                        return
                    continue
                if end - start - _HEADER < size:
                    if _HEADER + size > len(buf):
                        # A frame bigger than the buffer: receive it into a buffer of its
                        # own (see _KEEP_BIG; the sink may not keep the view).
                        # (No local reference to it: _await_readable may drop it.)
                        if self._big is None or len(self._big) < size:
                            self._big = None  # (the old one goes before the new one comes)
                            self._big = _fresh_memory(size)
                        frame = memoryview(self._big)[:size]
                        have = end - start - _HEADER
                        frame[:have] = view[start + _HEADER : end]
                        self._rstart = self._rend = 0
                        await self._recv_into_exactly(frame[have:])
                        start = end = 0
                        received(self, frame)
                        frame.release()
                        big_used = trio.current_time()
                    break
                received(self, view[start + _HEADER : start + _HEADER + size])
                start += _HEADER + size
                if self._closed:
                    return
            self._rstart, self._rend = _compact(view, start, end)
            if _perf_counter() - turned > _READ_SLICE:
                await trio.lowlevel.checkpoint()
                turned = _perf_counter()
            else:
                await trio.lowlevel.checkpoint_if_cancelled()

    def _lane_of_descriptor(self, size: int) -> _shm.InRing:
        """A frame length above the limit: the lane when it is a descriptor on a connection
        with a lane, else the error that closes the connection."""
        if size == _shm.MARK and self._lane_in is not None:
            return self._lane_in
        if size == _shm.MARK:
            raise ConnectionBroken("lane descriptor on a connection without a shared-memory lane")
        raise ConnectionBroken(f"frame of {size} bytes exceeds max_frame_bytes={self._max_frame}")

    async def _await_readable(self, until: float | None) -> None:
        """Wait until the socket is readable (or ``until``, trio time: when the big buffer
        is due to go), letting a thread take over reading meanwhile; return once the reader
        task may read again. A thread that leads the connection past ``until`` (an idle
        actor thread leads it until its next call, however long that is) does not keep the
        big buffer alive: it goes at ``until``, while the reader task waits for the thread
        to hand the connection back."""
        if self._epoll is None:
            if until is None:
                await trio.lowlevel.wait_readable(self._sock)
            else:
                with trio.move_on_at(until):
                    await trio.lowlevel.wait_readable(self._sock)
            return
        with self._read_lock:
            before = self._baton
            self._baton, action = _STEP[before | _LOOP_WAITS]
            if action != _NOTHING:  # broken: run on into the connection's failure
                if action == _ILLEGAL:
                    self._broke(before, _LOOP_WAITS)
                return
            scope = self._wait_scope = trio.CancelScope()
            if until is not None:
                scope.deadline = until
        with scope:
            await trio.lowlevel.wait_readable(self._sock)
        with self._read_lock:
            before = self._baton
            self._baton, action = _STEP[before | _LOOP_WAKES]
            if action != _PARK:  # ours: still, handed back with bytes to handle, or held
                if action == _ILLEGAL:
                    self._broke(before, _LOOP_WAKES)
                return
            handed = self._handed_back = trio.Event()  # a thread reads: wait for it
        if until is not None and self._big is not None:
            with trio.move_on_at(until):
                await handed.wait()
                return
            self._big = None  # (the caller finds it gone; no thread reads into it)
        await handed.wait()

    # -- reading on a thread (ThreadReadable) -----------------------------------------------

    def lead(self) -> bool:
        """From a thread other than the loop's: take over reading this connection while the
        reader task waits for data (silencing the loop's interest in the socket: one
        ``epoll_ctl``), or one a thread set aside (:meth:`hold`: no syscall). False when it
        cannot (the loop is reading, another thread leads, the connection is sealed, closed,
        or has writes queued: the writer may wait for EPOLLOUT on the same descriptor).
        After True the caller reads with :meth:`read_led` when ``fileno()`` polls readable,
        and must :meth:`give_back` (or :meth:`hold`)."""
        epoll = self._epoll
        if epoll is None or self._baton not in _LEADABLE:  # (a first look without the lock)
            return False
        with self._read_lock:
            if self._closed:
                return False
            baton, action = _STEP[self._baton | _LEAD]
            if action == _NOTHING:  # set aside by a thread (hold): still silenced
                self._baton = baton
                return True
            if action != _SILENCE:
                return False  # refused: the baton moved since the first look
            with self._lock:
                if self._pending or self._writing:
                    return False
                self._baton = baton
                try:
                    epoll.modify(self._fd, 0)
                except OSError:
                    self._baton = _STEP[baton | _SILENCE_FAILED][0]
                    return False
        return True

    def fileno(self) -> int:
        return self._fd

    def read_led(self) -> bool:
        """On the leading thread: read what the socket has and hand each whole frame to the
        sink's ``frame_on_thread``. Returns False when the thread must stop leading (it has
        given the connection back): a frame the sink leaves to the loop, a frame bigger
        than the buffer, end of stream or an error (the reader task meets it itself)."""
        with self._read_lock:  # closing takes it: the descriptor is ours while held
            if self._baton not in _THREAD_READS:  # (handed back, broken)
                return False
            view, start, end = self._rview, self._rstart, self._rend
            if self._closed or view is None:
                self._move_locked(_GIVE_BACK_UNREAD)
                return False
            try:
                # (an empty buffer, the common case, is received into without a slice)
                n = self._sock.recv_into(view[end:] if end else view)
            except BlockingIOError:
                return True
            except OSError:
                n = 0
            if n == 0:
                self._move_locked(_GIVE_BACK_UNREAD)
                return False
        # The frames are handled without the lock (a handler may close connections); the
        # baton keeps the reader task off the buffer meanwhile.
        end += n
        handled = True
        sink = self.sink
        try:
            while end - start >= _HEADER:
                (size,) = _size_at(view, start)
                if size > self._size_limit:
                    if not self._take_led(view, start, end):
                        handled = (  # only a descriptor not yet whole: read on
                            size == _shm.MARK
                            and self._lane_in is not None
                            and end - start < _shm.WIRE_BYTES
                        )
                        break  # (a bad descriptor or frame: the loop meets it and closes)
                    start += _shm.WIRE_BYTES
                    continue
                if end - start - _HEADER < size:
                    handled = _HEADER + size <= len(view)  # else: too big for the buffer
                    break
                # A sink raises only for a frame it did not take (KeyboardInterrupt while
                # it decoded): that frame stays for the loop, and the error goes up.
                if not sink.frame_on_thread(  # type: ignore[union-attr]
                    self, view[start + _HEADER : start + _HEADER + size]
                ):
                    handled = False
                    break
                start += _HEADER + size
        except BaseException:
            handled = False
            raise
        finally:
            if handled and start == end and not self._closed:
                # Every frame handled (the common case), the connection still ours: the
                # baton keeps the buffer and its position ours, so they are reset without
                # the lock (a close meanwhile is met under it by the next read_led, hold or
                # give_back; about 600 instructions a read less).
                self._rstart = self._rend = 0
            else:
                with self._read_lock:
                    self._rstart, self._rend = _compact(view, start, end)
                    if not handled or self._closed:
                        self._move_locked(_GIVE_BACK_UNREAD)
                        handled = False
        return handled

    def _take_led(self, view: memoryview, start: int, end: int) -> bool:
        """On the leading thread: hand the lane frame a whole descriptor at ``start`` names
        to the sink's ``frame_on_thread`` and free it; False when there is none, the sink
        left it to the loop or it is bad (left in the buffer, the loop reads it again)."""
        lane = self._lane_in
        if lane is None or end - start < _shm.WIRE_BYTES:
            return False
        if int.from_bytes(view[start : start + _HEADER], "little") != _shm.MARK:
            return False
        try:
            frame = lane.take(view[start + _HEADER : start + _shm.WIRE_BYTES])
        except _shm.LaneError:
            return False
        try:
            taken = self.sink.frame_on_thread(self, frame)  # type: ignore[union-attr]
        finally:
            frame.release()
        if taken:
            lane.free()
        return bool(taken)

    def give_back(self) -> None:
        """The leading thread is done (or a connection set aside goes back): the reader
        task reads again, woken at once when bytes are left unread or it is closed."""
        with self._read_lock:
            self._move_locked(
                _GIVE_BACK if self._rstart == self._rend and not self._closed else _GIVE_BACK_UNREAD
            )

    def hold(self) -> None:
        """The leading thread stops reading for now but means to lead the connection again
        soon (a mesh call's sender, between its fan-out and its ``get()``): the loop's
        interest stays silenced, with no syscall now and none when a thread leads it again.
        Any thread may :meth:`lead` it; the loop takes it back with :meth:`reclaim` (the
        runtime does, a few ms after the last hold). Given back at once instead when bytes
        are left in the buffer, the reader task waits for it, or it is closed."""
        with self._read_lock:
            event = _HOLD if self._rstart == self._rend and not self._closed else _HOLD_UNREAD
            baton, action = _STEP[self._baton | event]
            if action == _NOTHING:  # (the common case, thread -> held, without a call)
                self._baton = baton
            elif action != _REFUSED:
                self._move_locked(event)

    @property
    def held(self) -> bool:
        """Set aside by a thread (:meth:`hold`) and not led since."""
        return self._baton == _HELD

    def reclaim(self) -> bool:
        """The loop takes back a connection a thread set aside (:meth:`hold`): the socket's
        interest is re-armed (the reader task wakes if data came meanwhile). False when it
        was not set aside."""
        with self._read_lock:
            action = self._move_locked(
                _RECLAIM if self._rstart == self._rend and not self._closed else _RECLAIM_UNREAD
            )
        return action != _REFUSED

    def _move_locked(self, event: int) -> int:
        """Feed ``event`` to the baton (``_read_lock`` held) and perform the action it
        decides (returned): re-arm the loop's interest (as trio armed it, with EPOLLOUT when
        the writer may wait for it: see :meth:`lead`), wake the waiting reader task, or hand
        the connection back to the parked one."""
        before = self._baton
        self._baton, action = _STEP[before | event]
        if action == _REARM:
            flags = _REARM_FLAGS
            with self._lock:
                if self._pending:
                    flags |= select.EPOLLOUT
                try:
                    self._epoll.modify(self._fd, flags)
                    return action
                except OSError:
                    self._baton, action = _STEP[self._baton | _REARM_FAILED]
        if action == _WAKE_LOOP:
            scope = self._wait_scope
            assert scope is not None
            self._call_on_loop(scope.cancel)
        elif action == _HAND_BACK:
            handed = self._handed_back
            assert handed is not None
            self._call_on_loop(handed.set)
        elif action == _ILLEGAL:
            self._broke(before, event)
        return action

    def _broke(self, state: int, event: int) -> None:
        """The baton got an event its state cannot see (``_read_lock`` held): a bug. The
        connection fails (its session resumes on a new one) rather than have a frame read
        twice or never; the reader task is woken, wherever it waits, to report it."""
        error = ConnectionBroken(
            f"the read baton went {_describe(state, event)} {_describe(_BROKEN)} "
            f"(a bug in regency: please report it)"
        )
        log.error("closing connection to %s: %s", self.peer, error)
        with self._lock:
            self._fail_locked(error)
        if self._wait_scope is not None:
            self._call_on_loop(self._wait_scope.cancel)
        if self._handed_back is not None:
            self._call_on_loop(self._handed_back.set)

    def _call_on_loop(self, fn: Any) -> None:
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    async def _read_records(self, opener: _protect.Opener) -> None:
        """Protected connections: sealed records (see :mod:`._protect`). A record always
        fits the receive buffer; a frame of many records is assembled by the opener as they
        arrive, and nothing is handed to the sink before its record checked out."""
        assert self.sink is not None
        sock = self._sock
        buf = bytearray(_RECV_BUFFER)
        view = memoryview(buf)
        header_bytes = _protect.HEADER_BYTES
        big_used: float | None = None  # trio time a frame of several records last arrived
        start = end = 0
        turned = _perf_counter()  # when this task last let the loop turn (_READ_SLICE)
        while True:
            try:
                n = sock.recv_into(view[end:])
            except BlockingIOError:
                if big_used is not None and trio.current_time() - big_used > _KEEP_BIG:
                    opener.release_buffer()  # no big frame for a while (see _KEEP_BIG)
                    big_used = None
                if big_used is None:
                    await trio.lowlevel.wait_readable(sock)
                else:
                    with trio.move_on_at(big_used + _KEEP_BIG):
                        await trio.lowlevel.wait_readable(sock)
                turned = _perf_counter()
                continue
            except OSError as exc:
                raise ConnectionBroken(str(exc)) from exc
            if n == 0:
                if opener.mid_frame or end > start:
                    raise ConnectionBroken(
                        "peer closed the connection in the middle of a frame (truncated)"
                    )
                raise ConnectionBroken("peer closed the connection")
            end += n
            while end - start >= header_bytes:
                header = view[start : start + header_bytes]
                body = opener.body_length(header)
                if end - start - header_bytes < body:
                    break
                frame = opener.open(header, view[start + header_bytes : start + header_bytes + body])
                start += header_bytes + body
                if frame is not None:
                    self.sink.frame_received(self, memoryview(frame))
                    if isinstance(frame, memoryview):  # assembled in the opener's buffer
                        frame.release()
                        big_used = trio.current_time()
                    del frame
                    if self._closed:
                        return
            start, end = _compact(view, start, end)
            if _perf_counter() - turned > _READ_SLICE:
                await trio.lowlevel.checkpoint()
                turned = _perf_counter()
            else:
                await trio.lowlevel.checkpoint_if_cancelled()

    async def _recv_into_exactly(self, target: memoryview) -> None:
        while target:
            try:
                n = self._sock.recv_into(target)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._sock)
                continue
            if n == 0:
                raise ConnectionBroken("peer closed the connection mid-frame")
            target = target[n:]

    def _fail_locked(self, exc: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        # Without its traceback: that would keep the reader's frame and buffers alive.
        self._error = exc.with_traceback(None) if exc is not None else None
        self._pending.clear()
        if self._lane_out is not None:  # (placing happens under _lock too)
            self._lane_out.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    _lost_notified = False

    def _notify_lost(self) -> None:
        if self._lost_notified:
            return
        self._lost_notified = True
        trio.lowlevel.notify_closing(self._sock)
        with self._read_lock:
            self._sock.close()
            self._close_lane_in()
        if self.sink is not None:
            self.sink.connection_lost(self, self._error)

    def abort(self) -> None:
        """Close the socket without telling the sink (the transport is going away)."""
        with self._lock:
            self._fail_locked(None)
            if self._lost_notified:
                return
            self._lost_notified = True
        trio.lowlevel.notify_closing(self._sock)
        with self._read_lock:
            self._sock.close()
            self._close_lane_in()

    def _close_lane_in(self) -> None:
        """Unmap the incoming ring (``_read_lock`` held). A thread may be handing a frame
        in it to its sink: the mapping then goes when that frame's view is released."""
        if self._lane_in is not None:
            self._lane_in.close()

    @property
    def lane(self) -> bool:
        """Whether big frames travel through the shared-memory lane (see ``_shm.py``)."""
        return self._lane_out is not None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._fail_locked(None)
        self._writer_wakeup.set()
        self._notify_lost()


class SocketListener(Listener):
    def __init__(self, sock: socket.socket, address: str, cancel: trio.CancelScope) -> None:
        self._sock = sock
        self.address = address
        self._cancel = cancel

    def close(self) -> None:
        self._cancel.cancel()


class SocketTransport(Transport):
    schemes = ("tcp", "unix")
    #: Connections that may be in their handshake at once; beyond it the oldest is shed.
    max_handshakes = 64

    def refusal_is_final(self, address: str) -> bool:
        # A unix socket's path is this host's: a refusal means its proc is gone. A tcp
        # address may have a relay or proxy in between that restarts.
        return not address.startswith("tcp://")

    def __init__(
        self,
        nursery: trio.Nursery,
        secret: bytes,
        max_frame: int,
        *,
        protect_tcp: bool = True,
        shm_lane: bool = True,
        lane_min: int = LANE_MIN,
        lane_ring: int = LANE_RING,
    ) -> None:
        self._nursery = nursery
        self._secret = secret
        self._max_frame = max_frame
        #: Seal every frame on TCP links (see :mod:`._protect`). Both ends must agree.
        self._protect_tcp = protect_tcp
        #: Accepted connections still in their handshake (oldest first), and how many of
        #: them were shed to make room.
        self._handshakes: dict[socket.socket, trio.CancelScope] = {}
        self._shed = 0
        self._refusals_since = 0.0
        self._refusals_logged = 0
        self._refusals_quiet = 0
        #: Offer a shared-memory lane on unix-socket connections (``_shm.py``): frames of
        #: ``lane_min`` bytes or more then travel through a ring of ``lane_ring`` bytes per
        #: direction, when the peer offers one too.
        self._shm_lane = shm_lane and _shm.available()
        if shm_lane and lane_min < 1:
            raise ValueError(f"lane_min must be at least 1 byte (got {lane_min})")
        self._lane_min = lane_min
        self._lane_ring = lane_ring
        if self._shm_lane:
            _shm.check_ring_size(lane_ring)

    def _offer_lane(self, scheme: str) -> _shm.OutRing | None:
        """A ring to offer the peer of a new connection, or None (no lane on this one)."""
        if scheme != "unix" or not self._shm_lane:
            return None
        try:
            return _shm.OutRing(self._lane_ring)
        except OSError as exc:  # out of descriptors or memory: this connection goes without
            log.warning("no shared-memory lane for a new connection: %s", exc)
            return None

    def _protection(
        self, scheme: str, role: str, nonce_s: bytes, nonce_c: bytes
    ) -> tuple[_protect.Sealer, _protect.Opener] | None:
        if scheme != "tcp" or not self._protect_tcp:
            return None
        return _protect.keys_for(role, self._secret, nonce_s, nonce_c, self._max_frame)

    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        scheme, where = parse_address(address)
        if scheme == "tcp":
            family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
            host, port = sock.getsockname()[:2]
            bound = f"tcp://[{host}]:{port}" if family == socket.AF_INET6 else f"tcp://{host}:{port}"
        else:
            _check_private_dir(os.path.dirname(where) or ".")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(where)
            os.chmod(where, 0o600)
            bound = f"unix://{where}"
        sock.listen(512)
        sock.setblocking(False)
        cancel = trio.CancelScope()
        self._nursery.start_soon(self._accept_loop, sock, scheme, sinks, cancel)
        return SocketListener(sock, bound, cancel)

    async def _accept_loop(
        self, sock: socket.socket, scheme: str, sinks: SinkFactory, cancel: trio.CancelScope
    ) -> None:
        """Accept connections. Unauthenticated ones are bounded: at most
        ``max_handshakes`` at a time, the oldest shed first; when the descriptor table is
        full, the oldest handshake in progress makes room, else accepting backs off (up to a
        second between tries) with one log line per episode, not one per try."""
        backoff = 0.0
        with sock, cancel:
            while True:
                try:
                    conn, addr = sock.accept()
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        raise
                    if self._shed_oldest_handshake():
                        await trio.sleep(0)  # let the shed task close its descriptor
                        continue
                    if backoff == 0.0:
                        log.warning(
                            "cannot accept connections on %s (%s); retrying quietly with "
                            "back-off until descriptors free up", sock.getsockname(), exc
                        )
                    backoff = min(max(backoff * 2, 0.01), 1.0)
                    await trio.sleep(backoff)
                    continue
                if backoff:
                    log.info("accepting connections again")
                    backoff = 0.0
                if len(self._handshakes) >= self.max_handshakes:
                    self._shed_oldest_handshake()
                peer = f"{scheme}://{addr[0]}:{addr[1]}" if scheme == "tcp" else "unix peer"
                self._nursery.start_soon(self._serve_one, conn, scheme, peer, sinks)
        trio.lowlevel.notify_closing(sock)

    def _shed_oldest_handshake(self) -> bool:
        """Drop the oldest connection still in its handshake; False when there is none."""
        for scope in self._handshakes.values():
            if not scope.cancel_called:
                scope.cancel()
                self._shed += 1
                return True
        return False

    async def _serve_one(
        self, sock: socket.socket, scheme: str, peer: str, sinks: SinkFactory
    ) -> None:
        _tune(sock)
        scope = trio.CancelScope()
        self._handshakes[sock] = scope  # insertion order: oldest first
        # The lane (unix sockets): the client passes its ring with its proof, an
        # authenticated server its own with the answer; the lane is on when both did.
        fds: list[int] | None = [] if scheme == "unix" else None
        offered: _shm.OutRing | None = None
        lane: _Lane | None = None
        try:
            with scope, trio.fail_after(_auth.HANDSHAKE_TIMEOUT):
                hello, nonce_s = _auth.server_hello()
                await _send_all(sock, hello)
                proof = await _recv_exactly(sock, _auth.CLIENT_PROOF_BYTES, fds)
                answer = _auth.check_client_proof(self._secret, nonce_s, proof)
                if fds:
                    offered = self._offer_lane(scheme)
                await _send_all(sock, answer, None if offered is None else offered.fd)
                lane, offered = _lane_of(offered, fds or []), None
        except (ValueError, OSError, ConnectionBroken, trio.TooSlowError) as exc:
            self._refused(peer, str(exc) or "handshake timed out")
            sock.close()
            return
        finally:
            del self._handshakes[sock]
            _lane_of(offered, fds or [])  # closes what was offered or passed (after success:
            # nothing; the connection has them)
        if scope.cancelled_caught:
            log.debug("shed unauthenticated connection from %s", peer)
            _close_lane(lane)
            sock.close()
            return
        protection = self._protection(scheme, "server", nonce_s, _auth.client_nonce_of(proof))
        conn = SocketConnection(
            sock, peer, trio.lowlevel.current_trio_token(), self._max_frame, protection,
            lane, self._lane_min,
        )
        try:
            conn.sink = sinks(conn)
        except Exception:
            log.exception("no handler for connection from %s", peer)
            conn.abort()
            return
        await self._run(conn)

    def _refused(self, peer: str, why: str) -> None:
        """Log a failed handshake: each of the first few per 10 s, then one summary, so
        that a flood of bad connections cannot flood the log."""
        now = time.monotonic()
        if now - self._refusals_since > 10.0:
            if self._refusals_quiet:
                log.warning(
                    "refused %d more connection(s) in the last %.0f s (not logged one by one)",
                    self._refusals_quiet,
                    now - self._refusals_since,
                )
            self._refusals_since, self._refusals_logged, self._refusals_quiet = now, 0, 0
        if self._refusals_logged < 5:
            self._refusals_logged += 1
            log.warning("refused connection from %s: %s", peer, why)
        else:
            self._refusals_quiet += 1

    async def _run(self, conn: SocketConnection) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.writer)
                await conn.reader()
                conn._writer_wakeup.set()
        finally:
            # Cancelled (the transport is closing): the socket goes now, not when the
            # garbage collector finds it, so the peer sees the connection end.
            conn.abort()

    async def connect(self, address: str, sink: FrameSink) -> Connection:
        scheme, where = parse_address(address)
        offered: _shm.OutRing | None = None
        fds: list[int] = []
        sock: socket.socket | None = None
        try:
            if scheme == "tcp":
                infos = await trio.socket.getaddrinfo(
                    where[0], where[1], type=socket.SOCK_STREAM
                )
                family, _, _, _, sockaddr = infos[0]
                sock = socket.socket(family, socket.SOCK_STREAM)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sockaddr = where
            _tune(sock)
            try:
                sock.connect(sockaddr)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err)) from None
            # The lane (unix sockets): our ring goes with the proof, the server's comes
            # with its answer; the lane is on when both did (see _serve_one).
            offered = self._offer_lane(scheme)
            with trio.fail_after(_auth.HANDSHAKE_TIMEOUT):
                hello = await _recv_exactly(sock, _auth.SERVER_HELLO_BYTES)
                proof, nonce_c = _auth.client_proof(self._secret, hello)
                await _send_all(sock, proof, None if offered is None else offered.fd)
                try:
                    answer = await _recv_exactly(
                        sock, _auth.SERVER_PROOF_BYTES, None if offered is None else fds
                    )
                except ConnectionBroken:
                    raise ValueError(
                        "server refused our proof: this side does not have the job secret"
                    ) from None
            _auth.check_server_proof(self._secret, nonce_c, hello[len(_auth.PREFIX) :], answer)
            lane, offered = _lane_of(offered, fds), None
        except ValueError as exc:
            _lane_of(offered, fds)
            if sock is not None:
                sock.close()
            refusal: type[ConnectionBroken] = AuthenticationError
            if isinstance(exc, _auth.VersionMismatch):
                refusal = IncompatiblePeer
            raise refusal(f"cannot connect to {address}: {exc}") from None
        except (OSError, ConnectionBroken, trio.TooSlowError) as exc:
            _lane_of(offered, fds)
            if sock is not None:
                sock.close()
            refused = isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.ENOENT)
            kind = ConnectionRefused if refused else ConnectionBroken
            raise kind(f"cannot connect to {address}: {exc or 'timed out'}") from None
        except BaseException:  # cancelled: no descriptor outlives the attempt
            _lane_of(offered, fds)
            if sock is not None:
                sock.close()
            raise
        protection = self._protection(scheme, "client", hello[len(_auth.PREFIX) :], nonce_c)
        conn = SocketConnection(
            sock, address, trio.lowlevel.current_trio_token(), self._max_frame, protection,
            lane, self._lane_min,
        )
        conn.sink = sink
        self._nursery.start_soon(self._run, conn)
        return conn


def _close_lane(lane: _Lane | None) -> None:
    if lane is not None:
        lane[0].close()
        lane[1].close()


def _fresh_memory(size: int) -> mmap.mmap:
    """Anonymous memory for one big frame: the kernel commits it as bytes are written into
    it, in huge pages where it can (a 64 MiB frame then costs 32 page faults, not 16,384)."""
    memory = mmap.mmap(-1, size)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            memory.madvise(advice)
        except OSError:
            pass
    return memory


def _parts(header: bytes, frame: Frame) -> list[Any]:
    """A frame's header and parts, for ``sendmsg`` (built only where needed: a small frame
    goes out joined to its header)."""
    return [header, *frame] if isinstance(frame, list) else [header, frame]


def _unsent(batch: list[bytes | memoryview], sent: int) -> list[bytes | memoryview]:
    """What is left of ``batch`` after the kernel took ``sent`` bytes."""
    for i, buf in enumerate(batch):
        if sent < len(buf):
            return [buf[sent:], *batch[i + 1 :]]
        sent -= len(buf)
    return []


def _tune(sock: socket.socket) -> None:
    """Non-blocking; no Nagle delay; kernel buffers big enough that a 1 MiB frame goes
    out in one or two writes instead of many wake-ups."""
    sock.setblocking(False)
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, _KERNEL_BUFFER)
        except OSError:
            pass


def _check_private_dir(path: str) -> None:
    """Refuse to put a unix socket where other users could reach it."""
    st = os.stat(path)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(
            f"unix sockets must live in a directory only this user can open "
            f"(got {path!r} with mode {stat.S_IMODE(st.st_mode):o}); use regency's socket dir"
        )


def _frame_ready(view: memoryview, start: int, end: int) -> bool:
    """Whether ``view[start:end]`` holds a whole frame, or the header of one too big for
    the buffer (both are handled before reading more)."""
    if end - start < _HEADER:
        return False
    size = int.from_bytes(view[start : start + _HEADER], "little")
    if end - start - _HEADER >= size:
        return True
    if size == _shm.MARK:  # a lane descriptor (or, without a lane, a bad frame)
        return end - start >= _shm.WIRE_BYTES
    return _HEADER + size > len(view)


def _compact(view: memoryview, start: int, end: int) -> tuple[int, int]:
    """After handling the whole frames in ``view[start:end]``: move the partial frame left
    to the front, so that it can always complete in place; the new ``(start, end)``."""
    if start == end:
        return 0, 0
    if start:
        view[: end - start] = view[start:end]
        return 0, end - start
    return start, end
