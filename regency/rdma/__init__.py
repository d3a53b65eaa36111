"""Bulk memory moved between processes apart from actor messages: Monarch's ``monarch.rdma``.

``RDMABuffer(t)`` registers local memory (a ``torch.uint8`` CPU tensor or a memoryview) and
is a small picklable handle; other actors ``read_into`` their memory from it or ``write_from``
theirs into it. Backends, chosen per transfer (``REGENCY_RDMA_BACKEND`` or
:func:`set_backend` force one):

* ``same_host``: one ``process_vm_readv``/``process_vm_writev`` copy between two processes of
  one host (or a ``memmove`` within one);
* ``tcp``: chunked and pipelined on a dedicated authenticated connection, across hosts;
* ``ibverbs``: one-sided RDMA READ/WRITE through pyverbs on an RDMA NIC (the ``rdma`` extra),
  for buffers on other hosts when this process has a usable device.

In a simulated cluster every transfer between simulated procs runs on the data connection
over the simulated network, so the simulator's faults apply. GPU memory (CUDA tensors) moves
through CUDA IPC on one host and through host memory over TCP. torch is optional: it is
imported only by callers that pass tensors. See docs/rdma.md.
"""

from __future__ import annotations

# _buffer first: a proc may unpickle an RDMABuffer (importing regency.rdma._buffer) on its
# loop while another thread imports this package for an actor's module. Were this package
# holding the lock of a module _buffer needs, the two imports would deadlock and Python would
# hand one of them a half-initialized _buffer (ImportError, seen in Monarch's RDMA tests).
from ._buffer import LocalMemory, RDMAAction, RDMABuffer  # isort: skip
from . import _ibverbs  # isort: skip
from ._backend import BACKEND_CHOICES, Backend, backend_choice, set_backend  # isort: skip
from ._errors import (
    RDMABufferDroppedError,
    RDMAError,
    RDMAOwnerLostError,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
)
from ._host import same_host_supported


def is_ibverbs_available() -> bool:
    """Whether pyverbs and an RDMA device are present, so that the verbs backend can run."""
    return _ibverbs.is_available()


def is_rdma_available() -> bool:
    """Whether :class:`RDMABuffer` works here: always True in Regency, which falls back to a
    same-host copy or TCP where Monarch needs an RDMA NIC (or its TCP fallback enabled)."""
    return True


def get_rdma_backend() -> str:
    """Monarch's answer: ``"ibverbs"`` where transfers use an RDMA NIC (pyverbs and a device
    are present, or the verbs backend is forced), else ``"tcp"``: Regency always has a path
    without a NIC, so it never answers Monarch's ``"none"``. :func:`get_rdma_path` says which
    of Regency's paths that is."""
    return "ibverbs" if get_rdma_path() == "ibverbs" else "tcp"


def get_rdma_path() -> str:
    """The path transfers started here take: the forced backend if configured, else
    ``"tcp"`` in a simulated cluster (the data connection over the simulated network), else
    ``"ibverbs"`` where pyverbs and an RDMA device are present (buffers on this host still
    use same-host copies), else ``"same_host"`` where the platform allows same-host copies
    (buffers on other hosts go through ``"tcp"``), else ``"tcp"``."""
    choice = backend_choice()
    if choice != "auto":
        return choice
    from ._state import current_state
    from ._transfer import same_host_refused

    if current_state().simulated:
        return "tcp"
    if _ibverbs.is_available():
        return "ibverbs"
    return "same_host" if same_host_supported() and not same_host_refused() else "tcp"


__all__ = [
    "BACKEND_CHOICES",
    "Backend",
    "LocalMemory",
    "RDMAAction",
    "RDMABuffer",
    "RDMABufferDroppedError",
    "RDMAError",
    "RDMAOwnerLostError",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "get_rdma_path",
    "is_ibverbs_available",
    "is_rdma_available",
    "set_backend",
]
