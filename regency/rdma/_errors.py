"""The errors of :mod:`regency.rdma`.

Each subclasses the builtin (or Regency) error a caller would already catch for that kind of
fault, so ``except SupervisionError`` still sees a lost owner and ``except ValueError`` a bad
argument. Remote failures cross processes pickled, so these classes take one message argument.
"""

from __future__ import annotations

import warnings

from ..core import SupervisionError


class RDMAError(RuntimeError):
    """A transfer to or from an :class:`~regency.rdma.RDMABuffer` failed."""


class RDMABufferDroppedError(RDMAError):
    """The buffer was released with ``drop()``: no transfer may start on it any more."""


class RDMAOwnerLostError(RDMAError, SupervisionError):
    """The process that owns the buffer's memory is gone or cannot be reached.

    Also a :class:`~regency.actor.SupervisionError`, the error any call to a lost proc raises.
    """


class RDMAReadTransferWarning(Warning):
    """Monarch's category for warnings about ``read_into`` transfers (shown once per process,
    as in Monarch). Monarch 0.7 defines it without raising it; so does Regency, so that
    filters naming it keep working."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's category for warnings about ``write_from`` transfers (shown once per
    process). Defined, never raised, as in Monarch 0.7."""


class RDMATcpFallbackWarning(Warning):
    """Monarch's warning that RDMA bytes travel over TCP instead of an RDMA NIC (shown once
    per process). Monarch raises it when an ``RDMABuffer`` is made on a machine without
    ibverbs; Regency chooses the path per transfer (a same-host copy needs no NIC and is not
    a fallback), and defines the category for filters (docs/porting.md)."""


# As Monarch: each of these is shown once per process, however many transfers meet it.
warnings.simplefilter("once", RDMAReadTransferWarning)
warnings.simplefilter("once", RDMAWriteTransferWarning)
warnings.simplefilter("once", RDMATcpFallbackWarning)


def owner_lost(what: str, detail: str) -> RDMAOwnerLostError:
    """The one wording of a lost owner: ``the owner of <what> is gone: <detail>``."""
    return RDMAOwnerLostError(f"the owner of {what} is gone: {detail}")
