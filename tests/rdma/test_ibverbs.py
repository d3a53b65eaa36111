"""The verbs backend: a clear error when forced without support, the pyverbs records it
builds (where pyverbs is installed, no device needed), and real transfers (with a device)."""

from __future__ import annotations

import importlib.util

import pytest

from regency.actor import ActorMesh
from regency.rdma import RDMABuffer, get_rdma_backend, is_ibverbs_available, set_backend
from regency.rdma._ibverbs import (
    devices,
    init_attr,
    pyverbs_installed,
    rtr_attr,
    rts_attr,
    work_request,
)
from regency.rdma._verbs_info import MTU_BYTES, WC_STATUS, QueuePairInfo, gid_bytes

from .actors import Peer
from .conftest import T

NO_PYVERBS = importlib.util.find_spec("pyverbs") is None


def test_forcing_ibverbs_without_support_fails_with_the_reason() -> None:
    if is_ibverbs_available():
        pytest.skip("this machine has pyverbs and an RDMA device")
    buf = RDMABuffer(memoryview(bytearray(16)))
    set_backend("ibverbs")
    try:
        assert get_rdma_backend() == "ibverbs"
        with pytest.raises(RuntimeError, match=r"ibverbs backend needs pyverbs and an RDMA "
                           r"device \(pyverbs is (not )?installed; RDMA devices: .*\); install "
                           r"the extra with pip install 'regency\[rdma\]'"):
            buf.read_into(memoryview(bytearray(16))).get(T)
    finally:
        set_backend(None)
        buf.drop()


def test_auto_never_picks_verbs_without_a_device(peers: ActorMesh[Peer]) -> None:
    if is_ibverbs_available():
        pytest.skip("this machine has pyverbs and an RDMA device")
    # Before any buffer exists, auto has already ruled verbs out on this machine.
    assert get_rdma_backend() in ("same_host", "tcp")
    buf = peers.slice(procs=0).make.call_one("noverbs", b"v" * (1 << 20)).get(T)
    assert buf.backend == "same_host"
    assert get_rdma_backend() == "tcp"


# -- the pyverbs records, built without a device ------------------------------------------

needs_pyverbs = pytest.mark.skipif(
    NO_PYVERBS, reason="needs pyverbs (pip install 'regency[rdma]' or Debian python3-pyverbs)"
)


@needs_pyverbs
def test_enum_tables_match_pyverbs() -> None:
    from pyverbs import enums as e

    for value, (name, _) in WC_STATUS.items():
        assert getattr(e, name) == value, name
    for value, size in MTU_BYTES.items():
        assert getattr(e, f"IBV_MTU_{size}") == value


@needs_pyverbs
def test_queue_pair_transitions_carry_what_the_peer_sent() -> None:
    from pyverbs import enums as e

    attr, mask = init_attr(2)
    assert (attr.qp_state, attr.port_num, attr.pkey_index) == (e.IBV_QPS_INIT, 2, 0)
    assert attr.qp_access_flags & e.IBV_ACCESS_REMOTE_READ
    assert attr.qp_access_flags & e.IBV_ACCESS_REMOTE_WRITE
    assert mask == e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS

    gid = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
    remote = QueuePairInfo(qp_num=77, lid=5, gid=gid_bytes(gid), psn=0x1234, mtu=3)
    attr, mask = rtr_attr(1, 5, 16, remote, sgid_index=3)
    assert (attr.qp_state, attr.dest_qp_num, attr.rq_psn, attr.path_mtu) == (
        e.IBV_QPS_RTR, 77, 0x1234, 3
    )
    assert attr.max_dest_rd_atomic == 16
    ah = attr.ah_attr
    assert (ah.dlid, ah.is_global, ah.port_num, ah.sgid_index, ah.dgid) == (5, 1, 1, 3, gid)
    assert mask & e.IBV_QP_AV and mask & e.IBV_QP_DEST_QPN and mask & e.IBV_QP_RQ_PSN
    plain, _ = rtr_attr(1, 5, 16, remote, sgid_index=None)
    assert plain.ah_attr.is_global == 0

    attr, mask = rts_attr(1, 0xABCDE, 8)
    assert (attr.qp_state, attr.sq_psn, attr.max_rd_atomic, attr.retry_cnt) == (
        e.IBV_QPS_RTS, 0xABCDE, 8, 7
    )
    assert mask & e.IBV_QP_SQ_PSN and mask & e.IBV_QP_MAX_QP_RD_ATOMIC


@needs_pyverbs
def test_work_requests_are_signalled_one_sided_reads_and_writes() -> None:
    read = work_request(1, False, 0x1000, 4096, 11, 0x9000, 22)
    write = work_request(2, True, 0x1000, 4096, 11, 0x9000, 22)
    from pyverbs import enums as e

    assert (read.opcode, write.opcode) == (e.IBV_WR_RDMA_READ, e.IBV_WR_RDMA_WRITE)
    assert read.send_flags == e.IBV_SEND_SIGNALED and read.num_sge == 1
    assert read.wr_id == 1


# -- with a device ------------------------------------------------------------------------


def _why_skip() -> str | None:
    if not (pyverbs_installed() and devices()):
        return (
            "needs pyverbs and an RDMA device (/sys/class/infiniband); this machine has "
            f"pyverbs: {'yes' if pyverbs_installed() else 'no'}, devices: {devices() or 'none'}"
        )
    return None


@pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")
def test_ibverbs_read_and_write(peers: ActorMesh[Peer]) -> None:  # pragma: no cover
    n = (3 << 20) + 5
    data = bytes(i * 7 & 0xFF for i in range(n))
    owner, reader = peers.slice(procs=0), peers.slice(procs=1)
    buf = owner.make.call_one("verbs", data).get(T)
    reader.use_backend.call_one("ibverbs").get(T)
    set_backend("ibverbs")
    try:
        assert reader.read.call_one(buf, n).get(T) == data
        reader.write.call_one(buf, data[::-1]).get(T)
        assert owner.contents.call_one("verbs").get(T) == data[::-1]
        out = bytearray(n)
        buf.read_into(memoryview(out)).get(T)
        assert out == data[::-1]
    finally:
        set_backend(None)
        reader.use_backend.call_one(None).get(T)
