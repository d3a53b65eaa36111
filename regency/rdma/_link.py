"""The owner's data connection: leases for same-host copies and the bytes of the TCP fallback.

Each process that owns buffers opens, on first need, a listener of its own on the runtime's
transport (``tcp://HOST:0``, HOST that of the runtime's own TCP address, else ``tcp_host``; the
job secret's challenge-response handshake like every Regency link; in a simulated cluster the
address its environment names, on the simulated network, so the simulator's faults apply to
the bytes). Peers learn its address once from the owner's RDMA manager actor, dial it once,
and multiplex every request to that owner on the one connection, so bulk bytes never queue
behind (or in front of) actor messages, and a lease costs a small struct frame each way
instead of a pickled actor call.

Frames (little-endian), kind first:

==========  ============================================================  ====================
LEASE       req u32, buf_id u64, nbytes u64, write u8, ttl f64            -
LEASED      req u32, lease u64                                            -
VLEASE      as LEASE, for a verbs transfer                                -
VLEASED     req u32, lease u64, addr u64, rkey u32                        -
RELEASE     lease u64                                                     -
READ        req u32, buf_id u64, offset u64, length u64                   -
WRITE       req u32, buf_id u64, offset u64, length u64                   then DATA frames
DATA        req u32, offset u64 (within the transfer)                     the bytes
DONE        req u32                                                       - (a WRITE landed)
ERROR       req u32, code u8                                              utf-8 message
==========  ============================================================  ====================

A VLEASE also registers the buffer with the owner's RDMA device (once per buffer) and answers
with the address and rkey a one-sided verbs READ or WRITE needs (see :mod:`._ibverbs`).

Leases taken on a connection end when it closes: a peer that dies mid-copy releases its pins
at once (the lease's ttl is the backstop for a peer that hangs).

Bulk transfers: the sender queues every chunk at once as a view of the registered (or source)
memory; the socket layer gathers them into ``sendmsg`` without copying, as fast as the kernel
takes them, which keeps the pipe full. The receiver copies each chunk from the socket's receive
buffer straight to its place in the destination. A READ completes when all its bytes have
arrived, a WRITE when the owner answers DONE. A request that timed out is forgotten, and chunks
arriving for it later are discarded without touching its memory.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from urllib.parse import urlsplit

import attrs
import trio

from ..core import current_runtime
from ..transports import Connection, ConnectionBroken, TransportError
from . import _cuda
from ._backend import BufferRef, FallBack, call_manager
from ._errors import RDMABufferDroppedError, RDMAError, RDMAOwnerLostError, owner_lost
from ._memory import Region
from ._registry import Entry
from ._state import ProcState, current_state

#: Bytes per DATA frame.
CHUNK = 1 << 20

_LEASE, _LEASED, _RELEASE, _READ, _WRITE, _DATA, _DONE, _ERROR, _VLEASE, _VLEASED = range(1, 11)
_LEASE_HEAD = struct.Struct("<BIQQBd")
_LEASED_HEAD = struct.Struct("<BIQ")
_VLEASED_HEAD = struct.Struct("<BIQQI")
_RELEASE_HEAD = struct.Struct("<BQ")
_REQUEST = struct.Struct("<BIQQQ")
_DATA_HEAD = struct.Struct("<BIQ")
_DONE_HEAD = struct.Struct("<BI")
_ERROR_HEAD = struct.Struct("<BIB")

# ERROR codes <-> the exception the requester raises (FallBack: the owner cannot serve this
# backend, for example verbs without a device: auto goes on with the next backend).
_CODES: dict[int, type[Exception]] = {
    1: RDMABufferDroppedError,
    2: RDMAError,
    3: ValueError,
    4: TypeError,
    5: FallBack,
}


def _code_of(exc: Exception) -> int:
    for code, cls in _CODES.items():
        if type(exc) is cls:
            return code
    return 2


def _as_rdma_error(exc: Exception) -> Exception:
    return exc if isinstance(exc, (RDMAError, ValueError, TypeError)) else RDMAError(str(exc))


def _send_chunks(conn: Connection, req: int, view: memoryview) -> None:
    """Queue ``view`` as DATA frames; the frames hold views of it (no copy)."""
    for offset in range(0, len(view), CHUNK):
        conn.send_nowait([_DATA_HEAD.pack(_DATA, req, offset), view[offset : offset + CHUNK]])


# -- the owner's side -----------------------------------------------------------------------


@attrs.define(eq=False)
class _Incoming:
    """A WRITE being received. ``entry`` is None when it was refused: its chunks are counted
    and discarded."""

    entry: Entry | None
    offset: int
    length: int
    remaining: int
    #: Host memory the chunks land in first when the buffer is GPU memory (else None).
    staging: memoryview | None = None


class _ServerSink:
    """One accepted data connection, in the owner's process (on its trio thread)."""

    def __init__(self, conn: Connection, state: ProcState) -> None:
        self._conn = conn
        self._state = state
        self._registry = state.registry
        self._writes: dict[int, _Incoming] = {}
        self._leases: set[int] = set()

    def _refuse(self, req: int, exc: Exception) -> None:
        head = _ERROR_HEAD.pack(_ERROR, req, _code_of(exc))
        self._conn.send_nowait([head, str(exc).encode()])

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        kind = frame[0]
        if kind == _DATA:
            self._data(frame)
        elif kind in (_LEASE, _VLEASE):
            self._lease(conn, kind, frame)
        elif kind == _RELEASE:
            _, lease_id = _RELEASE_HEAD.unpack_from(frame)
            if lease_id in self._leases:
                self._leases.discard(lease_id)
                self._registry.release(lease_id)
        elif kind in (_READ, _WRITE):
            _, req, buf_id, offset, length = _REQUEST.unpack_from(frame)
            try:
                entry = self._registry.check(buf_id, offset + length, write=kind == _WRITE)
            except (RDMAError, ValueError, TypeError) as exc:
                self._refuse(req, exc)
                if kind == _WRITE:
                    self._writes[req] = _Incoming(None, offset, length, length)
                return
            region = entry.region
            if kind == _READ and region.on_gpu:
                # The device synchronisation and copy run on a worker thread: a busy GPU must
                # not stall this proc's event loop (its heartbeats among the rest).
                current_runtime().start_soon(self._read_gpu, conn, req, region, offset, length)
            elif kind == _READ:
                # Views of the entry's memory: they keep it alive until the socket sent them.
                _send_chunks(conn, req, region.view[offset : offset + length])
            else:
                staging = _cuda.host_staging(length, pinned=True)[0] if region.on_gpu else None
                self._writes[req] = _Incoming(entry, offset, length, length, staging)
        else:
            raise ValueError(f"unexpected RDMA data frame kind {kind}")

    def _data(self, frame: memoryview) -> None:
        _, req, at = _DATA_HEAD.unpack_from(frame)
        body = frame[_DATA_HEAD.size :]
        incoming = self._writes.get(req)
        if incoming is None or at + len(body) > incoming.length:
            raise ValueError(f"RDMA data chunk for unknown transfer {req} or out of its range")
        if incoming.staging is not None:
            incoming.staging[at : at + len(body)] = body
        elif incoming.entry is not None:
            start = incoming.offset + at
            incoming.entry.region.view[start : start + len(body)] = body
        incoming.remaining -= len(body)
        if incoming.remaining <= 0:
            del self._writes[req]
            if incoming.entry is not None:
                if incoming.staging is not None:  # GPU memory: off the event loop
                    current_runtime().start_soon(self._put_gpu, req, incoming)
                    return
                self._conn.send_nowait(_DONE_HEAD.pack(_DONE, req))

    async def _read_gpu(
        self, conn: Connection, req: int, region: Region, offset: int, length: int
    ) -> None:
        try:
            staging = await trio.to_thread.run_sync(_cuda.host_copy, region, offset, length)
        except Exception as exc:
            reason = _as_rdma_error(exc)
            self._send_quietly(conn, lambda: self._refuse(req, reason))
            return
        self._send_quietly(conn, lambda: _send_chunks(conn, req, staging))

    async def _put_gpu(self, req: int, incoming: _Incoming) -> None:
        assert incoming.entry is not None and incoming.staging is not None
        try:
            await trio.to_thread.run_sync(
                _cuda.put, incoming.entry.region, incoming.offset, incoming.staging
            )
        except Exception as exc:
            reason = _as_rdma_error(exc)
            self._send_quietly(self._conn, lambda: self._refuse(req, reason))
            return
        self._send_quietly(self._conn, lambda: self._conn.send_nowait(_DONE_HEAD.pack(_DONE, req)))

    @staticmethod
    def _send_quietly(conn: Connection, send: Callable[[], None]) -> None:
        """Send from a task that outlived the request's connection: a closed connection
        already failed the requester's transfer."""
        try:
            send()
        except TransportError:
            pass

    def _lease(self, conn: Connection, kind: int, frame: memoryview) -> None:
        _, req, buf_id, nbytes, write, ttl = _LEASE_HEAD.unpack_from(frame)
        try:
            lease_id, entry = self._registry.acquire(buf_id, nbytes, write=bool(write), ttl=ttl)
        except (RDMAError, ValueError, TypeError) as exc:
            self._refuse(req, exc)
            return
        self._leases.add(lease_id)
        if entry.region.on_gpu:
            # Work queued on the buffer before the transfer was asked for comes first; the
            # device synchronisation runs on a worker thread (a busy GPU must not stall this
            # proc's event loop), then the lease is answered.
            current_runtime().start_soon(self._grant_gpu, conn, kind, req, lease_id, entry)
            return
        self._grant(conn, kind, req, lease_id, entry)

    async def _grant_gpu(
        self, conn: Connection, kind: int, req: int, lease_id: int, entry: Entry
    ) -> None:
        try:
            await trio.to_thread.run_sync(_cuda.sync, entry.region.device)
        except Exception as exc:
            self._leases.discard(lease_id)
            self._registry.release(lease_id)
            reason = _as_rdma_error(exc)
            self._send_quietly(conn, lambda: self._refuse(req, reason))
            return
        if lease_id not in self._leases:  # the connection closed meanwhile
            return
        self._send_quietly(conn, lambda: self._grant(conn, kind, req, lease_id, entry))

    def _grant(self, conn: Connection, kind: int, req: int, lease_id: int, entry: Entry) -> None:
        """Answer a lease taken on ``entry`` (a VLEASE with the verbs address and rkey)."""
        try:
            if kind == _VLEASE:
                from ._ibverbs import remote_key

                addr, rkey = remote_key(self._state, entry)
                conn.send_nowait(_VLEASED_HEAD.pack(_VLEASED, req, lease_id, addr, rkey))
                return
        except Exception as exc:
            self._leases.discard(lease_id)
            self._registry.release(lease_id)
            reason = exc if isinstance(exc, RDMAError) else RDMAError(str(exc))
            self._refuse(req, reason)
            return
        conn.send_nowait(_LEASED_HEAD.pack(_LEASED, req, lease_id))

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        self._writes.clear()
        for lease_id in self._leases:
            self._registry.release(lease_id)
        self._leases.clear()


