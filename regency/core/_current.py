"""Which runtime the running code belongs to: one per process in production, several in
the simulator (a context variable set in each runtime's tasks and actor threads)."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._runtime import Runtime

_runtime: Runtime | None = None
#: The runtime of the code running now, where a process holds several (the simulator):
#: set in each runtime's tasks and actor threads; the process-wide one otherwise.
_runtime_var: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "regency_runtime", default=None
)


def use_runtime(rt: Runtime) -> None:
    """Make ``rt`` the current runtime of the calling context (a thread, a task, a
    ``contextvars.Context``): where a process holds several runtimes, the simulator's."""
    _runtime_var.set(rt)


def set_current_runtime(rt: Runtime) -> None:
    global _runtime
    _runtime = rt


def current_runtime_or_none() -> Runtime | None:
    return _runtime_var.get() or _runtime
