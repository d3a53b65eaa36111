"""RDMA verbs through pyverbs: one-sided READ and WRITE on an RDMA NIC.

Per proc, opened on first use: a ``Context`` on the chosen device (the first with an active
port, or ``REGENCY_RDMA_DEVICE`` / ``REGENCY_RDMA_PORT`` / ``REGENCY_RDMA_GID_INDEX``, see
:mod:`._verbs_info`), a ``PD``, one ``CQ`` with a ``CompChannel``, and a task in the runtime's
nursery that waits for the channel's fd with ``trio.lowlevel.wait_readable`` and hands each
work completion to the transfer that posted it.

A transfer (the requester's side, :class:`IbverbsBackend`):

1. a VLEASE on the owner's data connection (:mod:`._link`) checks and pins the buffer, and
   the owner registers it with its device on first use (an ``MR`` with remote READ and WRITE
   access; GPU memory as a ``DmaBufMR`` from a CUDA dma-buf, else through nvidia-peermem) and
   answers with its address and rkey;
2. the RC queue pair to that owner proc, made on first use: ours goes RESET -> INIT, its
   details (:class:`~._verbs_info.QueuePairInfo`) go to the owner's RDMA manager actor
   (``verbs_connect``), which makes a queue pair for us, moves it INIT -> RTR -> RTS with ours
   and answers with its own; ours then goes RTR -> RTS;
3. the local memory is registered (an ``MR`` for this transfer), and ``IBV_WR_RDMA_READ`` or
   ``IBV_WR_RDMA_WRITE`` work requests of at most the port's ``max_msg_sz`` bytes are posted,
   at most :data:`SEND_DEPTH` in flight per queue pair; the transfer ends when every one has
   completed, or fails naming the first failed completion's status.

Setup failures (no device here or at the owner, a queue pair that cannot connect) raise
:class:`~._backend.FallBack`, so ``auto`` goes on over TCP; a failed work completion fails
the transfer. A transfer cancelled (timed out) with requests in flight abandons its queue
pair (the next transfer makes a new one), so no request can land in memory after the caller
got it back.

Nothing here has run against a device: the machine it was written on has none. pyverbs
names and signatures were checked against rdma-core 44 (Debian's python3-pyverbs) and 59
(PyPI); the pure parts are tested everywhere (tests/rdma/test_verbs_info.py).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import threading
from typing import Any

import attrs
import trio

from ..core import current_runtime
from ._backend import Backend, BufferRef, FallBack, Transfer, call_manager
from ._errors import RDMAError, RDMAOwnerLostError
from ._memory import Region
from ._registry import Entry
from ._state import ProcState, current_state
from ._verbs_info import (
    WC_STATUS,
    PortChoice,
    QueuePairInfo,
    choose_port,
    completion_error,
    gid_bytes,
    gid_text,
    path_mtu,
    plan_chunks,
    scan_ports,
)

IMPLEMENTED = True
_SYSFS = "/sys/class/infiniband"

#: Work requests in flight per queue pair, and completions the CQ holds (at most).
SEND_DEPTH = 128
CQ_DEPTH = 4096


@functools.cache
def pyverbs_installed() -> bool:
    return importlib.util.find_spec("pyverbs") is not None


def devices() -> list[str]:
    """Names of the RDMA devices the kernel shows (``/sys/class/infiniband``)."""
    try:
        return sorted(os.listdir(_SYSFS))
    except OSError:
        return []


def is_available() -> bool:
    """pyverbs is importable and an RDMA device exists."""
    return pyverbs_installed() and bool(devices())


def unavailable_reason() -> str:
    found = devices()
    parts = [
        "pyverbs is " + ("installed" if pyverbs_installed() else "not installed"),
        f"RDMA devices: {', '.join(found) if found else 'none in ' + _SYSFS}",
    ]
    return (
        "ibverbs backend needs pyverbs and an RDMA device (" + "; ".join(parts) + "); "
        "install the extra with pip install 'regency[rdma]', or use "
        "REGENCY_RDMA_BACKEND=auto (same-host copies, else TCP)"
    )


def usable(ref: BufferRef) -> bool:
    """Whether ``auto`` should try verbs for ``ref``: available here, the device did not
    fail to open in this proc, and the owner did not refuse verbs before."""
    if not is_available():
        return False
    state = current_state()
    return not isinstance(state.verbs, BaseException) and _owner_key(ref) not in _refused(state)


def _owner_key(ref: BufferRef) -> tuple[str, int, str]:
    return (ref.host, ref.pid, ref.proc_id)


def _refused(state: ProcState) -> set[tuple[str, int, str]]:
    """Owners that answered a VLEASE with a refusal (no device there): auto skips verbs."""
    return state.verbs_refused


# -- reading sysfs ----------------------------------------------------------------------


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def current_choice() -> PortChoice:
    """The device, port and GID index this process uses (sysfs and the environment)."""
    return choose_port(scan_ports(_SYSFS, _listdir, _read), os.environ)


# -- the completion channel's fd ----------------------------------------------------------

_channel_lock = threading.Lock()


def _event_fds() -> set[int]:
    found = set()
    for name in _listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[infinibandevent]":
                found.add(int(name))
        except (OSError, ValueError):
            continue
    return found


def _open_channel(ctx: Any) -> tuple[Any, int]:
    """A ``CompChannel`` and its fd. pyverbs exposes ``CompChannel.fd`` in recent versions;
    older ones (Debian 12's rdma-core 44) do not, and then the fd is the one event file the
    creation added to this process (creations are serialised by a lock)."""
    from pyverbs.cq import CompChannel

    with _channel_lock:
        before = _event_fds()
        channel = CompChannel(ctx)
        fd = getattr(channel, "fd", None)
        if isinstance(fd, int) and fd >= 0:
            return channel, fd
        new = _event_fds() - before
    if len(new) != 1:
        raise RDMAError(
            "cannot find the completion channel's file descriptor: this pyverbs has no "
            "CompChannel.fd and /proc/self/fd shows no single new [infinibandevent] file; "
            "install a newer pyverbs (pip install 'regency[rdma]')"
        )
    return channel, new.pop()


# -- pyverbs records (built without a device: tests/rdma/test_ibverbs.py checks them) -------


def init_attr(port: int) -> tuple[Any, int]:
    """RESET -> INIT: the port, and remote READ and WRITE allowed on the queue pair."""
    from pyverbs import enums as e
    from pyverbs.qp import QPAttr

    attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET, port_num=port)
    attr.pkey_index = 0
    attr.qp_access_flags = (
        e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    )
    return attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS


def rtr_attr(
    port: int, mtu: int, max_dest_rd_atomic: int, remote: QueuePairInfo, sgid_index: int | None
) -> tuple[Any, int]:
    """INIT -> RTR towards ``remote``; with a global route header from our GID at
    ``sgid_index`` to the remote GID when ``sgid_index`` is not None (RoCE, routed IB)."""
    from pyverbs import enums as e
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.qp import QPAttr

    route = None
    if sgid_index is not None:
        route = GlobalRoute(dgid=GID(gid_text(remote.gid)), sgid_index=sgid_index, hop_limit=64)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, cur_qp_state=e.IBV_QPS_INIT, port_num=port,
                  path_mtu=path_mtu(mtu, remote.mtu))
    attr.dest_qp_num = remote.qp_num
    attr.rq_psn = remote.psn
    attr.max_dest_rd_atomic = max_dest_rd_atomic
    attr.min_rnr_timer = 12
    attr.ah_attr = AHAttr(dlid=remote.lid, sl=0, is_global=int(route is not None),
                          port_num=port, gr=route)
    mask = (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
            | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    return attr, mask


def rts_attr(port: int, psn: int, max_rd_atomic: int) -> tuple[Any, int]:
    """RTR -> RTS: our first PSN, retries, and READs in flight."""
    from pyverbs import enums as e
    from pyverbs.qp import QPAttr

    attr = QPAttr(qp_state=e.IBV_QPS_RTS, cur_qp_state=e.IBV_QPS_RTR, port_num=port)
    attr.timeout = 14  # 4.096 us * 2**14: about 67 ms per try
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.sq_psn = psn
    attr.max_rd_atomic = max_rd_atomic
    mask = (e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
            | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
    return attr, mask


def work_request(
    wr_id: int, write: bool, local: int, length: int, lkey: int, remote: int, rkey: int
) -> Any:
    """One signalled ``IBV_WR_RDMA_READ`` (remote -> local) or ``IBV_WR_RDMA_WRITE``."""
    from pyverbs import enums as e
    from pyverbs.wr import SGE, SendWR

    opcode = e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ
    wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[SGE(local, length, lkey)],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(rkey, remote)
    return wr


# -- the device ---------------------------------------------------------------------------


@attrs.define(eq=False)
class _Pending:
    """One posted work request, until its completion arrives."""

    qp: _QueuePair
    done: trio.Event = attrs.Factory(trio.Event)
    #: Status and vendor error of a failed completion, or why it will never come.
    error: str | None = None


@attrs.define(eq=False)
class _QueuePair:
    qp: Any
    psn: int
    #: Free slots of the send queue.
    window: trio.Semaphore
    #: Why this queue pair may no longer be used (a failed completion, an abandoned request).
    broken: str | None = None
    #: Work request ids in flight on it.
    in_flight: set[int] = attrs.Factory(set)


class VerbsDevice:
    """One proc's verbs resources on the chosen port. All methods run on the trio thread."""

    def __init__(self, choice: PortChoice) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.choice = choice
        self.ctx = Context(name=choice.device)
        self.pd = PD(self.ctx)
        device_attr = self.ctx.query_device()
        port_attr = self.ctx.query_port(choice.port)
        self.lid = int(port_attr.lid)
        self.mtu = int(port_attr.active_mtu)
        self.max_msg = int(port_attr.max_msg_sz) or (1 << 31)
        # RDMA READs in flight: as initiator (RTS) and as responder (RTR).
        self.max_rd_atomic = max(1, min(16, int(device_attr.max_qp_init_rd_atom)))
        self.max_dest_rd_atomic = max(1, min(16, int(device_attr.max_qp_rd_atom)))
        self.send_depth = max(1, min(SEND_DEPTH, int(device_attr.max_qp_wr)))
        cq_depth = max(self.send_depth, min(CQ_DEPTH, int(device_attr.max_cqe)))
        gid = self.ctx.query_gid(choice.port, choice.gid_index).gid if choice.use_grh else None
        self.gid = gid_bytes(gid) if gid else bytes(16)
        self.channel, self.fd = _open_channel(self.ctx)
        os.set_blocking(self.fd, False)
        self.cq = CQ(self.ctx, cq_depth, None, self.channel, 0)
        self.cq.req_notify()
        #: Completions the CQ has room for: every signalled request holds one.
        self._cq_room = trio.Semaphore(cq_depth)
        self._pending: dict[int, _Pending] = {}
        self._wr_ids = itertools.count(1)
        #: Requester side: owner (host, pid, proc id) -> our queue pair to it.
        self.connections: dict[tuple[str, int, str], _QueuePair] = {}
        self._connect_locks: dict[tuple[str, int, str], trio.Lock] = {}
        #: Owner side: requester name -> the queue pair we made for it.
        self.accepted: dict[str, _QueuePair] = {}

    # -- completions --

    async def dispatch(self) -> None:
        """Hand completions to their requests, forever (in the runtime's nursery).

        Notification is re-armed right after each event, before polling, so a completion
        that arrives while the CQ is drained raises the next event: none is missed.
        """
        while True:
            self._drain()
            await trio.lowlevel.wait_readable(self.fd)
            try:
                self.channel.get_cq_event(self.cq)
            except Exception:
                continue  # the fd woke us without an event (non-blocking: EAGAIN)
            self.cq.ack_events(1)
            self.cq.req_notify()

    def _drain(self) -> None:
        from pyverbs.cq import cqe_status_to_str

        while True:
            count, completions = self.cq.poll(32)
            if not count:
                return
            for wc in completions:
                pending = self._pending.pop(wc.wr_id, None)
                if pending is None:
                    continue  # of an abandoned queue pair
                qp = pending.qp
                qp.in_flight.discard(wc.wr_id)
                qp.window.release()
                self._cq_room.release()
                if wc.status != 0:
                    detail = str(cqe_status_to_str(wc.status))
                    pending.error = completion_error(wc.status, wc.vendor_err, detail)
                    name = WC_STATUS.get(wc.status, (str(wc.status), ""))[0]
                    qp.broken = qp.broken or f"a request failed with {name}"
                pending.done.set()

    # -- queue pairs --

    def _new_queue_pair(self) -> _QueuePair:
        from pyverbs import enums as e
        from pyverbs.qp import QP, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=self.send_depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        qp = QP(self.pd, init)
        qp.modify(*init_attr(self.choice.port))
        psn = current_runtime().rng.getrandbits(24)
        return _QueuePair(qp, psn, trio.Semaphore(self.send_depth))

    def info(self, qp: _QueuePair) -> QueuePairInfo:
        return QueuePairInfo(qp_num=int(qp.qp.qp_num), lid=self.lid, gid=self.gid, psn=qp.psn,
                             mtu=self.mtu)

    def _connect(self, qp: _QueuePair, remote: QueuePairInfo) -> None:
        """INIT -> RTR (towards ``remote``) -> RTS."""
        grh = self.choice.use_grh or remote.lid == 0
        if grh and not remote.has_gid:
            raise FallBack("the owner's port has no GID and no LID: it cannot be addressed")
        port = self.choice.port
        qp.qp.modify(*rtr_attr(port, self.mtu, self.max_dest_rd_atomic, remote,
                               self.choice.gid_index if grh else None))
        qp.qp.modify(*rts_attr(port, qp.psn, self.max_rd_atomic))

    async def connection_to(self, ref: BufferRef, me: str) -> _QueuePair:
        """Our queue pair to ``ref``'s owner, connected through its manager on first use."""
        key = _owner_key(ref)
        qp = self.connections.get(key)
        if qp is not None and qp.broken is None:
            return qp
        async with self._connect_locks.setdefault(key, trio.Lock()):
            qp = self.connections.get(key)
            if qp is not None and qp.broken is None:
                return qp
            if qp is not None:
                self.abandon(qp, qp.broken or "replaced")
            made: _QueuePair | None = None
            try:
                made = self._new_queue_pair()
                answer = await call_manager(ref, "verbs_connect", me, self.info(made).pack())
                self._connect(made, QueuePairInfo.unpack(answer))
            except BaseException as exc:
                if made is not None:
                    made.qp.close()
                if isinstance(exc, RDMAOwnerLostError) or not isinstance(exc, Exception):
                    raise
                raise FallBack(f"no verbs connection to {ref.describe()}: {exc}") from None
            self.connections[key] = made
            return made

    def accept(self, peer: str, info: bytes) -> bytes:
        """The owner's side of :meth:`connection_to`."""
        remote = QueuePairInfo.unpack(info)
        old = self.accepted.pop(peer, None)
        if old is not None:
            self.abandon(old, "the requester connected again")
        qp = self._new_queue_pair()
        self._connect(qp, remote)
        self.accepted[peer] = qp
        return self.info(qp).pack()

    def abandon(self, qp: _QueuePair, why: str) -> None:
        """Destroy ``qp``: its requests in flight fail with ``why`` and never touch memory."""
        qp.broken = qp.broken or why
        for wr_id in sorted(qp.in_flight):
            pending = self._pending.pop(wr_id, None)
            if pending is not None:
                pending.error = f"its queue pair was abandoned ({why})"
                pending.done.set()
                self._cq_room.release()
        qp.in_flight.clear()
        for table in (self.connections, self.accepted):
            for key, value in list(table.items()):
                if value is qp:
                    del table[key]  # type: ignore[arg-type]
        qp.qp.close()

    # -- memory --

    def register(self, region: Region, length: int, access: int) -> tuple[Any, int]:
        """Register ``length`` bytes of ``region``; return the MR and the address of the
        region's first byte in the MR's address space (what SGEs and rkeys refer to)."""
        from pyverbs.mr import MR

        if not region.on_gpu:
            return MR(self.pd, length, access, address=region.addr), region.addr
        return self._register_gpu(region, length, access)

    def _register_gpu(self, region: Region, length: int, access: int) -> tuple[Any, int]:
        from pyverbs.mr import MR, DmaBufMR

        from . import _cuda

        try:
            fd, offset = _cuda.dmabuf(region)
            try:
                # pyverbs registers the dma-buf with iova = offset.
                return DmaBufMR(self.pd, length, access, dmabuf=fd, offset=offset), offset
            finally:
                os.close(fd)
        except Exception as exc:
            dmabuf_error = exc
        try:
            # nvidia-peermem lets ibv_reg_mr pin GPU memory by its address.
            return MR(self.pd, length, access, address=region.addr), region.addr
        except Exception as exc:
            raise RDMAError(
                f"cannot register GPU memory ({region.device}) with {self.choice.device}: "
                f"as a dma-buf: {dmabuf_error}; by address (nvidia-peermem): {exc}"
            ) from None

    # -- work requests --

    async def move(
        self, qp: _QueuePair, lkey: int, local: int, remote: int, rkey: int, nbytes: int,
        write: bool, what: str,
    ) -> None:
        """READ ``nbytes`` from ``remote`` (rkey) into ``local`` (lkey), or WRITE the other way,
        in pieces; return when every piece completed, raise on the first failure."""
        verb = "RDMA WRITE" if write else "RDMA READ"
        posted: list[tuple[int, int, _Pending]] = []
        try:
            for offset, length in plan_chunks(nbytes, self.max_msg):
                await self._cq_room.acquire()
                await qp.window.acquire()
                if qp.broken is not None:
                    qp.window.release()
                    self._cq_room.release()
                    raise RDMAError(f"{what} failed: its queue pair broke ({qp.broken})")
                wr_id = next(self._wr_ids)
                wr = work_request(wr_id, write, local + offset, length, lkey, remote + offset,
                                  rkey)
                pending = _Pending(qp)
                self._pending[wr_id] = pending
                qp.in_flight.add(wr_id)
                posted.append((offset, length, pending))
                try:
                    qp.qp.post_send(wr)
                except Exception as exc:
                    self.abandon(qp, f"post_send failed: {exc}")
                    raise RDMAError(f"{what} failed: posting an {verb} failed: {exc}") from None
            for offset, length, pending in posted:
                await pending.done.wait()
                if pending.error is not None:
                    raise RDMAError(
                        f"{what} failed: {verb} of {length} bytes at offset {offset}: "
                        f"{pending.error}"
                    )
        except BaseException:
            if any(not p.done.is_set() for _, _, p in posted):
                # Requests still in flight may write into memory the caller gets back.
                self.abandon(qp, "a transfer was cancelled with requests in flight")
            raise


# -- the proc's device, and the owner's side ---------------------------------------------


def open_device(state: ProcState) -> VerbsDevice:
    """This proc's device, opened on first call (trio thread); raises :class:`FallBack` if it
    cannot be (and remembers that)."""
    if isinstance(state.verbs, VerbsDevice):
        return state.verbs
    if isinstance(state.verbs, BaseException):
        raise FallBack(str(state.verbs))
    if state.simulated:
        raise FallBack("the ibverbs backend does not run in a simulated cluster; use auto or "
                       "tcp, which run over the simulated network")
    if not is_available():
        raise FallBack(unavailable_reason())
    try:
        device = VerbsDevice(current_choice())
    except Exception as exc:
        state.verbs = RDMAError(f"cannot open the RDMA device: {exc}")
        raise FallBack(str(state.verbs)) from None
    state.verbs = device
    current_runtime().nursery.start_soon(device.dispatch, name="rdma completions")
    return device


def remote_key(state: ProcState, entry: Entry) -> tuple[int, int]:
    """The owner's side of a VLEASE: the address and rkey of ``entry``'s memory, registered
    with remote READ (and WRITE, unless read-only) access on first use."""
    from pyverbs import enums as e

    device = open_device(state)
    held: Any = entry.attached.get("verbs")
    if held is None:
        region = entry.region
        access = e.IBV_ACCESS_REMOTE_READ
        if not region.readonly:
            access |= (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        try:
            held = device.register(region, region.nbytes, access)
        except Exception as exc:
            raise FallBack(f"the owner could not register RDMABuffer #{entry.buf_id} with "
                           f"{device.choice.device}: {exc}") from None
        entry.attached["verbs"] = held
        entry.closers.append(held[0].close)
    mr, base = held
    return int(base), int(mr.rkey)


async def accept_queue_pair(state: ProcState, peer: str, info: bytes) -> bytes:
    """The manager's ``verbs_connect``: a queue pair for requester ``peer``."""
    try:
        device = open_device(state)
        return device.accept(peer, info)
    except FallBack:
        raise
    except Exception as exc:
        raise FallBack(f"the owner could not connect a queue pair: {exc}") from None


# -- the backend ------------------------------------------------------------------------


class IbverbsBackend(Backend):
    name = "ibverbs"

    async def run(self, transfer: Transfer) -> None:
        from ._link import link_to

        ref, n = transfer.ref, transfer.nbytes
        state = current_state()
        device = open_device(state)
        from pyverbs import enums as e
        link = await link_to(ref)
        try:
            lease_id, remote, rkey = await link.verbs_lease(ref, n, transfer.write, transfer.ttl)
        except FallBack:
            _refused(state).add(_owner_key(ref))
            raise
        try:
            me = f"{state.host}/{state.pid}/{current_runtime().proc_id}"
            qp = await device.connection_to(ref, me)
            access = 0 if transfer.write else e.IBV_ACCESS_LOCAL_WRITE
            try:
                mr, local = device.register(transfer.local, n, access)
            except Exception as exc:
                raise FallBack(f"cannot register the local memory: {exc}") from None
            try:
                await device.move(qp, int(mr.lkey), local, remote, rkey, n, transfer.write,
                                  transfer.describe())
            finally:
                mr.close()
        finally:
            link.release_soon(lease_id)
