"""The same-host primitives: process_vm_readv/writev through ctypes, and the host identity."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from regency.rdma._host import host_identity, permit_same_host_peers, same_host_supported
from regency.rdma._memory import region_of
from regency.rdma._vm import copy

pytestmark = pytest.mark.skipif(not same_host_supported(), reason="process_vm_readv is Linux-only")


def test_copy_both_ways_with_a_process() -> None:
    src = region_of(memoryview(bytearray(os.urandom(1 << 20))), "src", writable=True)
    dst = region_of(memoryview(bytearray(1 << 20)), "dst", writable=True)
    copy(os.getpid(), dst.addr, src.addr, 1 << 20, write=False)
    assert bytes(dst.view) == bytes(src.view)
    copy(os.getpid(), src.addr, dst.addr + 10, 100, write=True)  # local src -> remote dst+10
    assert bytes(dst.view[:10]) == bytes(src.view[:10])


def test_copy_errors_carry_the_errno() -> None:
    dst = region_of(memoryview(bytearray(16)), "dst", writable=True)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    with pytest.raises(OSError, match=rf"process_vm_readv\(pid {child.pid}\) failed") as info:
        copy(child.pid, dst.addr, dst.addr, 16, write=False)
    assert info.value.errno == errno.ESRCH
    with pytest.raises(OSError) as info:
        copy(os.getpid(), dst.addr, 8, 16, write=False)  # page 0 is never mapped
    assert info.value.errno == errno.EFAULT


def test_host_identity_names_kernel_and_pid_namespace() -> None:
    hostname, boot_id, pidns = host_identity().split("/")
    assert hostname and len(boot_id) == 36 and int(pidns) > 0
    permit_same_host_peers()
    permit_same_host_peers()  # once per process; idempotent
