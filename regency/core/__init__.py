"""The actor core: mesh algebra, codec, futures, endpoints, meshes and the proc runtime.

Transport-agnostic: the runtime reaches the network only through :mod:`regency.transports`
and starts processes only through a :class:`ProcLauncher`.
"""

from ._actor_mesh import ActorMesh
from ._adverbs import Accumulator, Endpoint, as_endpoint, send
from ._channel import Channel, Port, PortReceiver
from ._config import Config, configure, current_config
from ._context import (
    ActorInstance,
    Context,
    context,
    current_actor_name,
    current_rank,
    current_size,
)
from ._controller import current_runtime
from ._endpoint import Actor, EndpointSpec, concurrent_endpoint, endpoint
from ._errors import (
    ActorError,
    DecodeError,
    RemoteException,
    RemoteFailure,
    SupervisionError,
    UndeliverableError,
)
from ._future import Future
from ._launcher import LocalLauncher, ProcLauncher
from ._outbox import SendBufferFull
from ._proc_mesh import HostMesh, ProcMesh, proc_mesh, this_host, this_proc
from ._runtime import Runtime
from ._shape import Extent, MeshAlgebra, Point, Shape, ValueMesh
from ._singletons import get_or_spawn_controller

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorInstance",
    "ActorMesh",
    "Channel",
    "Config",
    "Context",
    "DecodeError",
    "Endpoint",
    "EndpointSpec",
    "Extent",
    "Future",
    "HostMesh",
    "LocalLauncher",
    "MeshAlgebra",
    "Point",
    "Port",
    "PortReceiver",
    "ProcLauncher",
    "ProcMesh",
    "RemoteException",
    "RemoteFailure",
    "Runtime",
    "SendBufferFull",
    "Shape",
    "SupervisionError",
    "UndeliverableError",
    "ValueMesh",
    "as_endpoint",
    "concurrent_endpoint",
    "configure",
    "context",
    "current_actor_name",
    "current_config",
    "current_rank",
    "current_runtime",
    "current_size",
    "endpoint",
    "get_or_spawn_controller",
    "proc_mesh",
    "send",
    "this_host",
    "this_proc",
]
