"""The pure parts of the verbs backend: no pyverbs, no device, tested everywhere.

* :class:`QueuePairInfo`: what one side of an RC queue pair tells the other (over the control
  plane, through the owner's RDMA manager) so that both can move to RTR and RTS.
* :func:`scan_ports` / :func:`choose_port`: which device, port and GID index to use, from the
  kernel's sysfs view of the RDMA devices (or any tree shaped like it) and the environment.
* :func:`plan_chunks`: one work request may move at most the port's ``max_msg_sz`` bytes.
* :func:`completion_error`: a failed work completion, in words.

Enum values are those of ``<infiniband/verbs.h>``, which is ABI: they never change.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

import attrs

#: ``enum ibv_mtu``: value -> bytes.
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}

#: ``enum ibv_wc_status``: value -> (name, what it usually means).
WC_STATUS: dict[int, tuple[str, str]] = {
    0: ("IBV_WC_SUCCESS", "success"),
    1: ("IBV_WC_LOC_LEN_ERR", "local length error"),
    2: ("IBV_WC_LOC_QP_OP_ERR", "local queue pair operation error"),
    3: ("IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error"),
    4: ("IBV_WC_LOC_PROT_ERR", "local protection error: the local memory is not registered "
        "for this access"),
    5: ("IBV_WC_WR_FLUSH_ERR", "flushed: an earlier request on this queue pair failed"),
    6: ("IBV_WC_MW_BIND_ERR", "memory window bind error"),
    7: ("IBV_WC_BAD_RESP_ERR", "bad response from the remote side"),
    8: ("IBV_WC_LOC_ACCESS_ERR", "local access error"),
    9: ("IBV_WC_REM_INV_REQ_ERR", "the remote side found the request invalid"),
    10: ("IBV_WC_REM_ACCESS_ERR", "remote access error: the rkey or address range is not "
         "valid at the owner (was the buffer dropped?)"),
    11: ("IBV_WC_REM_OP_ERR", "remote operation error"),
    12: ("IBV_WC_RETRY_EXC_ERR", "transport retries exceeded: the owner's port is unreachable "
         "over the fabric (check REGENCY_RDMA_DEVICE / REGENCY_RDMA_GID_INDEX on both sides)"),
    13: ("IBV_WC_RNR_RETRY_EXC_ERR", "receiver-not-ready retries exceeded"),
    14: ("IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation"),
    15: ("IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request"),
    16: ("IBV_WC_REM_ABORT_ERR", "the remote side aborted the operation"),
    17: ("IBV_WC_INV_EECN_ERR", "invalid EE context number"),
    18: ("IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state"),
    19: ("IBV_WC_FATAL_ERR", "fatal device error"),
    20: ("IBV_WC_RESP_TIMEOUT_ERR", "response timeout"),
    21: ("IBV_WC_GENERAL_ERR", "general error"),
    22: ("IBV_WC_TM_ERR", "tag matching error"),
    23: ("IBV_WC_TM_RNDV_INCOMPLETE", "tag matching rendezvous incomplete"),
}


def completion_error(status: int, vendor_err: int, detail: str = "") -> str:
    """``work completion IBV_WC_REM_ACCESS_ERR (10, remote access error: ...)[, vendor error
    0x..]``; ``detail`` (the provider's own status string) is added in brackets when it says
    something the table does not."""
    name, meaning = WC_STATUS.get(status, (f"status {status}", "unknown status"))
    text = f"work completion {name} ({status}, {meaning})"
    if detail and detail.lower() not in meaning.lower():
        text += f" [{detail}]"
    if vendor_err:
        text += f", vendor error {vendor_err:#x}"
    return text


# -- queue-pair details ---------------------------------------------------------------------


@attrs.frozen
class QueuePairInfo:
    """One side of an RC connection, as the other side needs it for INIT -> RTR -> RTS."""

    #: The queue pair's number (24 bits).
    qp_num: int
    #: The port's LID (16 bits; 0 on RoCE, where the GID addresses the port).
    lid: int
    #: The port's GID at the chosen index: 16 bytes (all zero when not used).
    gid: bytes
    #: The first packet sequence number this side sends (24 bits).
    psn: int
    #: The port's active MTU, an ``enum ibv_mtu`` value (1..5).
    mtu: int

    _FORMAT = struct.Struct("<4sIIHB16s")
    _MAGIC = b"RQP1"

    def __attrs_post_init__(self) -> None:
        _check_bits("qp_num", self.qp_num, 24)
        _check_bits("lid", self.lid, 16)
        _check_bits("psn", self.psn, 24)
        if not isinstance(self.gid, bytes) or len(self.gid) != 16:
            raise ValueError(f"gid must be 16 bytes (got {self.gid!r})")
        if self.mtu not in MTU_BYTES:
            raise ValueError(f"mtu must be an ibv_mtu value, one of 1..5 (got {self.mtu!r})")

    def pack(self) -> bytes:
        return self._FORMAT.pack(self._MAGIC, self.qp_num, self.psn, self.lid, self.mtu, self.gid)

    @classmethod
    def unpack(cls, data: bytes) -> QueuePairInfo:
        if not isinstance(data, bytes) or len(data) != cls._FORMAT.size:
            got = f"{len(data)} bytes" if isinstance(data, bytes) else type(data).__name__
            raise ValueError(
                f"queue-pair details must be {cls._FORMAT.size} bytes (got {got})"
            )
        magic, qp_num, psn, lid, mtu, gid = cls._FORMAT.unpack(data)
        if magic != cls._MAGIC:
            raise ValueError(f"queue-pair details must start with {cls._MAGIC!r} (got {magic!r})")
        return cls(qp_num=qp_num, lid=lid, gid=gid, psn=psn, mtu=mtu)

    @property
    def has_gid(self) -> bool:
        return any(self.gid)


def _check_bits(name: str, value: int, bits: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise ValueError(f"{name} must be an integer in [0, 2**{bits}) (got {value!r})")


def path_mtu(mine: int, theirs: int) -> int:
    """The MTU both ports support (``enum ibv_mtu`` values order like their sizes)."""
    return min(mine, theirs)


def gid_text(raw: bytes) -> str:
    """16 raw bytes as pyverbs and sysfs write a GID: ``fe80:0000:...`` (8 groups of 4)."""
    if len(raw) != 16:
        raise ValueError(f"a GID is 16 bytes (got {len(raw)})")
    return ":".join(raw[i : i + 2].hex() for i in range(0, 16, 2))


def gid_bytes(text: str) -> bytes:
    """The inverse of :func:`gid_text`."""
    groups = text.strip().split(":")
    if len(groups) != 8 or not all(len(g) == 4 for g in groups):
        raise ValueError(f"a GID must look like 'fe80:0000:0000:0000:0000:0000:0000:0001' "
                         f"(got {text!r})")
    try:
        return bytes.fromhex("".join(groups))
    except ValueError:
        raise ValueError(f"a GID must be hexadecimal groups (got {text!r})") from None


# -- which device, port and GID ----------------------------------------------------------


@attrs.frozen
class PortInfo:
    device: str
    port: int
    active: bool
    #: ``"InfiniBand"`` or ``"Ethernet"`` (RoCE).
    link_layer: str
    #: GID index -> (GID text, type: ``"IB/RoCE v1"``, ``"RoCE v2"`` or ``""``); zero GIDs
    #: are left out.
    gids: Mapping[int, tuple[str, str]]


@attrs.frozen
class PortChoice:
    device: str
    port: int
    gid_index: int
    link_layer: str
    #: Whether packets carry a global route header (RoCE always; InfiniBand when a GID index
    #: was asked for).
    use_grh: bool


ENV_DEVICE = "REGENCY_RDMA_DEVICE"
ENV_PORT = "REGENCY_RDMA_PORT"
ENV_GID_INDEX = "REGENCY_RDMA_GID_INDEX"

_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def scan_ports(
    root: str, listdir: Callable[[str], list[str]], read: Callable[[str], str | None]
) -> list[PortInfo]:
    """Every port of every device under ``root`` (``/sys/class/infiniband``), read through
    ``listdir`` and ``read`` (None for a file that cannot be read)."""
    found: list[PortInfo] = []
    for device in sorted(listdir(root)):
        ports_dir = f"{root}/{device}/ports"
        for name in sorted(listdir(ports_dir), key=lambda n: (not n.isdigit(), n.zfill(8))):
            if not name.isdigit():
                continue
            base = f"{ports_dir}/{name}"
            state = read(f"{base}/state") or ""
            gids: dict[int, tuple[str, str]] = {}
            for index in sorted(listdir(f"{base}/gids"), key=lambda n: n.zfill(8)):
                if not index.isdigit():
                    continue
                gid = (read(f"{base}/gids/{index}") or "").strip()
                if gid and gid != _ZERO_GID:
                    kind = (read(f"{base}/gid_attrs/types/{index}") or "").strip()
                    gids[int(index)] = (gid, kind)
            found.append(
                PortInfo(
                    device=device,
                    port=int(name),
                    # "4: ACTIVE"
                    active=state.strip().endswith("ACTIVE"),
                    link_layer=(read(f"{base}/link_layer") or "InfiniBand").strip(),
                    gids=gids,
                )
            )
    return found


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{name} must be a non-negative integer (got {value!r})")
    return int(value)


def _default_gid(port: PortInfo) -> int | None:
    """RoCE: a RoCE v2 GID holding an IPv4 address, else any RoCE v2 GID, else any GID.
    InfiniBand: index 0 (the port GID)."""
    if port.link_layer != "Ethernet":
        return 0 if 0 in port.gids or not port.gids else min(port.gids)
    v2 = [i for i, (_, kind) in port.gids.items() if kind == "RoCE v2"]
    ipv4 = [i for i in v2 if port.gids[i][0].startswith("0000:0000:0000:0000:0000:ffff:")]
    for candidates in (ipv4, v2, list(port.gids)):
        if candidates:
            return min(candidates)
    return None


def choose_port(ports: list[PortInfo], env: Mapping[str, str]) -> PortChoice:
    """The device, port and GID index to use: the first device (by name) with an active port,
    its first active port and the best GID for its link layer, unless ``REGENCY_RDMA_DEVICE``,
    ``REGENCY_RDMA_PORT`` or ``REGENCY_RDMA_GID_INDEX`` in ``env`` say otherwise."""
    want_device = env.get(ENV_DEVICE, "").strip() or None
    want_port = _env_int(env, ENV_PORT)
    want_gid = _env_int(env, ENV_GID_INDEX)
    names = sorted({p.device for p in ports})
    if not ports:
        raise LookupError("no RDMA device found (none in /sys/class/infiniband)")
    if want_device is not None and want_device not in names:
        raise LookupError(f"{ENV_DEVICE} must name an RDMA device, one of {tuple(names)} "
                          f"(got {want_device!r})")
    candidates = [p for p in ports if want_device in (None, p.device)]
    if want_port is not None:
        numbered = [p for p in candidates if p.port == want_port]
        if not numbered:
            have = tuple(sorted({p.port for p in candidates}))
            raise LookupError(f"{ENV_PORT} must be a port of the chosen device, one of {have} "
                              f"(got {want_port})")
        candidates = numbered
    active = [p for p in candidates if p.active]
    if not active:
        which = ", ".join(f"{p.device} port {p.port}" for p in candidates)
        raise LookupError(f"no active RDMA port ({which} are down)")
    port = active[0]
    if want_gid is not None:
        if want_gid not in port.gids:
            raise LookupError(
                f"{ENV_GID_INDEX} must be the index of a GID of {port.device} port {port.port}, "
                f"one of {tuple(sorted(port.gids))} (got {want_gid})"
            )
        gid_index = want_gid
    else:
        found = _default_gid(port)
        if found is None:
            raise LookupError(f"{port.device} port {port.port} is RoCE but has no GID "
                              "(is an IP address assigned to its interface?)")
        gid_index = found
    use_grh = port.link_layer == "Ethernet" or want_gid is not None
    return PortChoice(port.device, port.port, gid_index, port.link_layer, use_grh)


# -- work requests ------------------------------------------------------------------------

#: No work request moves more than this, whatever the port allows: a transfer of several such
#: pieces keeps several requests in flight.
MAX_CHUNK = 1 << 30


def plan_chunks(nbytes: int, max_msg: int, cap: int = MAX_CHUNK) -> list[tuple[int, int]]:
    """``(offset, length)`` pieces covering ``[0, nbytes)``, none longer than the port's
    ``max_msg`` (``max_msg_sz``) or ``cap``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0 (got {nbytes})")
    if max_msg <= 0 or cap <= 0:
        raise ValueError(f"max_msg and cap must be positive (got {max_msg}, {cap})")
    step = min(max_msg, cap)
    return [(offset, min(step, nbytes - offset)) for offset in range(0, nbytes, step)]
