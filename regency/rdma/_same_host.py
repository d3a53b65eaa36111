"""Same host, no NIC: one copy straight between the two processes' memory.

The reader (or writer) copies with ``process_vm_readv``/``process_vm_writev``; the owner only
answers a lease request first, on its data connection (:mod:`~regency.rdma._link`), which
proves the buffer is still registered and pins its memory until the copy is over (see
:mod:`~regency.rdma._registry`). A transfer within one process is a
``memmove`` under the registry's check.

Safety against pid reuse: the copier opens a pidfd on the owner *before* its first lease
request. The owner answering the lease proves that the pid still named the owner when the
pidfd was opened, and a pidfd that is not readable proves the process has not exited since; so
a copy never lands in a stranger that inherited the pid. That check runs right before each
copy.

Bulk copies run on worker threads (ctypes releases the GIL), in 4 MiB pieces that up to one
thread per core take in turn: one thread moves about 5-7 GB/s here, two about 9-12 GB/s.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import select

import trio

from ._backend import Backend, BufferRef, FallBack, Transfer
from ._errors import RDMAError, RDMAOwnerLostError, owner_lost
from ._host import host_identity, same_host_supported
from ._link import Link, link_to
from ._registry import registry
from ._vm import copy, memmove

#: Copies below this size run inline on the trio thread: a thread hop costs more.
INLINE_BYTES = 256 << 10
#: Worker threads take the copy in pieces of this size, each the next piece not yet taken...
PIECE_BYTES = 4 << 20
#: ... and at most this many threads (and no more than cores) work on one copy.
MAX_WORKERS = 4


def workers(nbytes: int) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1, -(-nbytes // PIECE_BYTES)))


async def striped(nbytes: int, move: functools.partial[None]) -> None:
    """Run ``move(offset, length)`` over ``[0, nbytes)`` on worker threads; re-raise the
    first error once every worker has stopped.

    Workers pull pieces from a shared counter rather than owning fixed stripes: on a machine
    where another process takes one core, the other worker simply moves more pieces.
    """
    if nbytes <= INLINE_BYTES:
        move(0, nbytes)
        return
    pieces = itertools.count()  # next() is atomic under the GIL
    errors: list[OSError] = []

    def work() -> None:
        while not errors:
            offset = next(pieces) * PIECE_BYTES
            if offset >= nbytes:
                return
            try:
                move(offset, min(PIECE_BYTES, nbytes - offset))
            except OSError as exc:
                errors.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(workers(nbytes)):
            nursery.start_soon(trio.to_thread.run_sync, work)
    if errors:
        raise errors[0]


class SameHostBackend(Backend):
    name = "same_host"

    def __init__(self) -> None:
        #: (pid, proc_id) of an owner -> a pidfd on it (see the module docstring).
        self._pidfds: dict[tuple[int, str], int] = {}

    @staticmethod
    def reaches(ref: BufferRef) -> bool:
        """Whether the pid in the handle names the owner from here."""
        return same_host_supported() and ref.host == host_identity()

    async def run(self, transfer: Transfer) -> None:
        ref, local = transfer.ref, transfer.local
        if not self.reaches(ref):
            raise FallBack(
                f"the same_host backend cannot reach {ref.describe()}: it lives on another "
                f"host or pid namespace ({ref.host!r}, this process: {host_identity()!r})"
            )
        nbytes = transfer.nbytes
        if ref.pid == os.getpid():
            # Our own registry: check, and hold the entry (and so the memory) while copying.
            entry = registry.check(ref.buf_id, nbytes, write=transfer.write)
            src, dst = (local.addr, entry.region.addr) if transfer.write else (
                entry.region.addr,
                local.addr,
            )
            await striped(nbytes, functools.partial(_move_local, dst, src))
            return
        key = (ref.pid, ref.proc_id)
        pidfd = self._pidfd(transfer, key)
        self._check_alive(transfer, key, pidfd)
        link = await link_to(ref)
        move = functools.partial(_move_remote, ref.pid, local.addr, ref.addr, transfer.write)
        lease_id = await link.lease(ref, nbytes, transfer.write, transfer.ttl)
        try:
            self._check_alive(transfer, key, pidfd)
            try:
                await striped(nbytes, move)
            except OSError as exc:
                raise self._translate(transfer, exc) from None
        finally:
            _release_soon(link, lease_id)

    def _pidfd(self, transfer: Transfer, key: tuple[int, str]) -> int | None:
        fd = self._pidfds.get(key)
        if fd is not None:
            return fd
        try:
            fd = os.pidfd_open(key[0])
        except ProcessLookupError:
            raise self._gone(transfer) from None
        except (OSError, AttributeError):
            return None  # no pidfds here (kernel < 5.3): the lease and ESRCH still guard
        self._pidfds[key] = fd
        return fd

    def _check_alive(self, transfer: Transfer, key: tuple[int, str], pidfd: int | None) -> None:
        if pidfd is None:
            return
        readable, _, _ = select.select([pidfd], [], [], 0)
        if readable:  # the owner exited
            del self._pidfds[key]
            os.close(pidfd)
            raise self._gone(transfer)

    @staticmethod
    def _gone(transfer: Transfer) -> RDMAOwnerLostError:
        ref = transfer.ref
        return owner_lost(ref.describe(), f"its process (pid {ref.pid}) has exited")

    def _translate(self, transfer: Transfer, exc: OSError) -> RDMAError:
        if exc.errno == errno.ESRCH:
            return self._gone(transfer)
        if exc.errno in (errno.EPERM, errno.EACCES, errno.ENOSYS):
            return FallBack(
                f"the kernel refused a same-host copy ({exc.strerror}); Yama ptrace_scope 2 or "
                "3, a seccomp filter or another platform forbids process_vm_readv. Use "
                "REGENCY_RDMA_BACKEND=tcp (auto mode falls back by itself)"
            )
        return RDMAError(f"{transfer.describe()} failed: {exc}")


def _release_soon(link: Link, lease_id: int) -> None:
    """Release once this task yields, after the caller's Future is resolved: a loopback send
    costs tens of microseconds that the caller need not wait for."""
    trio.lowlevel.current_trio_token().run_sync_soon(link.release, lease_id)


def _move_local(dst: int, src: int, offset: int, length: int) -> None:
    memmove(dst + offset, src + offset, length)


def _move_remote(pid: int, local: int, remote: int, write: bool, offset: int, length: int) -> None:
    copy(pid, local + offset, remote + offset, length, write=write)
