"""The owner's proc killed or stopped around a transfer: an error or a timeout, never a hang."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from regency.actor import ActorError, ActorMesh, SupervisionError, this_host
from regency.rdma import RDMAOwnerLostError, set_backend

from ..conftest import SpawnProcs, stop_and_wait
from .actors import Peer
from .conftest import BACKENDS, T

#: Real processes: the slow tier (pytest -m "not slow" skips it).
pytestmark = pytest.mark.slow



@pytest.fixture(params=BACKENDS)
def victim(request: pytest.FixtureRequest) -> Iterator[tuple[ActorMesh[Peer], int]]:
    """A proc of its own, with the backend under test forced in the controller."""
    set_backend(request.param)
    pm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        peer = pm.spawn("victim", Peer)
        yield peer, peer.pid.call_one().get(T)
    finally:
        set_backend(None)
        pm.stop().get(T)


def test_owner_killed_before_the_transfer(victim: tuple[ActorMesh[Peer], int]) -> None:
    peer, pid = victim
    buf = peer.make.call_one("b", b"x" * 4096).get(T)
    dst = memoryview(bytearray(4096))
    buf.read_into(dst).get(T)  # the data path to the owner is up
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RDMAOwnerLostError, match=r"is gone"):
        buf.read_into(dst).get(T)
    with pytest.raises(SupervisionError):  # RDMAOwnerLostError is one
        buf.write_from(dst).get(T)


def test_owner_killed_before_first_contact(victim: tuple[ActorMesh[Peer], int]) -> None:
    peer, pid = victim
    buf = peer.make.call_one("b", b"x" * 4096).get(T)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RDMAOwnerLostError):
        buf.read_into(memoryview(bytearray(4096))).get(T)
    assert buf.drop().get(T) is None  # nothing left to release


def test_a_sibling_proc_hears_of_a_killed_owner_at_once(
    spawn_procs: SpawnProcs, peers: ActorMesh[Peer], backend: str
) -> None:
    pm = spawn_procs(per_host={"procs": 1})
    owner = pm.spawn("short_lived", Peer)
    pid = owner.pid.call_one().get(T)
    buf = owner.make.call_one("b", b"q" * 100).get(T)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ActorError, match=r"RDMAOwnerLostError: the owner of RDMABuffer #\d+ "
                       r"\(100 bytes\) of proc \S+ is gone"):
        peers.slice(procs=0).read.call_one(buf, 100, 5.0).get(T)
    pm.stop().get(T)


def test_owner_killed_mid_transfer(victim: tuple[ActorMesh[Peer], int]) -> None:
    peer, pid = victim
    n = 8 << 20
    buf = peer.make.call_one("b", b"y" * n).get(T)
    dst = memoryview(bytearray(n))
    buf.read_into(dst).get(T)
    stop_and_wait(pid)  # the owner cannot answer: the transfer stays in flight
    in_flight = buf.read_into(dst)
    writing = buf.write_from(dst)
    assert not in_flight.done()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RDMAOwnerLostError):
        in_flight.get(T)
    with pytest.raises(RDMAOwnerLostError):
        writing.get(T)


def test_timeout_then_recovery(victim: tuple[ActorMesh[Peer], int]) -> None:
    peer, pid = victim
    buf = peer.make.call_one("b", b"z" * 4096).get(T)
    dst = bytearray(4096)
    buf.read_into(memoryview(dst)).get(T)
    stop_and_wait(pid)
    try:
        with pytest.raises(TimeoutError, match=r"read_into from RDMABuffer #\d+ \(4096 bytes\) "
                           r"of proc \S+ did not finish within 0.2 s"):
            buf.read_into(memoryview(bytearray(4096)), timeout=0.2).get(T)
    finally:
        os.kill(pid, signal.SIGCONT)
    dst[:] = bytes(4096)
    buf.read_into(memoryview(dst)).get(T)
    assert dst == b"z" * 4096
    assert peer.leases.call_one("b").get(T) == 0
