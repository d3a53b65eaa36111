"""``RDMABuffer`` and ``RDMAAction``: Monarch's ``monarch.rdma`` API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from ..core import Future, SupervisionError, current_runtime
from . import _transfer
from ._backend import BufferRef, Transfer, backend_choice
from ._errors import RDMABufferDroppedError
from ._host import permit_same_host_peers
from ._manager import local_manager
from ._memory import Region, region_of
from ._state import current_state

if TYPE_CHECKING:
    from typing import Self

    import torch

    LocalMemory: TypeAlias = torch.Tensor | memoryview
else:
    LocalMemory: TypeAlias = Any

#: A lease outlives its transfer's timeout by this much (see _registry).
_LEASE_MARGIN = 30.0


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds (got {timeout!r})")
    return float(timeout)


def _resolved() -> Future[None]:
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


class RDMABuffer:
    """Memory of this process that actors in other processes can read and write directly.

    ``RDMABuffer(t)`` registers ``t`` without copying it: a 1-D contiguous ``torch.uint8`` CPU
    or CUDA tensor (``t.view(torch.uint8).flatten()`` of any contiguous tensor) or a 1-D C-contiguous
    memoryview, at least one byte long. The object is a small handle: return it from an
    endpoint or pass it to another actor, and the receiver calls :meth:`read_into` /
    :meth:`write_from` on it; the bytes move on a data path of their own (see docs/rdma.md),
    never through actor messages.

    The registering process keeps the memory alive until :meth:`drop`. The caller must not
    resize or free it meanwhile, and must not modify memory while a transfer on it is in flight.
    """

    __slots__ = ("_dropped", "_ref")

    def __init__(self, data: LocalMemory) -> None:
        region = region_of(data, "RDMABuffer memory", writable=False)
        rt = current_runtime()
        state = current_state()
        manager = local_manager()
        if not state.simulated:
            permit_same_host_peers()
        buf_id = state.registry.register(region)
        self._ref = BufferRef(
            buf_id=buf_id,
            size=region.nbytes,
            # No address in a simulation: nothing copies by address there, and handles
            # must pickle to the same bytes in every run of a seed.
            addr=0 if state.simulated else region.addr,
            readonly=region.readonly,
            pid=state.pid,
            host=state.host,
            proc_id=rt.proc_id,
            manager=manager,
            device=region.device,
        )
        self._dropped = False

    @classmethod
    def _from_ref(cls, ref: BufferRef) -> RDMABuffer:
        buf = cls.__new__(cls)
        buf._ref, buf._dropped = ref, False
        return buf

    def __reduce__(self) -> Any:
        return (RDMABuffer._from_ref, (self._ref,))

    def size(self) -> int:
        """Length of the registered memory, in bytes."""
        return self._ref.size

    @property
    def owner(self) -> str:
        """The id of the proc that owns the memory."""
        return self._ref.proc_id

    @property
    def backend(self) -> str:
        """The backend a whole-buffer transfer started here would use first."""
        return _transfer.plan(self._ref, backend_choice(), self._ref.size)[0].name

    def _live(self, what: str) -> BufferRef:
        if self._dropped:
            raise RDMABufferDroppedError(
                f"{what} on {self._ref.describe()} after drop(); register the memory again"
            )
        return self._ref

    def read_into(self, dst: LocalMemory, *, timeout: float = 60.0) -> Future[None]:
        """Copy the whole buffer into the leading bytes of ``dst``; resolves when it is there.

        ``dst`` takes the same kinds of memory as the constructor, writable, at least
        :meth:`size` bytes. Argument errors raise at once; a dropped buffer, a lost owner
        (:class:`RDMAOwnerLostError`) and ``TimeoutError`` after ``timeout`` seconds fail the
        Future. After a failure the contents of ``dst`` are unspecified.
        """
        ref = self._live("read_into")
        seconds = _check_timeout(timeout)
        local = _read_region(ref, dst)
        return _transfer.start([Transfer(ref, local, False, seconds + _LEASE_MARGIN)], seconds)

    def write_from(self, src: LocalMemory, *, timeout: float = 60.0) -> Future[None]:
        """Copy ``src`` into the leading bytes of the buffer; resolves when it landed.

        ``src`` is at most :meth:`size` bytes. Errors as for :meth:`read_into`; after a
        failure or timeout the buffer's contents are unspecified.
        """
        ref = self._live("write_from")
        seconds = _check_timeout(timeout)
        local = _write_region(ref, src)
        return _transfer.start([Transfer(ref, local, True, seconds + _LEASE_MARGIN)], seconds)

    def drop(self) -> Future[None]:
        """Release the registration: transfers not yet started fail with
        :class:`RDMABufferDroppedError` in every process, and the owner stops keeping the
        memory alive once transfers in flight are done. Idempotent; resolves once the owner
        has forgotten the buffer (at once in the owner's process, or if the owner is gone)."""
        self._dropped = True
        ref = self._ref
        if _transfer.is_local(ref):
            current_state().registry.drop(ref.buf_id)
            return _resolved()
        if ref.device != "cpu":
            _transfer.SAME_HOST.forget_mapping(ref)  # our CUDA IPC mapping of it, if any
        done: Future[None] = Future()
        asked: Future[None] = ref.manager.drop.call_one(ref.buf_id)

        def settle() -> None:
            try:
                asked.get()
            except SupervisionError:
                pass  # the owner is gone, and its memory with it
            except Exception as exc:
                done.set_exception(exc)
                return
            done.set_result(None)

        asked.add_done_callback(settle)
        return done

    def __repr__(self) -> str:
        state = ", dropped" if self._dropped else ""
        return f"<RDMABuffer #{self._ref.buf_id} {self._ref.size} bytes of {self.owner}{state}>"


def _read_region(ref: BufferRef, dst: object) -> Region:
    local = region_of(dst, "read_into destination", writable=True)
    if local.nbytes < ref.size:
        raise ValueError(
            f"read_into destination is {local.nbytes} bytes, smaller than {ref.describe()}; "
            f"it must hold at least {ref.size} bytes"
        )
    return local


def _write_region(ref: BufferRef, src: object) -> Region:
    local = region_of(src, "write_from source", writable=False)
    if local.nbytes > ref.size:
        raise ValueError(
            f"write_from source is {local.nbytes} bytes, larger than {ref.describe()}; "
            f"it must be at most {ref.size} bytes"
        )
    if ref.readonly:
        raise TypeError(f"write_from into {ref.describe()}, which wraps read-only memory")
    return local


class RDMAAction:
    """A batch of transfers submitted together: ``RDMAAction().read_remote(dst, buf)
    .write_remote(buf, src).submit()``.

    Every operation is checked when it is queued (sizes, kinds of memory, and that no read's
    destination overlaps the local memory of another operation of the batch, which would race);
    :meth:`submit` runs them all concurrently under one timeout and may be called again to run
    the same batch once more.
    """

    def __init__(self) -> None:
        self._ops: list[tuple[RDMABuffer, Region, bool]] = []

    def read_remote(self, dst: LocalMemory, src: RDMABuffer) -> Self:
        """Queue a read of buffer ``src`` into local memory ``dst`` (Monarch's current name)."""
        ref = src._live("read_remote")
        self._add(src, _read_region(ref, _single(dst, "read_remote destination")), False)
        return self

    def write_remote(self, dst: RDMABuffer, src: LocalMemory) -> Self:
        """Queue a write of local memory ``src`` into buffer ``dst`` (Monarch's current name)."""
        ref = dst._live("write_remote")
        self._add(dst, _write_region(ref, _single(src, "write_remote source")), True)
        return self

    def read_into(self, src: RDMABuffer, dst: LocalMemory) -> Self:
        """Monarch 0.7's spelling of :meth:`read_remote` (buffer first)."""
        return self.read_remote(dst, src)

    def write_from(self, dst: RDMABuffer, src: LocalMemory) -> Self:
        """Monarch 0.7's spelling of :meth:`write_remote`."""
        return self.write_remote(dst, src)

    def fetch_add(self, src: RDMABuffer, dst: LocalMemory, add: int) -> Self:
        raise NotImplementedError("RDMA atomics (fetch_add) are not supported (nor in Monarch)")

    def compare_and_swap(
        self, src: RDMABuffer, dst: LocalMemory, compare: int, swap: int
    ) -> Self:
        raise NotImplementedError(
            "RDMA atomics (compare_and_swap) are not supported (nor in Monarch)"
        )

    def _add(self, buf: RDMABuffer, local: Region, write: bool) -> None:
        # Bytes of local memory this op touches: a read writes buf.size() of them.
        length = local.nbytes if write else buf.size()
        start, end = local.addr, local.addr + length
        for i, (other, region, other_write) in enumerate(self._ops):
            other_len = region.nbytes if other_write else other.size()
            overlaps = start < region.addr + other_len and region.addr < end
            if overlaps and not (write and other_write):
                raise ValueError(
                    f"RDMAAction op #{len(self._ops)} uses local memory that op #{i} also "
                    "uses, and at least one of them reads into it; give each read its own "
                    "destination"
                )
        self._ops.append((buf, local, write))

    def submit(self, *, timeout: float = 60.0) -> Future[None]:
        """Start every queued transfer; the Future resolves when all have finished, or fails
        with the first error (``TimeoutError`` after ``timeout`` seconds)."""
        seconds = _check_timeout(timeout)
        if not self._ops:
            return _resolved()
        transfers = [
            Transfer(buf._live("submit"), local, write, seconds + _LEASE_MARGIN)
            for buf, local, write in self._ops
        ]
        return _transfer.start(transfers, seconds)


def _single(memory: object, what: str) -> object:
    if isinstance(memory, list):
        raise NotImplementedError(
            f"{what}: lists of local memory are not supported; queue one operation per piece"
        )
    return memory
