"""The per-proc RDMA manager: the actor through which peers talk to a buffer's owner.

Spawned on first registration in the owning proc, with ``this_proc().spawn``, and carried
(as an actor mesh reference) inside every handle the proc hands out. Its endpoints are all
async, so they run on the proc's trio loop without a thread hop and never wait on user code.
It is spawned outside any actor's context, so the proc itself (not whichever actor happened
to register the first buffer) owns it and it lives as long as the proc.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, cast

from ..core import Actor, ActorMesh, endpoint, this_proc
from . import _link
from ._state import current_state


class RDMAManager(Actor):
    """Answers for the buffers of its proc: where its data connection listens (leases and
    bytes go there, see :mod:`~regency.rdma._link`), drops asked for by other procs, verbs
    queue-pair setup, and CUDA IPC exports."""

    @endpoint
    async def drop(self, buf_id: int) -> None:
        current_state().registry.drop(buf_id)

    @endpoint
    async def data_address(self) -> str:
        """The address of this proc's data listener."""
        return await _link.data_address()

    @endpoint
    async def verbs_connect(self, peer: str, info: bytes) -> bytes:
        """Connect a queue pair of this proc to the requester ``peer``'s, whose details are
        ``info`` (see :mod:`~regency.rdma._verbs_info`); answer with ours."""
        from ._ibverbs import accept_queue_pair

        return await accept_queue_pair(current_state(), peer, info)

    @endpoint
    async def cuda_export(
        self, buf_id: int, nbytes: int, write: bool, mapped: tuple[int, ...] = ()
    ) -> tuple[tuple[Any, ...], tuple[int, ...]]:
        """A CUDA IPC handle for GPU buffer ``buf_id``, for one requesting process, and which
        of the buffers that process still maps (``mapped``) are dropped: it unmaps them, so
        their memory can be freed here (torch keeps an exported block until every mapping of
        it is closed)."""
        from . import _cuda
        from ._errors import RDMAError

        registry = current_state().registry
        entry = registry.check(buf_id, nbytes, write=write)
        if not entry.region.on_gpu:
            raise RDMAError(f"RDMABuffer #{buf_id} is not GPU memory")
        return _cuda.export(entry.region), tuple(b for b in mapped if not registry.live(b))


_lock = threading.Lock()


def local_manager() -> ActorMesh[RDMAManager]:
    """This proc's manager, spawned on first call."""
    state = current_state()
    with _lock:
        if state.manager is None:
            # A fresh contextvars.Context: no current actor, so the proc's root owns it. The
            # runtime is passed explicitly: in a simulation it lives in a context variable.
            from ..core._controller import current_runtime
            from ..core._current import use_runtime

            rt = current_runtime()

            def spawn() -> ActorMesh[RDMAManager]:
                use_runtime(rt)
                mesh = this_proc().spawn("rdma_manager", RDMAManager)
                return cast("ActorMesh[RDMAManager]", mesh)

            state.manager = contextvars.Context().run(spawn)
        manager: ActorMesh[RDMAManager] = state.manager
        return manager
