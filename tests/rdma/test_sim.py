"""RDMA buffers in a simulated cluster: the bytes go over the simulated network, so runs are
deterministic and the simulator's faults (crashes, partitions, clogs) apply to transfers."""

from __future__ import annotations

from typing import Any

import pytest

from regency.rdma import RDMABuffer, RDMAOwnerLostError, get_rdma_backend, set_backend
from regency.sim._cluster import current, simulate

from ..conftest import RootFailures
from .actors import Peer


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed * 7 + (i >> 9)) & 0xFF for i in range(n))


N = (2 << 20) + 17  # more than two DATA chunks


def transfers(hosts: Any) -> dict[str, Any]:
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    peers = procs.spawn("simpeers", Peer)
    owner, other = peers.slice(hosts=0), peers.slice(hosts=1)
    buf: RDMABuffer = owner.make.call_one("b", pattern(N, 1)).get()
    out = bytearray(N)
    buf.read_into(memoryview(out)).get()  # controller <- host0
    from_peer = other.read.call_one(buf, N).get()  # host1 <- host0
    other.write.call_one(buf, pattern(N, 2)).get()  # host1 -> host0
    after_write = owner.contents.call_one("b").get()
    # The controller's own buffer, read by a simulated proc.
    mine = bytearray(pattern(4097, 3))
    local = RDMABuffer(memoryview(mine))
    from_controller = other.read.call_one(local, 4097).get()
    copy = bytearray(4097)
    local.read_into(memoryview(copy)).get()  # within one simulated proc: a plain copy
    return {
        "read": out == pattern(N, 1),
        "peer_read": from_peer == pattern(N, 1),
        "write": after_write == pattern(N, 2),
        "controller_buffer": from_controller == pattern(4097, 3) and copy == mine,
        "backends": (buf.backend, local.backend, get_rdma_backend()),
    }


def test_transfers_are_byte_exact_over_the_simulated_network() -> None:
    result = simulate(transfers, seed=11, hosts=2)
    assert result.value == {
        "read": True, "peer_read": True, "write": True, "controller_buffer": True,
        "backends": ("tcp", "same_host", "tcp"),
    }
    # The bytes crossed the simulated network: DATA frames of 1 MiB were delivered.
    assert any(e.kind == "deliver" and e.detail.endswith(f"{(1 << 20) + 13}B")
               for e in result.events)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.slow
def test_same_seed_same_trace(seed: int) -> None:
    first = simulate(transfers, seed=seed, hosts=2)
    second = simulate(transfers, seed=seed, hosts=2)
    assert first.trace_hash == second.trace_hash
    assert first.events == second.events


def test_forced_same_host_is_refused_in_a_simulation() -> None:
    def program(hosts: Any) -> str:
        peers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("forced", Peer)
        buf = peers.slice(hosts=0).make.call_one("b", b"abc").get()
        set_backend("same_host")
        try:
            buf.read_into(memoryview(bytearray(3))).get()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            set_backend(None)
        return "no error"

    value = simulate(program, seed=3, hosts=1).value
    assert value.startswith("RDMAError: the same_host backend cannot reach RDMABuffer #1 ")
    assert "in a simulated cluster" in value


def test_owner_crash_fails_the_transfer(roots: RootFailures) -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        peers = procs.spawn("simvictim", Peer)
        owner = peers.slice(hosts=0)
        buf = owner.make.call_one("b", pattern(N, 4)).get()
        out = memoryview(bytearray(N))
        buf.read_into(out).get()  # the data connection is up
        current().crash_proc(procs._procs[0][1])
        try:
            buf.read_into(out, timeout=600).get()
        except RDMAOwnerLostError as exc:
            return f"lost: {exc}"
        return "no error"

    value = simulate(program, seed=5, hosts=2).value
    assert value.startswith("lost: the owner of RDMABuffer #1 (2097169 bytes) of proc ")
    assert roots.wait_for("simvictim").ranks == (0,)


def test_owner_crash_mid_transfer_fails_it(roots: RootFailures) -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        peers = procs.spawn("simmid", Peer)
        buf = peers.slice(hosts=0).make.call_one("b", pattern(N, 5)).get()
        buf.read_into(memoryview(bytearray(N))).get()
        sim = current()
        sim.clog("host0", 5.0)  # the owner's answer is held: the read stays in flight
        pending = buf.read_into(memoryview(bytearray(N)), timeout=600)
        sim.crash_proc(procs._procs[0][1])
        try:
            pending.get()
        except RDMAOwnerLostError:
            return "lost"
        return "no error"

    value = simulate(program, seed=6, hosts=2).value
    assert value == "lost"
    roots.wait_for("simmid")


def test_a_partition_fails_the_transfer_with_an_error_not_a_hang(roots: RootFailures) -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        peers = procs.spawn("simcut", Peer)
        buf = peers.slice(hosts=1).make.call_one("b", pattern(N, 6)).get()
        out = memoryview(bytearray(N))
        buf.read_into(out).get()
        current().partition(["controller", "host0"], ["host1"])
        try:
            buf.read_into(out, timeout=600).get()
        except RDMAOwnerLostError as exc:
            return str(exc)
        return "read across a partition"

    value = simulate(program, seed=7, hosts=2).value
    assert "partitioned" in value
    assert value.startswith("the owner of RDMABuffer #1 (2097169 bytes) of proc ")


def test_a_clog_only_delays_the_transfer() -> None:
    def program(hosts: Any) -> tuple[bool, float]:
        peers = hosts.spawn_procs(per_host={"gpus": 1}).spawn("simclog", Peer)
        buf = peers.slice(hosts=0).make.call_one("b", pattern(N, 8)).get()
        out = bytearray(N)
        buf.read_into(memoryview(out)).get()
        current().clog("host0", 3.0)
        start = current().now()
        out[:] = bytes(N)
        buf.read_into(memoryview(out), timeout=600).get()
        return out == pattern(N, 8), current().now() - start

    ok, waited = simulate(program, seed=8, hosts=1).value
    assert ok and waited >= 2.9
