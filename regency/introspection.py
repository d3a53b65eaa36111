"""Seeing inside a running job (docs/observability.md): ``stacks()`` of every proc, named
by actor, mesh, rank and endpoint; the records it returns; the ``TimeoutError`` a late call
raises; ``trace(path)``, a timeline of real runs (Chrome trace-event JSON). Stall warnings
are logged by the controller (logger ``regency.stall``; the ``stall_warning_s`` setting)."""

from .core._errors import CallTimeoutError
from .core._introspect import stacks
from .core._stacks import (
    ActorState,
    CallStack,
    Frame,
    Handled,
    JobStacks,
    ProcStacks,
    Stall,
    ThreadStack,
)
from .core._trace import trace

__all__ = [
    "ActorState",
    "CallStack",
    "CallTimeoutError",
    "Frame",
    "Handled",
    "JobStacks",
    "ProcStacks",
    "Stall",
    "ThreadStack",
    "stacks",
    "trace",
]
