"""Monarch's ``monarch.actor`` names, under ``regency.actor``.

Porting a Monarch program is changing ``monarch`` to ``regency`` in its imports; see
docs/porting.md for every difference.
"""

from .core import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Extent,
    Future,
    HostMesh,
    Point,
    Port,
    PortReceiver,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    as_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    proc_mesh,
    send,
    this_host,
    this_proc,
)

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "Channel",
    "Extent",
    "Future",
    "HostMesh",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "SupervisionError",
    "ValueMesh",
    "as_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "endpoint",
    "proc_mesh",
    "send",
    "this_host",
    "this_proc",
]
