"""Which machine and process namespace this is, and letting same-host peers copy our memory.

Two processes can use ``process_vm_readv``/``process_vm_writev`` on each other only when they
run on the same kernel (boot id) in the same pid namespace, so that a pid names the same
process for both; :func:`host_identity` captures exactly that.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import sys
import threading

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
_YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.cache
def _static_identity() -> tuple[str, str]:
    boot_id = _read("/proc/sys/kernel/random/boot_id") or "no-boot-id"
    return socket.gethostname(), boot_id


def host_identity() -> str:
    """``hostname/boot_id/pid-namespace``: equal for two processes exactly when a pid means the
    same process to both (same kernel, same pid namespace)."""
    hostname, boot_id = _static_identity()
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    return f"{hostname}/{boot_id}/{pidns}"


def same_host_supported() -> bool:
    """Whether this platform has ``process_vm_readv`` (Linux only)."""
    return sys.platform.startswith("linux")


def ptrace_scope() -> int | None:
    """Yama's ``ptrace_scope`` (0 classic, 1 restricted, 2 admin only, 3 none), or None
    when Yama is not enabled (then same-user processes may attach)."""
    value = _read(_YAMA_SCOPE)
    return int(value) if value.isdigit() else None


_permitted = False
_permit_lock = threading.Lock()


def permit_same_host_peers() -> None:
    """Let other processes of this user read and write our memory with ``process_vm_*``.

    Called when this process registers its first buffer. Under Yama's restricted mode
    (``ptrace_scope`` 1) a process may only be attached by its ancestors unless it names a
    tracer; ``PR_SET_PTRACER_ANY`` names every process of the same user, which is what the
    same-host backend needs (readers are siblings, not ancestors). Without Yama, or at scope 0,
    same-user access is already allowed and this changes nothing; at scope 2 or 3 it cannot
    help and transfers fall back to TCP.
    """
    global _permitted
    with _permit_lock:
        if _permitted or not same_host_supported():
            return
        _permitted = True
        if ptrace_scope() != 1:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(
            ctypes.c_int(_PR_SET_PTRACER),
            ctypes.c_ulong(_PR_SET_PTRACER_ANY),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )

