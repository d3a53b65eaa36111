"""The owner's registry: drop, leases and their expiry, with an injected clock."""

from __future__ import annotations

import pytest

from regency.rdma import RDMABufferDroppedError, RDMAError
from regency.rdma._memory import region_of
from regency.rdma._registry import Registry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(readonly: bool = False) -> tuple[Registry, Clock, int]:
    clock = Clock()
    reg = Registry(clock)
    mem = memoryview(b"0123456789") if readonly else memoryview(bytearray(10))
    return reg, clock, reg.register(region_of(mem, "m", writable=False))


def test_check_validates_size_and_writability() -> None:
    reg, _, buf = make()
    assert reg.check(buf, 10, write=True).region.nbytes == 10
    with pytest.raises(ValueError, match=r"transfer of 11 bytes does not fit RDMABuffer #1 of "
                       r"10 bytes"):
        reg.check(buf, 11, write=False)
    with pytest.raises(RDMAError, match=r"no RDMABuffer #99 is registered"):
        reg.check(99, 1, write=False)
    ro, _, rbuf = make(readonly=True)
    with pytest.raises(TypeError, match="wraps read-only memory"):
        ro.check(rbuf, 1, write=True)


def test_drop_refuses_later_use_and_is_idempotent() -> None:
    reg, _, buf = make()
    reg.drop(buf)
    reg.drop(buf)
    assert buf not in reg
    with pytest.raises(RDMABufferDroppedError, match=r"RDMABuffer #1 of pid \d+ was dropped"):
        reg.check(buf, 1, write=False)
    with pytest.raises(RDMABufferDroppedError):
        reg.acquire(buf, 1, write=False, ttl=5)


def test_a_lease_keeps_a_dropped_entry_until_released() -> None:
    reg, _, buf = make()
    lease, entry = reg.acquire(buf, 10, write=False, ttl=5)
    reg.drop(buf)
    assert reg.leases_of(buf) == 1 and buf not in reg
    assert entry.region.view.nbytes == 10
    reg.release(lease)
    reg.release(lease)  # idempotent
    assert reg.leases_of(buf) == 0


def test_wait_unleased_returns_once_the_last_lease_ends() -> None:
    import threading

    reg, _, buf = make()
    lease, _ = reg.acquire(buf, 1, write=False, ttl=5)
    assert reg.wait_unleased(buf, 0) is False
    releaser = threading.Thread(target=reg.release, args=(lease,))
    releaser.start()
    assert reg.wait_unleased(buf, 10) is True
    releaser.join()


def test_leases_expire_after_their_ttl() -> None:
    reg, clock, buf = make()
    reg.acquire(buf, 1, write=False, ttl=5)
    reg.acquire(buf, 1, write=False, ttl=50)
    assert reg.leases_of(buf) == 2
    clock.now += 6
    assert reg.leases_of(buf) == 1
    reg.drop(buf)
    clock.now += 60
    assert reg.leases_of(buf) == 0
