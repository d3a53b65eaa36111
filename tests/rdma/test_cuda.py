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


# -- sizes, offsets, several readers, drops, ordering (session 6: these ran on an H100) ------

GiB = 1 << 30


@needs_gpu
@pytest.mark.parametrize("n", [1, 4097, (5 << 20) + 3])
@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_gpu_buffer_sizes_and_offsets(
    peers: ActorMesh[Peer], backend: str, where: str, n: int
) -> None:  # pragma: no cover - needs a GPU
    """An owner's buffer that starts 3 bytes into a CUDA tensor, read into and written from
    local memory that starts 5 bytes into a tensor: every byte lands, none around it moves."""
    from .actors import gpu_pattern

    owner = peers.slice(procs=0)
    buf = owner.make_gpu.call_one("sized", n, 7, 3).get(T)
    assert buf.size() == n
    local = torch.full((n + 11,), 0xAB, dtype=torch.uint8, device=where)
    buf.read_into(local[5 : 5 + n]).get(T)
    assert torch.equal(local[5 : 5 + n].cuda(), gpu_pattern(n, 7))
    assert bool((local[:5] == 0xAB).all()) and bool((local[5 + n :] == 0xAB).all())
    local[5 : 5 + n] = torch.flip(local[5 : 5 + n], (0,))
    buf.write_from(local[5 : 5 + n]).get(T)
    assert owner.gpu_matches.call_one("sized", n, 7, 3, True).get(T)
    owner.drop.call_one("sized").get(T)


@needs_gpu
@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_one_gib_each_way(
    peers: ActorMesh[Peer], backend: str, where: str
) -> None:  # pragma: no cover - needs a GPU
    from .actors import gpu_pattern

    owner = peers.slice(procs=0)
    buf = owner.make_gpu.call_one("gib", GiB, 11).get(60)
    local = torch.empty(GiB, dtype=torch.uint8, device=where)
    buf.read_into(local).get(120)
    assert torch.equal(local.cuda(), gpu_pattern(GiB, 11))
    local.copy_(torch.flip(local, (0,)))
    buf.write_from(local).get(120)
    assert owner.gpu_matches.call_one("gib", GiB, 11, 0, True).get(60)
    buf.drop().get(T)  # from the reader: it unmaps the buffer too
    assert owner.forget.call_one("gib").get(60) < GiB  # so the gigabyte was freed
    del local
    torch.cuda.empty_cache()


@needs_gpu
def test_several_readers_map_one_gpu_buffer(
    peers: ActorMesh[Peer], backend: str
) -> None:  # pragma: no cover - needs a GPU
    """Two procs and the controller read one GPU buffer at once, each into its own memory."""
    n = (3 << 20) + 5
    buf = peers.slice(procs=0).make_gpu.call_one("shared", n, 3).get(T)
    readers = peers.slice(procs=slice(1, 3))
    futures = [readers.read_gpu.call(buf, 3, where) for where in ("cuda", "cpu")]
    from .actors import gpu_pattern

    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    buf.read_into(dst).get(T)
    assert torch.equal(dst, gpu_pattern(n, 3))
    for fut in futures:
        assert all(v for _, v in fut.get(T).items())
    peers.slice(procs=0).drop.call_one("shared").get(T)


