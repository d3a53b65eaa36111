"""What :mod:`regency.rdma` keeps per runtime: registry, manager, data listener, links, verbs.

A real process has one runtime, so this is per process there. A simulated cluster runs every
simulated proc in one OS process, each with its own runtime; keeping this state per runtime
gives each simulated proc its own buffers, manager, listener and connections, and makes a
second run of the same seed in the same OS process start from the same ids (so its frames,
and its trace, are identical).

In a simulation the owner of a buffer is named by its simulated host and proc id, never by
the OS pid (which every simulated proc shares): same-host copies never happen there, and the
data connection runs over the simulated network, where its faults apply.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..core import current_runtime
from ._host import host_identity
from ._registry import Registry, registry

if TYPE_CHECKING:
    from ..core import ActorMesh, Runtime

@attrs.define(eq=False)
class ProcState:
    """The RDMA state of one runtime (one proc)."""

    registry: Registry
    simulated: bool
    #: Names the owner's machine in handles: :func:`host_identity` for real procs (equal
    #: exactly when a pid means the same process), ``sim:HOST`` in a simulation.
    host: str
    #: The OS pid in handles (0 in a simulation: no pid names a simulated proc).
    pid: int
    #: This proc's RDMA manager actor, spawned on first registration.
    manager: ActorMesh[Any] | None = None
    #: The data listener's address, once open (see _link).
    data_address: str | None = None
    listen_lock: trio.Lock | None = None
    #: Owner (host, pid, proc id) -> its data listener's address.
    addresses: dict[tuple[str, int, str], str] = attrs.Factory(dict)
    #: Data listener address -> our open link to it (a ``_link.Link``).
    links: dict[str, Any] = attrs.Factory(dict)
    dial_locks: dict[str, trio.Lock] = attrs.Factory(dict)
    #: The verbs device of this proc once opened (an ``_ibverbs.VerbsDevice``), or the error
    #: that opening it raised (not retried).
    verbs: Any = None
    #: Owners (host, pid, proc id) that refused verbs (no device there): auto skips verbs.
    verbs_refused: set[tuple[str, int, str]] = attrs.Factory(set)


_states: weakref.WeakKeyDictionary[Runtime, ProcState] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def state_of(rt: Runtime) -> ProcState:
    with _lock:
        state = _states.get(rt)
        if state is None:
            host = rt.env.simulated_host
            if host is not None:
                # The simulator's clock: leases expire in virtual time.
                state = ProcState(Registry(rt.env.clock), True, f"sim:{host}", 0)
            else:
                state = ProcState(registry, False, host_identity(), os.getpid())
            _states[rt] = state
        return state


def current_state() -> ProcState:
    """The state of the runtime this code runs in (starting the controller's if needed)."""
    return state_of(current_runtime())
