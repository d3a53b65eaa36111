"""The per-process RDMA manager: the actor through which peers talk to a buffer's owner.

Spawned on first registration in the owning process, with ``this_proc().spawn``, and carried
(as an actor mesh reference) inside every handle the process hands out. Its endpoints are all
async, so they run on the proc's trio loop without a thread hop and never wait on user code.
It is spawned outside any actor's context, so the process itself (not whichever actor happened
to register the first buffer) owns it and it lives as long as the process.
"""

from __future__ import annotations

import contextvars
import threading

from ..core import Actor, ActorMesh, endpoint, this_proc
from . import _link
from ._registry import registry


class RDMAManager(Actor):
    """Answers for the buffers of its process: where its data connection listens (leases and
    bytes go there, see :mod:`~regency.rdma._link`), and drops asked for by other processes."""

    @endpoint
    async def drop(self, buf_id: int) -> None:
        registry.drop(buf_id)

    @endpoint
    async def data_address(self) -> str:
        """The address of this process's data listener for the TCP fallback."""
        return await _link.data_address()


_manager: ActorMesh[RDMAManager] | None = None
_lock = threading.Lock()


def local_manager() -> ActorMesh[RDMAManager]:
    """This process's manager, spawned on first call."""
    global _manager
    with _lock:
        if _manager is None:
            # A fresh contextvars.Context: no current actor, so the process's root owns it.
            _manager = contextvars.Context().run(
                lambda: this_proc().spawn("rdma_manager", RDMAManager)
            )
        return _manager
