"""The verbs backend: detection, and a clear error when forced without support."""

from __future__ import annotations

import pytest

from regency.rdma import RDMABuffer, is_ibverbs_available, set_backend
from regency.rdma._ibverbs import IMPLEMENTED, devices, pyverbs_installed

from .conftest import T


def test_forcing_ibverbs_fails_with_the_reason() -> None:
    buf = RDMABuffer(memoryview(bytearray(16)))
    set_backend("ibverbs")
    try:
        with pytest.raises(RuntimeError, match=r"ibverbs backend needs pyverbs and an RDMA "
                           r"device \(pyverbs is (not )?installed; RDMA devices: .*\)"):
            buf.read_into(memoryview(bytearray(16))).get(T)
    finally:
        set_backend(None)
        buf.drop()


def _why_skip() -> str | None:
    if not (pyverbs_installed() and devices()):
        return (
            "needs pyverbs and an RDMA device (/sys/class/infiniband); this machine has "
            f"pyverbs: {'yes' if pyverbs_installed() else 'no'}, devices: {devices() or 'none'}"
        )
    if not IMPLEMENTED:
        return "the verbs data path is not implemented in this version"
    return None


@pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")
def test_ibverbs_read_and_write() -> None:  # pragma: no cover - needs hardware
    assert is_ibverbs_available()