@needs_gpu
def test_dropped_while_mapped_fails_and_frees(
    peers: ActorMesh[Peer],
) -> None:  # pragma: no cover - needs a GPU
    """A reader maps a GPU buffer through CUDA IPC; the owner drops it and lets its memory
    go. The reader's next read fails with RDMABufferDroppedError, its mapping is closed, and
    the owner's allocator gets the memory back (torch keeps an IPC-shared block until every
    mapping of it is closed)."""
    from regency.actor import ActorError

    owner, reader = peers.slice(procs=0), peers.slice(procs=1)
    reader.use_backend.call_one("same_host").get(T)
    try:
        before = owner.gpu_allocated.call_one().get(T)
        n = 64 << 20
        buf = owner.make_gpu.call_one("mapped", n, 5).get(T)
        assert reader.read_gpu.call_one(buf, 5).get(T)
        assert reader.mapped.call_one().get(T) >= 1
        mapped = reader.mapped.call_one().get(T)
        owner.forget.call_one("mapped").get(T)
        with pytest.raises(ActorError, match=r"RDMABufferDroppedError: RDMABuffer #\d+ .* was dropped"):
            reader.read_gpu.call_one(buf, 5).get(T)
        assert reader.mapped.call_one().get(T) == mapped - 1
        assert owner.gpu_allocated.call_one().get(T) <= before
    finally:
        reader.use_backend.call_one(None).get(T)


@needs_gpu
def test_a_process_that_never_used_cuda_maps_gpu_memory(
    peers: ActorMesh[Peer],
) -> None:  # pragma: no cover - needs a GPU
    """A fresh proc whose first CUDA call is the mapping (it reads into CPU memory)."""
    from regency.actor import this_host

    n = 1 << 20
    buf = peers.slice(procs=0).make_gpu.call_one("fresh", n, 9).get(T)
    pm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        fresh = pm.spawn("fresh", Peer)
        assert not fresh.cuda_used.call_one().get(T)
        got = fresh.read.call_one(buf, n).get(T)
        from .actors import gpu_pattern

        assert got == bytes(gpu_pattern(n, 9).cpu().tolist())
        assert fresh.mapped.call_one().get(T) == 1  # it went through CUDA IPC
    finally:
        pm.stop().get(T)
    peers.slice(procs=0).drop.call_one("fresh").get(T)


@needs_gpu
@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_work_queued_on_another_stream_comes_first(
    peers: ActorMesh[Peer], backend: str, where: str
) -> None:  # pragma: no cover - needs a GPU
    """The owner queues, on a side stream, work that ends by writing the buffer, and
    returns at once; a read asked for after that sees the written bytes."""
    owner = peers.slice(procs=0)
    n = 1 << 20
    buf = owner.make_gpu.call_one("late", n, 1).get(T)
    owner.fill_late.call_one("late", 42).get(T)
    dst = torch.zeros(n, dtype=torch.uint8, device=where)
    buf.read_into(dst).get(T)
    assert bool((dst == 42).all())
    owner.drop.call_one("late").get(T)


@needs_gpu
def test_mapping_a_new_buffer_unmaps_dropped_ones(
    peers: ActorMesh[Peer],
) -> None:  # pragma: no cover - needs a GPU
    """A parameter server that registers a fresh GPU buffer each step and drops the last:
    a reader that maps the new one closes its mappings of the dropped ones, so the owner's
    memory does not grow with the steps."""
    owner, reader = peers.slice(procs=0), peers.slice(procs=2)
    reader.use_backend.call_one("same_host").get(T)
    try:
        n = 32 << 20
        before = owner.gpu_allocated.call_one().get(T)
        first = 0
        for step in range(4):
            buf = owner.make_gpu.call_one(f"step{step}", n, step).get(T)
            if step:
                owner.forget.call_one(f"step{step - 1}").get(T)  # still mapped by the reader
            assert reader.read_gpu.call_one(buf, step).get(T)
            mapped = reader.mapped.call_one().get(T)
            first = first or mapped
            assert mapped == first  # the dropped one was unmapped as the new one was mapped
        # One live buffer (and the dropped one of the last step, if torch still holds it).
        assert owner.gpu_allocated.call_one().get(T) <= before + 2 * (n + 4096)
        owner.forget.call_one("step3").get(T)
    finally:
        reader.use_backend.call_one(None).get(T)


