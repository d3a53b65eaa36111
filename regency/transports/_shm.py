"""A shared-memory lane for big frames between two processes of one host (sans-IO).

Each direction of a unix-socket connection may carry its big frames through a ring in shared
memory instead of through the socket: the sender copies the frame into the ring (one copy) and
writes a small descriptor frame on the socket; the receiver, on reading the descriptor, hands
the ring's bytes to its sink (which copies out what it keeps: one copy) and frees them. So a
big frame costs two user-space copies per direction and no kernel copies, against three copies
over the socket (sender to kernel, kernel to receive buffer, receive buffer to the ``bytes``
the user gets).

The ring is a memfd created by the sending side, sized ``CONTROL + size``, sealed against
shrinking and growing (a peer that shrank it would make the other side fault on access), and
passed to the peer with ``SCM_RIGHTS`` during the authenticated handshake
(:mod:`._sockets`): it never has a name in the file system, so the lane is exactly as private
as the socket. Its first page holds one word, ``freed``: the ring position up to which the
receiver has copied frames out, written by the receiver only. Positions are byte counts since
the lane opened (they only grow); a frame at position ``p`` lies at offset ``p % size``,
contiguous (a frame that would cross the end starts at the next multiple of ``size``
instead). Freeing needs no message: the sender reads ``freed`` to know what it may reuse.

Order with the other frames is kept because the descriptor travels in the stream. A
descriptor is only sent after the bytes are in the ring, so a sender that dies mid-copy leaves
nothing the receiver trusts. The receiver accepts a descriptor only at the position where the
previous frame ended (or, skipping the tail of the ring, at the next multiple of ``size``)
and only if it lies inside the ring; anything else is a bad frame (:class:`LaneError`) and
closes that connection. When the ring is empty the next frame starts at offset 0 again, so a
ping-pong of big frames keeps landing in the same (warm) pages.

On the wire a descriptor is the u32 length value :data:`MARK` (never a frame length: frames
are shorter than ``max_frame_bytes``, which the lane keeps below it) followed by
``u64 position, u64 length``.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import struct
from collections.abc import Sequence

#: The u32 length value that announces a descriptor instead of a frame.
MARK = 0xFFFF_FFFF
DESCRIPTOR = struct.Struct("<QQ")
#: Bytes a descriptor takes on the wire, length header included.
WIRE_BYTES = 4 + DESCRIPTOR.size
MARK_BYTES = MARK.to_bytes(4, "little")
#: The control page in front of the ring: ``freed`` (u64) at offset 0.
CONTROL = mmap.PAGESIZE
#: Seals a receiver requires: the ring's size can no longer change.
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x0002) | getattr(fcntl, "F_SEAL_GROW", 0x0004)
#: A ring the peer offers must lie in this range (bytes of ring, control page excluded).
MIN_RING = 64 * 1024
MAX_RING = 1 << 30


class LaneError(ValueError):
    """A descriptor or a ring the peer offered is not acceptable."""


def available() -> bool:
    """Whether this platform has what the lane needs (Linux: memfd and seals)."""
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


def check_ring_size(size: int) -> None:
    if not MIN_RING <= size <= MAX_RING or size % mmap.PAGESIZE:
        raise ValueError(
            f"lane ring size must be a multiple of {mmap.PAGESIZE} bytes between {MIN_RING} "
            f"and {MAX_RING} (got {size})"
        )


class OutRing:
    """The sending side of one lane: owns the ring and places frames in it.

    Not thread-safe: the connection calls :meth:`place` under its send lock, so that the
    order of places is the order of the descriptors on the stream.
    """

    def __init__(self, size: int) -> None:
        check_ring_size(size)
        fd = os.memfd_create("regency-lane", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, CONTROL + size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(fd, CONTROL + size)
        except BaseException:
            os.close(fd)
            raise
        #: Passed to the peer once, then closed (:meth:`fd_sent`); the mapping stays.
        self.fd: int | None = fd
        self.size = size
        # Shared with the receiver, which writes it: one aligned 8-byte word.
        self._freed = memoryview(self._map)[:8].cast("Q")
        self._data: memoryview | None = memoryview(self._map)[CONTROL:]
        self._tail = 0  # where the next frame may start
        #: Frames placed in the ring so far (tests check the path was taken).
        self.placed = 0
        # How far into the ring frames have written since its memory was last given back:
        # those pages are committed (shared memory stays committed while it is mapped).
        self._touched = 0
        self._seen = 0  # the last ``freed`` read: it may only grow, up to ``_tail``
        # Where the ring last started again empty: nothing before it is in use, whatever
        # ``freed`` says (the receiver frees past it only after the frame there).
        self._floor = 0

    def fd_sent(self) -> None:
        """The peer has the descriptor (or will never get it): close ours."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def place(self, parts: Sequence[bytes | bytearray | memoryview], size: int) -> bytes | None:
        """Copy a frame of ``size`` bytes (its ``parts``, in order) into the ring; return the
        descriptor to send in its place (after :data:`MARK_BYTES`), or None when it does not
        fit now (the ring is full, or the frame is bigger than the ring: it goes over the
        socket instead). Raises :class:`LaneError` when the receiver's ``freed`` word is
        outside what was placed."""
        ring = self.size
        if size > ring or self._data is None:
            return None
        freed = self._freed[0]
        if not self._seen <= freed <= self._tail:
            raise LaneError(
                f"lane's freed position must lie between {self._seen} and {self._tail} "
                f"(got {freed}): the peer wrote the control page wrongly"
            )
        self._seen = freed
        tail = self._tail
        offset = tail % ring
        if freed == tail:
            # Empty: start again at offset 0 (warm pages); all before it is free.
            if offset:
                tail += ring - offset
                offset = 0
            self._floor = tail
        elif offset + size > ring:
            # The frame would cross the end: skip to the start. The skipped bytes count as
            # used until the receiver frees past them.
            tail += ring - offset
            offset = 0
        if tail + size - max(freed, self._floor) > ring:
            return None  # it would overwrite frames not yet freed
        data = self._data
        at = offset
        for part in parts:
            if isinstance(part, memoryview):
                if part.ndim != 1 or part.format != "B":
                    part = part.cast("B")
                n = part.nbytes
            else:
                n = len(part)
            data[at : at + n] = part
            at += n
        if at - offset != size:
            raise ValueError(f"frame parts must add up to {size} bytes (got {at - offset})")
        self._tail = tail + size
        self._touched = max(self._touched, at)
        self.placed += 1
        return DESCRIPTOR.pack(tail, size)

    @property
    def holds_memory(self) -> bool:
        """Whether frames have touched ring pages since :meth:`release` last gave them back."""
        return self._touched > 0

    def release(self) -> bool:
        """Give the touched pages back to the system (``MADV_REMOVE``: the memfd's pages go,
        for the peer's mapping too) if the receiver has freed every frame; False when frames
        are still unread (try again later). A later frame commits pages again as it writes."""
        if self._data is None or not self._touched:
            return True
        if self._freed[0] != self._tail:
            return False
        length = -(-self._touched // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            self._map.madvise(mmap.MADV_REMOVE, CONTROL, length)
        except (OSError, AttributeError):
            pass  # (a kernel without it: the pages stay, as without this call)
        self._touched = 0
        return True

    def in_use(self) -> int:
        """Bytes placed and not yet freed by the receiver (for tests and statistics)."""
        return self._tail - self._freed[0] if self._data is not None else 0

    def close(self) -> None:
        self.fd_sent()
        if self._data is None:
            return
        self._data.release()
        self._data = None
        self._freed.release()
        _close_map(self._map)
        del self._map


class InRing:
    """The receiving side of one lane: checks descriptors and frees what was read.

    Used by whichever reader holds the connection (the loop's reader task or a thread that
    reads), never by two at once.
    """

    def __init__(self, fd: int) -> None:
        """Map the ring whose descriptor the peer passed (and take ownership of ``fd``:
        it is closed here, the mapping stays)."""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LaneError("lane descriptor the peer passed is not a memory file")
            size = st.st_size - CONTROL
            if not MIN_RING <= size <= MAX_RING or size % mmap.PAGESIZE:
                raise LaneError(
                    f"lane ring must be a multiple of {mmap.PAGESIZE} between {MIN_RING} and "
                    f"{MAX_RING} bytes (got {size})"
                )
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError as exc:
                raise LaneError(f"lane ring the peer passed cannot be sealed: {exc}") from None
            if seals & _SEALS != _SEALS:
                raise LaneError(
                    "lane ring the peer passed must be sealed against shrinking and growing "
                    f"(got seals {seals:#x})"
                )
            self._map = mmap.mmap(fd, CONTROL + size)
        finally:
            os.close(fd)
        self.size = size
        self._freed = memoryview(self._map)[:8].cast("Q")
        self._data: memoryview | None = memoryview(self._map)[CONTROL:]
        #: The largest frame accepted (the connection's ``max_frame_bytes``).
        self.limit = MAX_RING
        self._next = 0  # where the next frame may start (all before it is freed)
        self._taken = 0  # the end of the frame last taken, freed by :meth:`free`

    def take(self, descriptor: memoryview | bytes) -> memoryview:
        """The frame a descriptor (``u64 position, u64 length``) names, as a view of the
        ring valid until :meth:`free`. Raises :class:`LaneError` for a descriptor that
        points anywhere but where the next frame may lie. Taking the same descriptor again
        before :meth:`free` (a thread declined the frame; the loop reads it again) gives
        the same view."""
        position, length = DESCRIPTOR.unpack_from(descriptor)
        ring = self.size
        expected = self._next
        offset = position % ring
        if position != expected and not (
            offset == 0 and expected < position < expected + ring
        ):
            raise LaneError(
                f"lane descriptor must name position {expected} or the ring's next start "
                f"(got {position})"
            )
        if not 0 < length <= ring - offset:
            raise LaneError(
                f"lane descriptor's length must be 1 to {ring - offset} bytes at offset "
                f"{offset} of a {ring}-byte ring (got {length})"
            )
        if length > self.limit:
            raise LaneError(f"frame of {length} bytes exceeds max_frame_bytes={self.limit}")
        data = self._data
        try:
            if data is None:
                raise ValueError
            view = data[offset : offset + length]
        except ValueError:  # closed, by another thread meanwhile too
            raise LaneError("lane is closed") from None
        self._taken = position + length
        return view

    def free(self) -> None:
        """The frame last taken was handled: the sender may reuse its space."""
        self._next = self._taken
        try:
            self._freed[0] = self._taken
        except ValueError:
            pass  # closed meanwhile (by the loop while a thread handled the frame)

    def close(self) -> None:
        data, self._data = self._data, None
        if data is None:
            return
        data.release()
        self._freed.release()
        _close_map(self._map)
        del self._map


def _close_map(mapping: mmap.mmap) -> None:
    """Unmap now, or (a sink still holds a view of a frame) when the last view goes: the
    caller drops its reference to ``mapping``."""
    try:
        mapping.close()
    except BufferError:
        pass
