"""The errors of :mod:`regency.rdma`.

Each subclasses the builtin (or Regency) error a caller would already catch for that kind of
fault, so ``except SupervisionError`` still sees a lost owner and ``except ValueError`` a bad
argument. Remote failures cross processes pickled, so these classes take one message argument.
"""

from __future__ import annotations

from ..core import SupervisionError


class RDMAError(RuntimeError):
    """A transfer to or from an :class:`~regency.rdma.RDMABuffer` failed."""


class RDMABufferDroppedError(RDMAError):
    """The buffer was released with ``drop()``: no transfer may start on it any more."""


class RDMAOwnerLostError(RDMAError, SupervisionError):
    """The process that owns the buffer's memory is gone or cannot be reached.

    Also a :class:`~regency.actor.SupervisionError`, the error any call to a lost proc raises.
    """


def owner_lost(what: str, detail: str) -> RDMAOwnerLostError:
    """The one wording of a lost owner: ``the owner of <what> is gone: <detail>``."""
    return RDMAOwnerLostError(f"the owner of {what} is gone: {detail}")
