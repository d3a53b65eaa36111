"""GPU memory: copies to and from host memory, and CUDA IPC between processes of one host.

Every function here runs only when a region is on a GPU, which means the caller passed a CUDA
tensor, so torch is imported. ``tests/rdma/test_cuda.py`` runs them where a GPU is present
(they ran on an H100 in session 6) and skips them, saying so, elsewhere.

Ordering: a copy from or to GPU memory is preceded and followed by a synchronisation of that
device, so work queued on the memory before the transfer was asked for (on any stream) has
finished before the copy starts, and a Future that resolved means the bytes are in place, as
for CPU memory. An owner synchronises its device before it grants a lease on GPU memory.

CUDA IPC: the owner exports the allocation behind a registered tensor with
``UntypedStorage._share_cuda_()`` (one export per requesting process: torch counts the
consumers of each export), the reader maps it with ``UntypedStorage._new_shared_cuda(...)``
once and keeps the mapping while the buffer lives. The registry keeps the owner's tensor
alive until ``drop()``, and torch's IPC reference counting keeps the allocation from being
reused while a reader still maps it.
"""

from __future__ import annotations

import sys
from typing import Any

from ._errors import RDMAError
from ._memory import Region, pinned_view


def _torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None:  # pragma: no cover - a GPU region came from a torch tensor
        raise RDMAError("GPU memory needs torch, which this process has not imported")
    return torch


def torch_needed(what: str) -> Any:
    """torch, imported on demand in a process that receives GPU bytes but never saw a tensor
    (an owner serving a GPU-less peer is always one that registered a tensor)."""
    try:
        import torch
    except ImportError:
        raise RDMAError(f"{what} needs torch (pip install torch)") from None
    return torch


def sync(device: str) -> None:
    _torch().cuda.synchronize(device)


def _sync_all(*tensors: Any) -> None:
    """Synchronise each device that holds one of ``tensors``, once."""
    for device in {str(t.device) for t in tensors if t.device.type == "cuda"}:
        sync(device)


def host_copy(region: Region, offset: int, length: int) -> memoryview:
    """``length`` bytes of ``region`` from ``offset``, as host memory: the view itself for CPU
    memory, a fresh pinned copy for GPU memory (the device is synchronised first)."""
    if not region.on_gpu:
        return region.view[offset : offset + length]
    torch = _torch()
    sync(region.device)  # work queued on the memory (any stream) comes first
    staging = torch.empty(length, dtype=torch.uint8, pin_memory=True)
    staging.copy_(region.tensor[offset : offset + length])
    return pinned_view(int(staging.data_ptr()), length, staging, readonly=True)


def host_staging(length: int, pinned: bool) -> tuple[memoryview, Any]:
    """A writable host buffer of ``length`` bytes (pinned when it will be copied to a GPU):
    its memoryview and the object that owns it."""
    if not pinned:
        mem = bytearray(length)
        return memoryview(mem), mem
    torch = _torch()
    staging = torch.empty(length, dtype=torch.uint8, pin_memory=True)
    return pinned_view(int(staging.data_ptr()), length, staging, readonly=False), staging


def put(region: Region, offset: int, data: memoryview) -> None:
    """Copy host bytes ``data`` into ``region`` at ``offset`` (and wait for a GPU copy)."""
    n = len(data)
    if not region.on_gpu:
        region.view[offset : offset + n] = data
        return
    torch = _torch()
    src = torch.frombuffer(data, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8)
    sync(region.device)  # reads of the memory queued before the write come first
    region.tensor[offset : offset + n].copy_(src)
    sync(region.device)


def as_tensor(region: Region, length: int) -> Any:
    """The first ``length`` bytes of ``region`` as a 1-D uint8 tensor, without copying."""
    if region.on_gpu:
        return region.tensor[:length]
    torch = torch_needed("a GPU transfer")
    view = region.view[:length]
    if view.readonly:
        # frombuffer wants writable memory; reading from it never writes.
        view = pinned_view(region.addr, length, region.view, readonly=False)
    return torch.frombuffer(view, dtype=torch.uint8)


def copy_tensors(dst: Any, src: Any) -> None:
    """``dst.copy_(src)`` and wait until the bytes are there (runs on a worker thread).
    Work already queued on either side (any stream) finishes first."""
    _sync_all(dst, src)
    dst.copy_(src)
    _sync_all(dst, src)


# -- CUDA IPC ------------------------------------------------------------------------------


def export(region: Region) -> tuple[Any, ...]:
    """The owner's side: an IPC handle for the allocation behind ``region``, plus where the
    region starts in the exported storage: ``(share_cuda_tuple, byte_offset)``."""
    t = region.tensor
    storage = t.untyped_storage()
    return (tuple(storage._share_cuda_()), int(t.storage_offset()) * t.element_size())


def open_export(handle: tuple[Any, ...], size: int) -> Any:
    """The reader's side: map an :func:`export` and return the region as a uint8 tensor."""
    torch = torch_needed("reading GPU memory of another process")
    if not torch.cuda.is_available():
        raise RDMAError(
            "the buffer is GPU memory of a process on this host, and this process sees no "
            "CUDA device, so it cannot map it; use REGENCY_RDMA_BACKEND=tcp"
        )
    shared, offset = handle
    torch.cuda.init()  # a process that never used CUDA yet (torch's own rebuild does this)
    storage = torch.UntypedStorage._new_shared_cuda(*shared)
    device = storage.device
    t = torch.empty(0, dtype=torch.uint8, device=device)
    t.set_(storage, offset, (size,), (1,))
    return t


# -- dma-buf, for verbs -------------------------------------------------------------------

#: ``CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`` (cuda.h).
_DMA_BUF_FD = 1


def dmabuf(region: Region) -> tuple[int, int]:
    """A dma-buf fd for the GPU memory of ``region`` (CUDA 11.7+ and a driver that supports
    it), and the region's offset within it: ``cuMemGetHandleForAddressRange`` wants a range
    aligned to the host page size, so the range starts at the page holding the region's first
    byte. The caller closes the fd (a registration keeps its own reference to the buffer)."""
    import ctypes
    import os

    torch = _torch()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        get_handle = cuda.cuMemGetHandleForAddressRange
    except (OSError, AttributeError) as exc:
        raise RDMAError(f"the CUDA driver has no dma-buf export ({exc})") from None
    get_handle.argtypes = [
        ctypes.POINTER(ctypes.c_int), ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int,
        ctypes.c_ulonglong,
    ]
    get_handle.restype = ctypes.c_int
    page = os.sysconf("SC_PAGE_SIZE")
    start = region.addr & ~(page - 1)
    end = (region.addr + region.nbytes + page - 1) & ~(page - 1)
    # The driver call needs the device's context current on this thread.
    torch.cuda.set_device(torch.device(region.device))
    fd = ctypes.c_int(-1)
    rc = get_handle(ctypes.byref(fd), start, end - start, _DMA_BUF_FD, 0)
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        what = name.value.decode() if name.value else f"CUresult {rc}"
        raise RDMAError(f"cuMemGetHandleForAddressRange failed: {what}")
    return fd.value, region.addr - start