def _listen_host(address: str, tcp_host: str) -> str:
    """Where the data listener binds: the host of this runtime's own address when that is TCP
    (``tcp``, ``nng+tcp``, ``nng+tls+tcp``: whoever reaches the runtime reaches it there; a
    controller attached to workers listens on a routable address), else ``tcp_host`` from the
    configuration."""
    parts = urlsplit(address)
    if parts.scheme in ("tcp", "nng+tcp", "nng+tls+tcp") and parts.hostname:
        return parts.hostname
    return tcp_host


def listen_address(address: str, tcp_host: str) -> str:
    """The TCP address the data listener listens on, for a runtime at ``address``:
    ``tcp://HOST:0`` (a runtime's environment may name another, see ``data_address``)."""
    host = _listen_host(address, tcp_host)
    return f"tcp://[{host}]:0" if ":" in host else f"tcp://{host}:0"


async def data_address() -> str:
    """This proc's data listener, opened on first call (on the runtime's trio thread)."""
    state = current_state()
    if state.data_address is not None:
        return state.data_address
    if state.listen_lock is None:
        state.listen_lock = trio.Lock()
    async with state.listen_lock:
        if state.data_address is None:
            rt = current_runtime()
            where = rt.env.data_listen_address or listen_address(
                rt.address, rt.config.tcp_host
            )
            listener = await rt.transport.listen(where, lambda conn: _ServerSink(conn, state))
            state.data_address = listener.address
        return state.data_address


