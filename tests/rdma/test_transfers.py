"""Transfers end to end between real processes, on each CPU backend, both directions."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from regency.actor import ActorMesh
from regency.rdma import (
    RDMAAction,
    RDMABuffer,
    RDMABufferDroppedError,
    get_rdma_backend,
    get_rdma_path,
    is_ibverbs_available,
    is_rdma_available,
    set_backend,
)
from regency.rdma._registry import registry

from .actors import Peer
from .conftest import T

#: Real processes: the slow tier (pytest -m "not slow" skips it).
pytestmark = pytest.mark.slow



def pattern(n: int, seed: int) -> bytes:
    """Distinct, position-dependent bytes (catches shifted or repeated chunks)."""
    block = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


# Sizes: tiny (inline copy), odd, and larger than the TCP chunk and the stripe size.
SIZES = [1, 4097, (16 << 20) + 3]


@pytest.mark.parametrize("n", SIZES)
def test_read_into_and_write_from_byte_for_byte(
    peers: ActorMesh[Peer], backend: str, n: int
) -> None:
    one = peers.slice(procs=0)
    buf: RDMABuffer = one.make.call_one("rw", pattern(n, 1)).get(T)
    assert buf.size() == n and buf.backend == backend
    dst = bytearray(n)
    assert buf.read_into(memoryview(dst)).get(T) is None
    assert dst == pattern(n, 1)
    assert buf.write_from(memoryview(pattern(n, 2))).get(T) is None
    assert one.contents.call_one("rw").get(T) == pattern(n, 2)
    assert one.leases.call_one("rw").get(T) == 0
    one.drop.call_one("rw").get(T)


def test_tensor_buffers_both_ways(peers: ActorMesh[Peer], backend: str) -> None:
    torch = pytest.importorskip("torch")
    one = peers.slice(procs=1)
    weights = torch.linspace(-1, 1, 1000, dtype=torch.float32)
    raw = bytes(weights.view(torch.uint8).tolist())
    buf = one.make.call_one("t", raw, "tensor").get(T)
    local = torch.zeros(1000, dtype=torch.float32)
    buf.read_into(local.view(torch.uint8).flatten()).get(T)
    assert torch.equal(local, weights)
    buf.write_from((weights * 2).view(torch.uint8)).get(T)
    assert one.contents.call_one("t").get(T) == bytes((weights * 2).view(torch.uint8).tolist())


def test_bigger_destination_gets_the_leading_bytes_and_smaller_source_writes_them(
    peers: ActorMesh[Peer], backend: str
) -> None:
    one = peers.slice(procs=0)
    buf = one.make.call_one("edges", pattern(1000, 3)).get(T)
    dst = bytearray(b"\xee" * 1500)
    buf.read_into(memoryview(dst)).get(T)
    assert dst[:1000] == pattern(1000, 3) and dst[1000:] == b"\xee" * 500
    buf.write_from(memoryview(b"x" * 10)).get(T)
    assert one.contents.call_one("edges").get(T) == b"x" * 10 + pattern(1000, 3)[10:]


def test_argument_errors_raise_at_the_call_naming_the_sizes(peers: ActorMesh[Peer]) -> None:
    buf = peers.slice(procs=0).make.call_one("sizes", pattern(100, 4)).get(T)
    with pytest.raises(ValueError, match=r"read_into destination is 99 bytes, smaller than "
                       r"RDMABuffer #\d+ \(100 bytes\) of proc \S+; it must hold at least 100"):
        buf.read_into(memoryview(bytearray(99)))
    with pytest.raises(ValueError, match=r"write_from source is 101 bytes, larger than "
                       r"RDMABuffer #\d+ \(100 bytes\) of proc \S+; it must be at most 100"):
        buf.write_from(memoryview(bytearray(101)))
    with pytest.raises(TypeError, match=r"read_into destination must be writable"):
        buf.read_into(memoryview(bytes(100)))
    with pytest.raises(ValueError, match=r"write_from source must not be empty"):
        buf.write_from(memoryview(b""))
    with pytest.raises(ValueError, match=r"timeout must be a positive number of seconds \(got 0\)"):
        buf.read_into(memoryview(bytearray(100)), timeout=0)
    with pytest.raises(ValueError, match=r"RDMABuffer memory must not be empty \(got 0 bytes\)"):
        RDMABuffer(memoryview(bytearray()))
    with pytest.raises(ValueError, match="must be a C-contiguous memoryview"):
        RDMABuffer(memoryview(bytearray(10))[::2])


def test_read_only_buffers_can_be_read_but_not_written(
    peers: ActorMesh[Peer], backend: str
) -> None:
    buf = peers.slice(procs=2).make.call_one("ro", b"constant", "readonly").get(T)
    dst = bytearray(8)
    buf.read_into(memoryview(dst)).get(T)
    assert dst == b"constant"
    with pytest.raises(TypeError, match=r"write_from into RDMABuffer #\d+ .* read-only memory"):
        buf.write_from(memoryview(b"x"))


def test_procs_read_each_other_and_the_controller(peers: ActorMesh[Peer], backend: str) -> None:
    n = (2 << 20) + 5
    theirs = peers.slice(procs=2).make.call_one("p2p", pattern(n, 5)).get(T)
    assert peers.slice(procs=0).read.call_one(theirs, n).get(T) == pattern(n, 5)
    assert peers.slice(procs=1).read_async.call_one(theirs, n).get(T) == pattern(n, 5)
    mine_memory = bytearray(pattern(n, 6))
    mine = RDMABuffer(memoryview(mine_memory))
    assert peers.slice(procs=1).read.call_one(mine, n).get(T) == pattern(n, 6)
    peers.slice(procs=2).write.call_one(mine, pattern(n, 7)).get(T)
    assert mine_memory == pattern(n, 7)
    # Within one process: a plain copy under the same checks.
    dst = bytearray(n)
    mine.read_into(memoryview(dst)).get(T)
    assert dst == pattern(n, 7)
    mine.drop().get(T)


def test_buffers_registered_and_read_in_async_endpoints(
    peers: ActorMesh[Peer], backend: str
) -> None:
    buf = peers.slice(procs=2).make_async.call_one("async", pattern(70000, 16)).get(T)
    assert peers.slice(procs=1).read_async.call_one(buf, 70000).get(T) == pattern(70000, 16)


def test_many_readers_at_once(peers: ActorMesh[Peer], backend: str) -> None:
    n = (4 << 20) + 1
    buf = peers.slice(procs=0).make.call_one("many", pattern(n, 8)).get(T)
    from_procs = peers.read.call(buf, n)
    outs = [bytearray(n) for _ in range(6)]
    futs = [buf.read_into(memoryview(o)) for o in outs]
    for f in futs:
        f.get(T)
    assert all(o == pattern(n, 8) for o in outs)
    assert all(v == pattern(n, 8) for v in from_procs.get(T).values())
    assert peers.slice(procs=0).leases.call_one("many").get(T) == 0


def test_concurrent_writes_into_one_buffer(peers: ActorMesh[Peer], backend: str) -> None:
    n = (3 << 20) + 7
    owner = peers.slice(procs=0)
    buf = owner.make.call_one("target", bytes(n)).get(T)
    # Three procs and the controller write at once; each source is one repeated byte, so
    # every byte of the result must come from one of them, whatever the interleaving.
    remote = [peers.slice(procs=i).write.call_one(buf, bytes([i + 1]) * n) for i in range(3)]
    local = [buf.write_from(memoryview(bytes([9]) * n)) for _ in range(3)]
    for f in remote + local:
        f.get(T)
    assert set(owner.contents.call_one("target").get(T)) <= {1, 2, 3, 9}
    buf.write_from(memoryview(pattern(n, 9))).get(T)
    assert owner.contents.call_one("target").get(T) == pattern(n, 9)


def test_rdma_action_batches_reads_and_writes(peers: ActorMesh[Peer], backend: str) -> None:
    a = peers.slice(procs=0).make.call_one("a", pattern(5000, 10)).get(T)
    b = peers.slice(procs=1).make.call_one("b", pattern(7000, 11)).get(T)
    c = peers.slice(procs=2).make.call_one("c", bytes(300)).get(T)
    out_a, out_b = bytearray(5000), bytearray(7000)
    action = (
        RDMAAction()
        .read_remote(memoryview(out_a), a)
        .read_into(b, memoryview(out_b))  # Monarch 0.7's spelling, buffer first
        .write_remote(c, memoryview(b"y" * 300))
    )
    action.submit().get(T)
    assert out_a == pattern(5000, 10) and out_b == pattern(7000, 11)
    assert peers.slice(procs=2).contents.call_one("c").get(T) == b"y" * 300
    out_a[:] = bytes(5000)
    action.submit().get(T)  # submitting again runs the batch again
    assert out_a == pattern(5000, 10)
    # From another proc, too.
    got = peers.slice(procs=2).batch.call_one([a, b], [(c, b"z" * 300)]).get(T)
    assert got == [pattern(5000, 10), pattern(7000, 11)]
    assert peers.slice(procs=2).contents.call_one("c").get(T) == b"z" * 300


def test_rdma_action_refuses_racing_local_memory_and_atomics(peers: ActorMesh[Peer]) -> None:
    a = peers.slice(procs=0).make.call_one("race", pattern(100, 12)).get(T)
    shared = memoryview(bytearray(100))
    with pytest.raises(ValueError, match=r"RDMAAction op #1 uses local memory that op #0 also "
                       r"uses, and at least one of them reads into it"):
        RDMAAction().read_remote(shared, a).write_from(a, shared[50:])
    RDMAAction().write_remote(a, shared).write_remote(a, shared)  # two reads of it: fine
    with pytest.raises(NotImplementedError, match="fetch_add"):
        RDMAAction().fetch_add(a, shared, 1)
    with pytest.raises(NotImplementedError, match="lists of local memory"):
        RDMAAction().read_into(a, [shared])
    assert RDMAAction().submit().get(T) is None


def test_drop_then_use_fails_everywhere(peers: ActorMesh[Peer], backend: str) -> None:
    owner = peers.slice(procs=1)
    buf = owner.make.call_one("dropme", pattern(4096, 13)).get(T)
    owner.drop.call_one("dropme").get(T)
    with pytest.raises(RDMABufferDroppedError, match=r"RDMABuffer #\d+ of pid \d+ was dropped"):
        buf.read_into(memoryview(bytearray(4096))).get(T)
    with pytest.raises(RDMABufferDroppedError):
        buf.write_from(memoryview(b"x")).get(T)
    # Dropped from another process: the owner forgets it, and the handle refuses at once.
    other = owner.make.call_one("dropme2", pattern(10, 14)).get(T)
    other.drop().get(T)
    other.drop().get(T)  # idempotent
    with pytest.raises(RDMABufferDroppedError, match=r"read_into on RDMABuffer #\d+ .* after "
                       r"drop\(\)"):
        other.read_into(memoryview(bytearray(10)))
    with pytest.raises(RDMABufferDroppedError):
        pickle.loads(pickle.dumps(other)).read_into(memoryview(bytearray(10))).get(T)


def test_handle_is_small_and_pickles(peers: ActorMesh[Peer]) -> None:
    buf = peers.slice(procs=0).make.call_one("pickled", pattern(1 << 20, 15)).get(T)
    blob = pickle.dumps(buf)
    assert len(blob) < 1024
    again = pickle.loads(blob)
    assert again.size() == 1 << 20 and again.owner == buf.owner
    assert repr(again).startswith(f"<RDMABuffer #{buf._ref.buf_id} 1048576 bytes of ")


def test_controller_buffers_are_dropped_in_process() -> None:
    mem = bytearray(b"hello")
    buf = RDMABuffer(memoryview(mem))
    assert buf._ref.buf_id in registry
    buf.drop().get(T)
    assert buf._ref.buf_id not in registry


def test_backend_queries_and_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_rdma_available() is True
    assert is_ibverbs_available() is False
    assert get_rdma_backend() == "tcp"  # Monarch's words: no NIC, a working fallback
    assert get_rdma_path() == "same_host"
    set_backend("tcp")
    try:
        assert get_rdma_path() == "tcp"
    finally:
        set_backend(None)
    monkeypatch.setenv("REGENCY_RDMA_BACKEND", "tcp")
    assert get_rdma_path() == "tcp"
    monkeypatch.setenv("REGENCY_RDMA_BACKEND", "infiniband")
    with pytest.raises(ValueError, match=r"REGENCY_RDMA_BACKEND must be one of \('auto', "
                       r"'same_host', 'tcp', 'ibverbs'\) \(got 'infiniband'\)"):
        get_rdma_path()
    with pytest.raises(ValueError, match=r"backend must be one of"):
        set_backend("rdma")


def test_auto_picks_a_backend_per_transfer(peers: ActorMesh[Peer]) -> None:
    small = peers.slice(procs=0).make.call_one("small", pattern(4096, 17)).get(T)
    large = peers.slice(procs=0).make.call_one("large", pattern(1 << 20, 18)).get(T)
    local = RDMABuffer(memoryview(bytearray(16)))
    # Small: one round trip on the data connection; large: a direct copy; own memory: memmove.
    assert (small.backend, large.backend, local.backend) == ("tcp", "same_host", "same_host")
    dst = bytearray(1 << 20)
    large.read_into(memoryview(dst)).get(T)
    small.read_into(memoryview(dst)).get(T)
    assert dst[:4096] == pattern(4096, 17) and dst[4096:] == pattern(1 << 20, 18)[4096:]
    set_backend("tcp")
    try:
        assert (large.backend, local.backend) == ("tcp", "tcp")
    finally:
        set_backend(None)
    local.drop()


def test_import_needs_no_torch() -> None:
    code = (
        "import sys, regency.rdma as r\n"
        "assert 'torch' not in sys.modules\n"
        "b = r.RDMABuffer(memoryview(bytearray(b'abc')))\n"
        "out = bytearray(3); b.read_into(memoryview(out)).get(10)\n"
        "assert out == b'abc' and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=T)


def test_data_listener_binds_where_the_runtime_is_reachable() -> None:
    from regency.rdma._link import _listen_host

    assert _listen_host("tcp://10.1.2.3:4000", "127.0.0.1") == "10.1.2.3"
    assert _listen_host("tcp://[::1]:4000", "127.0.0.1") == "::1"
    assert _listen_host("unix:///tmp/x/p.sock", "192.168.0.7") == "192.168.0.7"
