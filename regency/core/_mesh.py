"""Meshes, endpoints, ports and channels: re-exported from the modules that hold them
(:mod:`._actor_mesh`, :mod:`._proc_mesh`, :mod:`._adverbs`, :mod:`._replies`,
:mod:`._channel`, :mod:`._children`), for code that imports them from here."""

from ._actor_mesh import ActorMesh, ProcRef
from ._adverbs import Accumulator, Endpoint, as_endpoint, send
from ._channel import Channel, Port, PortReceiver
from ._children import _stop_procs, _wait_ready, stop_owned_procs
from ._proc_mesh import HostMesh, ProcMesh, proc_mesh, this_host, this_proc
from ._replies import Replies, _Acks, _Route

__all__ = [
    "Accumulator",
    "ActorMesh",
    "Channel",
    "Endpoint",
    "HostMesh",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "ProcRef",
    "Replies",
    "_Acks",
    "_Route",
    "_stop_procs",
    "_wait_ready",
    "as_endpoint",
    "proc_mesh",
    "send",
    "stop_owned_procs",
    "this_host",
    "this_proc",
]