# -- the requester's side -------------------------------------------------------------------


class _LinkLost(Exception):
    """The data connection broke under a request (becomes RDMAOwnerLostError, naming the
    buffer, in the requester)."""


@attrs.define(eq=False)
class _Pending:
    #: Where a READ's chunks go (None for other requests).
    view: memoryview | None
    remaining: int
    done: trio.Event = attrs.Factory(trio.Event)
    error: Exception | None = None
    #: A LEASE's answer (and a VLEASE's address and rkey).
    lease_id: int = 0
    remote_addr: int = 0
    rkey: int = 0


class Link:
    """This process's data connection to one owner process."""

    def __init__(self, address: str, links: dict[str, Link]) -> None:
        self.address = address
        self.conn: Connection | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        #: The proc's open links, which this one leaves when its connection is lost.
        self._links = links

    # -- requests (trio thread) --

    async def lease(self, ref: BufferRef, nbytes: int, write: bool, ttl: float) -> int:
        """Ask the owner to check and pin ``ref`` for a copy of ``nbytes``."""
        pending = await self._request(
            ref, lambda req: _LEASE_HEAD.pack(_LEASE, req, ref.buf_id, nbytes, write, ttl), None, 0
        )
        return pending.lease_id

    async def verbs_lease(
        self, ref: BufferRef, nbytes: int, write: bool, ttl: float
    ) -> tuple[int, int, int]:
        """A lease, plus the buffer's address and rkey with the owner's RDMA device."""
        pending = await self._request(
            ref, lambda req: _LEASE_HEAD.pack(_VLEASE, req, ref.buf_id, nbytes, write, ttl),
            None, 0,
        )
        return pending.lease_id, pending.remote_addr, pending.rkey

    def release_soon(self, lease_id: int) -> None:
        """Release once this task yields, after the caller's Future is resolved: a send
        costs tens of microseconds that the caller need not wait for."""
        trio.lowlevel.current_trio_token().run_sync_soon(self.release, lease_id)

    def release(self, lease_id: int) -> None:
        try:
            self._conn().send_nowait(_RELEASE_HEAD.pack(_RELEASE, lease_id))
        except TransportError:
            pass  # the connection is gone, and the owner released the lease with it

    async def read(self, ref: BufferRef, into: memoryview) -> None:
        n = len(into)
        await self._request(ref, lambda req: _REQUEST.pack(_READ, req, ref.buf_id, 0, n), into, n)

    async def write(self, ref: BufferRef, data: memoryview) -> None:
        n = len(data)
        await self._request(
            ref, lambda req: _REQUEST.pack(_WRITE, req, ref.buf_id, 0, n), None, 0, data
        )

    async def _request(
        self,
        ref: BufferRef,
        head: Callable[[int], bytes],
        into: memoryview | None,
        remaining: int,
        data: memoryview | None = None,
    ) -> _Pending:
        """Send the request ``head(req)`` (then ``data`` as DATA chunks) and wait for its
        answer; ``into`` receives a READ's ``remaining`` bytes."""
        req = next(self._ids) & 0xFFFFFFFF
        pending = _Pending(into, remaining)
        self._pending[req] = pending
        try:
            try:
                conn = self._conn()
                conn.send_nowait(head(req))
                if data is not None:
                    _send_chunks(conn, req, data)
            except TransportError as exc:
                raise self._lost(ref, exc) from None
            await pending.done.wait()
        finally:
            # On timeout: forget it, so late chunks never touch memory the caller got back.
            self._pending.pop(req, None)
        if isinstance(pending.error, _LinkLost):
            raise self._lost(ref, pending.error)
        if pending.error is not None:
            raise pending.error
        return pending

    def _conn(self) -> Connection:
        if self.conn is None:
            raise ConnectionBroken("not connected")
        return self.conn

    def _lost(self, ref: BufferRef, why: object) -> RDMAOwnerLostError:
        detail = f"lost the RDMA data connection to {self.address}: {why}"
        return owner_lost(ref.describe(), detail)

    # -- FrameSink (trio thread) --

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        kind = frame[0]
        if kind == _DATA:
            _, req, at = _DATA_HEAD.unpack_from(frame)
            pending = self._pending.get(req)
            if pending is None or pending.view is None:
                return  # timed out: its memory is no longer ours to write
            body = frame[_DATA_HEAD.size :]
            pending.view[at : at + len(body)] = body
            pending.remaining -= len(body)
            if pending.remaining <= 0:
                self._finish(req, None)
        elif kind == _LEASED:
            _, req, lease_id = _LEASED_HEAD.unpack_from(frame)
            pending = self._pending.get(req)
            if pending is None:  # timed out meanwhile: give the pin back
                self.release(lease_id)
                return
            pending.lease_id = lease_id
            self._finish(req, None)
        elif kind == _VLEASED:
            _, req, lease_id, addr, rkey = _VLEASED_HEAD.unpack_from(frame)
            pending = self._pending.get(req)
            if pending is None:
                self.release(lease_id)
                return
            pending.lease_id, pending.remote_addr, pending.rkey = lease_id, addr, rkey
            self._finish(req, None)
        elif kind == _DONE:
            _, req = _DONE_HEAD.unpack_from(frame)
            self._finish(req, None)
        elif kind == _ERROR:
            _, req, code = _ERROR_HEAD.unpack_from(frame)
            message = bytes(frame[_ERROR_HEAD.size :]).decode(errors="replace")
            self._finish(req, _CODES.get(code, RDMAError)(message))
        else:
            raise ValueError(f"unexpected RDMA data frame kind {kind}")

    def _finish(self, req: int, error: Exception | None) -> None:
        pending = self._pending.pop(req, None)
        if pending is not None:
            pending.error = error
            pending.done.set()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        if self._links.get(self.address) is self:
            del self._links[self.address]
        for req in list(self._pending):
            self._finish(req, _LinkLost(str(exc or "closed")))


async def link_to(ref: BufferRef) -> Link:
    """The data connection to ``ref``'s owner, dialled on first use (trio thread)."""
    state = current_state()
    key = (ref.host, ref.pid, ref.proc_id)
    address = state.addresses.get(key)
    if address is None:
        address = str(await call_manager(ref, "data_address"))
        state.addresses[key] = address
    link: Link | None = state.links.get(address)
    if link is not None:
        return link
    lock = state.dial_locks.setdefault(address, trio.Lock())
    async with lock:
        link = state.links.get(address)
        if link is None:
            link = Link(address, state.links)
            try:
                link.conn = await current_runtime().transport.connect(address, link)
            except ConnectionBroken as exc:
                raise owner_lost(ref.describe(), str(exc)) from None
            state.links[address] = link
    return link
