"""RDMA verbs through pyverbs: the seam for one-sided READ/WRITE on an RDMA NIC.

Not implemented in this version: this machine has neither an RDMA device nor pyverbs, and an
untested verbs path would be worse than none. What exists is the detection (so
:func:`~regency.rdma.is_ibverbs_available` answers truthfully) and a backend that fails with a
clear error when it is forced. ``auto`` never picks it.

The plan, for whoever has the hardware (see docs/rdma.md): ``Context``/``PD`` per device, an
``MR`` per registered buffer (``DmaBufMR`` for CUDA memory) whose rkey travels in the handle,
RC queue pairs set up per (reader proc, owner proc) with their details exchanged through the
owner's RDMA manager, ``SendWR`` with ``IBV_WR_RDMA_READ``/``IBV_WR_RDMA_WRITE``, and
completions awaited through the ``CompChannel``'s fd with ``trio.lowlevel.wait_readable``.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from ._backend import Backend, Transfer

IMPLEMENTED = False
_SYSFS = "/sys/class/infiniband"


@functools.cache
def pyverbs_installed() -> bool:
    return importlib.util.find_spec("pyverbs") is not None


def devices() -> list[str]:
    """Names of the RDMA devices the kernel shows (``/sys/class/infiniband``)."""
    try:
        return sorted(os.listdir(_SYSFS))
    except OSError:
        return []


def is_available() -> bool:
    """pyverbs is importable and an RDMA device exists (whether or not this version can use
    them: see :data:`IMPLEMENTED`)."""
    return pyverbs_installed() and bool(devices())


def unavailable_reason() -> str:
    found = devices()
    parts = [
        "pyverbs is " + ("installed" if pyverbs_installed() else "not installed"),
        f"RDMA devices: {', '.join(found) if found else 'none in ' + _SYSFS}",
    ]
    reason = (
        "ibverbs backend needs pyverbs and an RDMA device (" + "; ".join(parts) + ")"
    )
    if not IMPLEMENTED:
        reason += (
            "; this version of regency does not implement verbs transfers yet. "
            "Use REGENCY_RDMA_BACKEND=auto (same-host copies, else TCP)"
        )
    return reason


class IbverbsBackend(Backend):
    name = "ibverbs"

    async def run(self, transfer: Transfer) -> None:
        raise RuntimeError(f"{transfer.describe()} failed: {unavailable_reason()}")