@needs_gpu
@pytest.mark.parametrize("where", ["cuda", "cpu"])
def test_gpu_buffer_of_this_process(where: str) -> None:  # pragma: no cover - needs a GPU
    """A buffer registered in the process that reads it: one device copy, no IPC."""
    from regency.rdma import RDMABuffer

    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    buf = RDMABuffer(src)
    dst = torch.zeros(1000, dtype=torch.int32, device=where)
    buf.read_into(dst).get(T)
    assert dst.tolist() == list(range(1000))
    buf.write_from(dst * 2).get(T)
    assert src.tolist() == [2 * i for i in range(1000)]
    buf.drop().get(T)


@needs_gpu
def test_dmabuf_export_of_gpu_memory() -> None:  # pragma: no cover - needs a GPU
    """The verbs backend's GPU registration starts from a dma-buf of the allocation; the
    driver call and its ctypes signature, without a NIC."""
    import os

    from regency.rdma import _cuda

    t = torch.zeros(3 << 20, dtype=torch.uint8, device="cuda")
    region = region_of(t[12345:], "gpu", writable=True)
    try:
        fd, offset = _cuda.dmabuf(region)
    except RDMAError as exc:
        if "NOT_SUPPORTED" in str(exc) or "no dma-buf export" in str(exc):
            pytest.skip(f"this driver exports no dma-buf: {exc}")
        raise
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        assert 0 <= offset < page and (region.addr - offset) % page == 0
        assert os.fstat(fd).st_size >= region.nbytes + offset or os.fstat(fd).st_size == 0
    finally:
        os.close(fd)


@needs_gpu
def test_owner_answers_on_its_event_loop_while_its_gpu_is_busy(
    peers: ActorMesh[Peer], backend: str
) -> None:  # pragma: no cover - needs a GPU
    """The owner synchronises its device before serving a transfer, off its event loop: while
    a read waits for seconds of queued GPU work, the proc's event loop (its heartbeats, its RDMA
    manager) keeps answering; the read then sees what that work wrote."""
    owner = peers.slice(procs=0)
    n = 1 << 20
    buf = owner.make_gpu.call_one("busy", n, 1).get(T)
    owner.busy_then_fill.call_one("busy", 42, 6_000_000_000).get(T)  # seconds of spinning
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    reading = buf.read_into(dst, timeout=T)
    buf._ref.manager.data_address.call_one().get(T)  # an async endpoint: the proc's loop
    assert not reading.done()  # the loop answered while the read still waits for the GPU
    reading.get(T)
    assert bool((dst == 42).all())
    owner.drop.call_one("busy").get(T)


@needs_gpu
def test_a_batch_mixing_gpu_and_cpu_memory(
    peers: ActorMesh[Peer], backend: str
) -> None:  # pragma: no cover - needs a GPU
    """One RDMAAction: a GPU buffer read into GPU memory, a CPU buffer read into GPU memory,
    and GPU memory written into another proc's GPU buffer, concurrently."""
    from regency.rdma import RDMAAction

    from .actors import gpu_pattern

    n = (2 << 20) + 9
    gpu_buf = peers.slice(procs=0).make_gpu.call_one("batch_gpu", n, 21).get(T)
    cpu_buf = peers.slice(procs=1).make.call_one("batch_cpu", pattern(n)).get(T)
    target = peers.slice(procs=2).make_gpu.call_one("batch_target", n, 0).get(T)
    a = torch.zeros(n, dtype=torch.uint8, device="cuda")
    b = torch.zeros(n, dtype=torch.uint8, device="cuda")
    src = torch.flip(gpu_pattern(n, 22), (0,))
    RDMAAction().read_remote(a, gpu_buf).read_remote(b, cpu_buf).write_remote(
        target, src
    ).submit(timeout=T).get(T)
    assert torch.equal(a, gpu_pattern(n, 21))
    assert bytes(b.cpu().tolist()) == pattern(n)
    assert peers.slice(procs=2).gpu_matches.call_one("batch_target", n, 22, 0, True).get(T)
    for proc, name in ((0, "batch_gpu"), (1, "batch_cpu"), (2, "batch_target")):
        peers.slice(procs=proc).drop.call_one(name).get(T)
