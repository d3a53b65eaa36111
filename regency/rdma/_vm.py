"""One copy between two processes of one host: ``process_vm_readv``/``process_vm_writev``.

The calls go through ctypes, which releases the GIL for their whole duration, so several
stripes of one transfer run in parallel on threads. Each call moves one large iovec per side;
the kernel may stop early (it caps one call at ``MAX_RW_COUNT``, about 2 GiB, and stops at the
first unmapped page), so :func:`copy` loops until every byte has moved or an error names why.
"""

from __future__ import annotations

import ctypes
import errno
import os

from ._host import same_host_supported


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind(name: str) -> object:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, name)
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv: object = _bind("process_vm_readv") if same_host_supported() else None
_writev: object = _bind("process_vm_writev") if same_host_supported() else None


def copy(pid: int, local: int, remote: int, nbytes: int, *, write: bool) -> None:
    """Copy ``nbytes`` from ``remote`` in process ``pid`` to ``local`` here (``write`` False),
    or from ``local`` to ``remote`` (``write`` True). Blocks; call it on a worker thread.

    Raises ``OSError`` with the kernel's errno: ``ESRCH`` (no such process), ``EPERM`` (not
    permitted to access it), ``EFAULT`` (an address range is not mapped), ``ENOSYS``.
    """
    fn = _writev if write else _readv
    if fn is None:
        raise OSError(errno.ENOSYS, "process_vm_readv/process_vm_writev need Linux")
    name = "process_vm_writev" if write else "process_vm_readv"
    here, there = _IoVec(), _IoVec()
    done = 0
    while done < nbytes:
        here.iov_base, here.iov_len = local + done, nbytes - done
        there.iov_base, there.iov_len = remote + done, nbytes - done
        n: int = fn(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)  # type: ignore[operator]
        if n < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{name}(pid {pid}) failed: {os.strerror(code)}")
        if n == 0:
            raise OSError(errno.EFAULT, f"{name}(pid {pid}) made no progress at byte {done}")
        done += n


def memmove(dst: int, src: int, nbytes: int) -> None:
    """Copy within this process; ``ctypes.memmove`` releases the GIL too."""
    ctypes.memmove(dst, src, nbytes)
