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

GPU memory on either side: a buffer in GPU memory is mapped once per reader process through
CUDA IPC (:mod:`~regency.rdma._cuda`) and copied with one device copy, to or from local CPU
or GPU memory; a CPU buffer read into (or written from) local GPU memory goes through a host
staging buffer. A mapping is closed when the buffer turns out dropped or its owner gone, when
this process drops the handle, or when it maps another buffer of the same owner and learns
which of its mapped ones were dropped (torch frees an exported block only once every mapping
of it is closed). ``tests/rdma/test_cuda.py`` runs all of it where a GPU is present.

Bulk copies run on worker threads (ctypes releases the GIL), in 4 MiB pieces that up to one
thread per core take in turn: one thread moves about 5-7 GB/s here, two about 9-12 GB/s.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import select
from typing import Any

import trio

from . import _cuda
from ._backend import Backend, BufferRef, FallBack, Transfer, call_manager
from ._errors import RDMABufferDroppedError, RDMAError, RDMAOwnerLostError, owner_lost
from ._host import host_identity, same_host_supported
from ._link import link_to
from ._memory import Region
from ._state import current_state
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
        #: (pid, proc_id, buf_id) -> the GPU buffer mapped through CUDA IPC (a tensor).
        self._mapped: dict[tuple[int, str, int], Any] = {}

    @staticmethod
    def reaches(ref: BufferRef) -> bool:
        """Whether the pid in the handle names the owner from here."""
        return same_host_supported() and ref.host == host_identity()

    async def run(self, transfer: Transfer) -> None:
        ref, local = transfer.ref, transfer.local
        from ._transfer import is_local

        nbytes = transfer.nbytes
        if is_local(ref):
            # Our own registry: check, and hold the entry (and so the memory) while copying.
            entry = current_state().registry.check(ref.buf_id, nbytes, write=transfer.write)
            await _copy_local(entry.region, local, nbytes, transfer.write)
            return
        if current_state().simulated:
            raise FallBack(
                f"the same_host backend cannot reach {ref.describe()} in a simulated cluster "
                "(every simulated proc shares one OS process); use REGENCY_RDMA_BACKEND=auto "
                "or tcp, which run over the simulated network"
            )
        if not self.reaches(ref):
            raise FallBack(
                f"the same_host backend cannot reach {ref.describe()}: it lives on another "
                f"host or pid namespace ({ref.host!r}, this process: {host_identity()!r})"
            )
        key = (ref.pid, ref.proc_id)
        pidfd = self._pidfd(transfer, key)
        self._check_alive(transfer, key, pidfd)
        link = await link_to(ref)
        try:
            lease_id = await link.lease(ref, nbytes, transfer.write, transfer.ttl)
        except RDMABufferDroppedError:
            # A GPU buffer mapped here must not stay mapped: the mapping keeps the owner's
            # allocation from being freed (torch's IPC reference count).
            self.forget_mapping(ref)
            raise
        except RDMAOwnerLostError:
            self.forget_owner(ref)
            raise
        try:
            self._check_alive(transfer, key, pidfd)
            if ref.device != "cpu":
                await self._cuda_ipc(transfer, nbytes)
            elif local.on_gpu:
                await self._staged(transfer, nbytes)
            else:
                move = functools.partial(
                    _move_remote, ref.pid, local.addr, ref.addr, transfer.write
                )
                try:
                    await striped(nbytes, move)
                except OSError as exc:
                    raise self._translate(transfer, exc) from None
        finally:
            link.release_soon(lease_id)

    async def _cuda_ipc(self, transfer: Transfer, nbytes: int) -> None:
        """The buffer is GPU memory of another process on this host: map it (once) through
        CUDA IPC and copy with the device."""
        ref = transfer.ref
        key = (ref.pid, ref.proc_id, ref.buf_id)
        remote = self._mapped.get(key)
        if remote is None:
            owner = (ref.pid, ref.proc_id)
            mine = tuple(k[2] for k in list(self._mapped) if k[:2] == owner)
            handle, gone = await call_manager(
                ref, "cuda_export", ref.buf_id, ref.size, False, mine
            )
            for buf_id in gone:  # dropped since we mapped them: let the owner free them
                self._mapped.pop((*owner, buf_id), None)
            remote = _cuda.open_export(handle, ref.size)
            self._mapped[key] = remote
        local = _cuda.as_tensor(transfer.local, nbytes)
        dst, src = (remote[:nbytes], local) if transfer.write else (local, remote[:nbytes])
        await trio.to_thread.run_sync(_cuda.copy_tensors, dst, src)

    async def _staged(self, transfer: Transfer, nbytes: int) -> None:
        """CPU buffer, local GPU memory: through a pinned host buffer."""
        ref = transfer.ref
        if transfer.write:
            staging = await trio.to_thread.run_sync(_cuda.host_copy, transfer.local, 0, nbytes)
        else:
            staging = _cuda.host_staging(nbytes, pinned=True)[0]
        move = functools.partial(
            _move_remote, ref.pid, _address_of(staging), ref.addr, transfer.write
        )
        try:
            await striped(nbytes, move)
        except OSError as exc:
            raise self._translate(transfer, exc) from None
        if not transfer.write:
            await trio.to_thread.run_sync(_cuda.put, transfer.local, 0, staging)

    def forget_mapping(self, ref: BufferRef) -> None:
        """Unmap ``ref``'s GPU memory if this process mapped it (the buffer was dropped)."""
        self._mapped.pop((ref.pid, ref.proc_id, ref.buf_id), None)

    def forget_owner(self, ref: BufferRef) -> None:
        """Unmap every GPU buffer of ``ref``'s owner (it is gone)."""
        for key in [k for k in self._mapped if k[:2] == (ref.pid, ref.proc_id)]:
            del self._mapped[key]

    def mapped(self) -> int:
        """How many GPU buffers of other processes this process maps (for tests)."""
        return len(self._mapped)

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
            self.forget_owner(transfer.ref)
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


async def _copy_local(buffer: Region, local: Region, nbytes: int, write: bool) -> None:
    """A transfer within one proc: a ``memmove`` for CPU memory, a device copy otherwise."""
    src, dst = (local, buffer) if write else (buffer, local)
    if src.on_gpu or dst.on_gpu:
        d, s = _cuda.as_tensor(dst, nbytes), _cuda.as_tensor(src, nbytes)
        await trio.to_thread.run_sync(_cuda.copy_tensors, d, s)
        return
    await striped(nbytes, functools.partial(_move_local, dst.addr, src.addr))


def _address_of(view: memoryview) -> int:
    from ._memory import _buffer_address

    return _buffer_address(view)


def _move_local(dst: int, src: int, offset: int, length: int) -> None:
    memmove(dst + offset, src + offset, length)


def _move_remote(pid: int, local: int, remote: int, write: bool, offset: int, length: int) -> None:
    copy(pid, local + offset, remote + offset, length, write=write)
