"""Local memory as :mod:`regency.rdma` sees it: an address, a length, and what keeps it alive.

torch is never imported here: a tensor is recognised only when the caller already imported
torch (``sys.modules``), so memoryview-only programs run without it.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import attrs


@attrs.frozen(eq=False)
class Region:
    """``nbytes`` bytes at ``addr`` in this process.

    ``view`` is a format-``"B"`` memoryview of exactly that memory which keeps the original
    object (tensor, storage, memoryview) alive for as long as the view or a slice of it lives:
    slices handed to a socket or a thread can never outlive the memory they point at. GPU
    memory has no such view: ``view`` is empty and ``device`` says where the bytes are;
    backends move them through ``tensor`` (see :mod:`~regency.rdma._cuda`).
    """

    addr: int
    nbytes: int
    readonly: bool
    view: memoryview
    #: What the memory came from, for messages ("torch.Tensor", "memoryview").
    kind: str
    #: ``"cpu"``, or ``"cuda:N"`` for GPU memory.
    device: str = "cpu"
    #: The 1-D uint8 tensor of GPU memory (None for CPU memory).
    tensor: Any = None

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"


def pinned_view(addr: int, nbytes: int, keep: object, readonly: bool) -> memoryview:
    """A memoryview of ``nbytes`` at ``addr`` that holds a reference to ``keep``."""
    array = (ctypes.c_ubyte * nbytes).from_address(addr)
    vars(array)["keep"] = keep  # the view holds the array, the array holds the memory's owner
    view = memoryview(array).cast("B")
    return view.toreadonly() if readonly else view


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(obj: object) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def region_of(obj: object, what: str, *, writable: bool) -> Region:
    """Inspect ``obj`` without copying it; raise an error naming ``what`` and the fix.

    ``obj`` must be a contiguous CPU or CUDA tensor of any dtype and shape (its bytes are
    used) or a 1-D C-contiguous memoryview, at least one byte long, and writable when
    ``writable``.
    """
    if is_tensor(obj):
        return _tensor_region(obj, what)
    if isinstance(obj, memoryview):
        return _memoryview_region(obj, what, writable)
    hint = "; wrap it as memoryview(obj)" if _has_buffer(obj) else ""
    raise TypeError(
        f"{what} must be a torch.Tensor or a memoryview (got {type(obj).__name__}){hint}"
    )


def _has_buffer(obj: object) -> bool:
    try:
        memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def _tensor_region(t: Any, what: str) -> Region:
    torch = _torch()
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"{what} must be a CPU or CUDA tensor (got a tensor on {t.device}); "
            "move it first with t.cpu()"
        )
    if t.layout != torch.strided:
        raise ValueError(f"{what} must be a dense (strided) tensor (got layout {t.layout})")
    if not t.is_contiguous():
        raise ValueError(
            f"{what} must be contiguous (got shape {tuple(t.shape)}, stride {t.stride()}); "
            "copy it first with t.contiguous()"
        )
    if t.dtype != torch.uint8 or t.dim() != 1:
        # Any contiguous tensor, as in Monarch: its bytes, viewed without a copy.
        t = t.reshape(-1).view(torch.uint8)
    nbytes = int(t.numel())
    if nbytes == 0:
        raise ValueError(f"{what} must not be empty (got 0 bytes)")
    addr = int(t.data_ptr())
    if t.device.type == "cuda":
        device = f"cuda:{t.device.index if t.device.index is not None else 0}"
        return Region(addr, nbytes, False, memoryview(b""), "torch.Tensor", device, t)
    # The storage object keeps the memory even if the tensor is later re-pointed with set_().
    view = pinned_view(addr, nbytes, (t, t.untyped_storage()), readonly=False)
    return Region(addr, nbytes, False, view, "torch.Tensor")


def _memoryview_region(mv: memoryview, what: str, writable: bool) -> Region:
    if mv.ndim != 1:
        raise ValueError(
            f"{what} must be a 1-D memoryview (got {mv.ndim} dims, shape {mv.shape}); "
            "pass mv.cast('B')"
        )
    if not mv.c_contiguous:
        raise ValueError(
            f"{what} must be a C-contiguous memoryview (got strides {mv.strides}); "
            "copy it first with memoryview(bytearray(mv))"
        )
    if mv.nbytes == 0:
        raise ValueError(f"{what} must not be empty (got 0 bytes)")
    if writable and mv.readonly:
        raise TypeError(f"{what} must be writable (got a read-only memoryview)")
    # Our own export of the buffer: the caller releasing theirs cannot free the memory.
    own = memoryview(mv)
    addr = _buffer_address(own)
    return Region(addr, mv.nbytes, mv.readonly, pinned_view(addr, mv.nbytes, own, mv.readonly),
                  "memoryview")


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable layout since 3.3)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _buffer_address(mv: memoryview) -> int:
    """Start address of a C-contiguous buffer, read-only ones included (``ctypes.from_buffer``
    refuses those)."""
    view = _PyBuffer()
    _get_buffer(mv, ctypes.byref(view), 0)  # PyBUF_SIMPLE; raises on failure (pythonapi)
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))
