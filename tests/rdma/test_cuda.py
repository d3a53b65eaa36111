"""GPU memory: CUDA IPC on one host, staging through host memory over TCP.

Without a GPU only the error paths run; the transfers skip, saying so.
"""

from __future__ import annotations

import pytest

from regency.actor import ActorMesh
from regency.rdma import RDMAError
from regency.rdma._memory import region_of

from .actors import Peer
from .conftest import T

torch = pytest.importorskip("torch")

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (this machine has none; torch.cuda.is_available() is False)",
)


def pattern(n: int) -> bytes:
    return bytes((i * 13 + (i >> 8)) & 0xFF for i in range(n))


def test_mapping_gpu_memory_without_cuda_says_why() -> None:
    from regency.rdma import _cuda

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RDMAError, match=r"the buffer is GPU memory of a process on this host, "
                       r"and this process sees no CUDA device, so it cannot map it; use "
                       r"REGENCY_RDMA_BACKEND=tcp"):
        _cuda.open_export(((0, b"handle", 16, 0, b"", 0, b"", False), 0), 16)


def test_cpu_regions_stage_as_themselves() -> None:
    from regency.rdma import _cuda

    data = bytearray(b"0123456789")
    region = region_of(memoryview(data), "m", writable=True)
    assert not region.on_gpu and region.device == "cpu"
    assert bytes(_cuda.host_copy(region, 2, 3)) == b"234"
    _cuda.put(region, 4, memoryview(b"xy"))
    assert data == bytearray(b"0123xy6789")
    t = _cuda.as_tensor(region_of(memoryview(b"abc"), "m", writable=False), 3)
    assert bytes(t.tolist()) == b"abc"


@needs_gpu
def test_gpu_tensor_region() -> None:  # pragma: no cover - needs a GPU
    t = torch.arange(16, dtype=torch.uint8, device="cuda")
    region = region_of(t, "thing", writable=True)
    assert region.on_gpu and region.device == "cuda:0" and region.addr == t.data_ptr()


@needs_gpu
@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_gpu_buffers_both_ways(
    peers: ActorMesh[Peer], backend: str, where: str
) -> None:  # pragma: no cover - needs a GPU
    n = (5 << 20) + 3
    owner = peers.slice(procs=0)
    buf = owner.make.call_one("gpu", pattern(n), "cuda").get(T)
    assert buf._ref.device == "cuda:0"
    dst = torch.zeros(n, dtype=torch.uint8, device=where)
    buf.read_into(dst).get(T)
    assert bytes(dst.cpu().tolist()) == pattern(n)
    src = torch.flip(dst, (0,))
    buf.write_from(src).get(T)
    assert owner.contents.call_one("gpu").get(T) == pattern(n)[::-1]


@needs_gpu
def test_cpu_buffer_into_gpu_memory(
    peers: ActorMesh[Peer], backend: str
) -> None:  # pragma: no cover - needs a GPU
    n = (3 << 20) + 1
    buf = peers.slice(procs=1).make.call_one("host", pattern(n)).get(T)
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(T)
    assert bytes(dst.cpu().tolist()) == pattern(n)
    buf.write_from(torch.flip(dst, (0,))).get(T)
    assert peers.slice(procs=1).contents.call_one("host").get(T) == pattern(n)[::-1]
