"""Monarch's ``monarch.actor`` names, under ``regency.actor``.

Porting a Monarch program is changing ``monarch`` to ``regency`` in its imports; see
docs/porting.md for every difference.
"""

from . import _actor_config as config
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
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    proc_mesh,
    send,
    this_host,
    this_proc,
)
from .core._bootstrap_command import BootstrapCommand, default_bootstrap_cmd
from .core._controller import shutdown_context
from .core._hosts import attach_to_workers
from .core._oversight import UnhandledFault, default_unhandled_fault_hook
from .core._worker_loop import run_worker_loop_forever
from .supervision import MeshFailure

#: Called with a :class:`MeshFailure` that no owner handled. The default prints the report
#: and stops the program (exit status 1) within a few seconds, also when the main thread
#: sleeps or waits on a future. Assign your own; one that returns drops the fault.
unhandled_fault_hook = default_unhandled_fault_hook

config.install_log_prefix()  # inside actors only: the controller's own logs are untouched

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "SupervisionError",
    "UnhandledFault",
    "ValueMesh",
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "endpoint",
    "get_or_spawn_controller",
    "proc_mesh",
    "run_worker_loop_forever",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "unhandled_fault_hook",
]
