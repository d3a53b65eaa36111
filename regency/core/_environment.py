"""What the world gives a runtime: the one record through which production and the simulator
differ.

A :class:`Runtime` never asks which world it runs in. Everything that differs between a real
process and a simulated proc (how frames move, how procs start, where blocking actor code
runs, what time it is, who observes, where a new proc listens, what names the machine) comes
in an :class:`Environment`, chosen above the core: production procs and the controller take
:func:`production`, the simulator (:mod:`regency.sim`) builds its own, and
:mod:`regency._boot` picks between them for a controller by configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import attrs
import trio

from .. import transports
from ._executor import Executor, ThreadExecutor
from ._inbound import _ACK_DELAY, _ACK_EVERY
from ._launcher import ProcLauncher, default_launcher
from ._leader import Leader
from ._ticker import Ticker, TrioTicker
from ._waiting import LOCK, Waiter

if TYPE_CHECKING:
    from ._probe import Probe
    from ._runtime import Runtime

#: Opens a runtime's transport for the lifetime of :meth:`Runtime.serve`.
TransportFactory = Callable[["Runtime"], AbstractAsyncContextManager[transports.Transport]]
#: Makes a runtime's executor: where its actor threads run and how they block.
ExecutorFactory = Callable[["Runtime"], Executor]
#: Makes a runtime's waiter: how its threads wait for futures (core/_waiting.py).
WaiterFactory = Callable[["Runtime"], Waiter]


def production_waiter(rt: Runtime) -> Waiter:
    """A thread that waits reads its reply off the sockets itself (``thread_reads``,
    core/_leader.py), else waits on a lock the loop releases."""
    return Leader(rt) if rt.config.thread_reads else LOCK


def open_real_transport(rt: Runtime) -> AbstractAsyncContextManager[transports.Transport]:
    """Sockets, nng and the in-process transport, behind the job secret's handshake."""
    return transports.open_transport(
        rt.secret,
        max_frame_bytes=rt.config.max_frame_bytes,
        protect_tcp=rt.config.tcp_protection != "off",
        shm_lane=rt.config.shm_lane,
    )


def _no_host_launcher(worker: str) -> ProcLauncher | None:
    return None


@attrs.frozen
class Environment:
    """The world a runtime runs in. Immutable: a runtime is given one and keeps it."""

    #: Opens the runtime's transport (``serve`` holds it open).
    transport: TransportFactory = open_real_transport
    #: Makes the launcher for procs this runtime starts on its own host, given the runtime's
    #: nursery (called once, when ``serve`` starts).
    launcher: Callable[[trio.Nursery], ProcLauncher] = default_launcher
    #: A launcher for a host named by a ``HostRef.worker``, when this runtime can start procs
    #: there directly (the simulator's hosts); None: the host's worker daemon starts them.
    host_launcher: Callable[[str], ProcLauncher | None] = _no_host_launcher
    #: Where actor threads run and how they block (the "sync runner"): real threads
    #: (:class:`ThreadExecutor`), or the simulator's lockstep threads, which run the same
    #: mailbox code (:mod:`._executor`).
    executor: ExecutorFactory = ThreadExecutor
    #: How its threads wait for futures: production's leader (a thread reads its own
    #: reply, spinning first where that pays), or the simulator's lockstep waiter.
    waiter: WaiterFactory = production_waiter
    #: Runs a runtime's periodic jobs (heartbeats, watchdog): sleeps here; the simulator's
    #: skips idle virtual time (:mod:`._ticker`).
    ticker: Ticker = attrs.field(factory=TrioTicker)
    #: Seconds on a monotonic clock, readable from any thread of the runtime (the simulator's
    #: is its virtual clock). Runtime code on the trio loop uses ``trio.current_time()``,
    #: which the simulator also owns.
    clock: Callable[[], float] = time.monotonic
    #: Told what delivery and supervision do (the simulator's invariant checker); None in
    #: production, where the cost is one attribute test.
    probe: Probe | None = None
    #: The simulated host this runtime runs on; None for a real OS process. Procs of one
    #: simulated cluster share an OS process, so pids and memory addresses name nothing
    #: between them (RDMA uses this to choose its data path).
    simulated_host: str | None = None
    #: Where RDMA's data listener listens (the simulator's: a fresh name on the simulated
    #: host); None: TCP, on the host of the runtime's own address or the configured one.
    data_listen_address: str | None = None
    #: A receiver acknowledges after this many frames or this many seconds (the simulator's
    #: "buggify" runs change them to stress the delivery layer).
    ack_every: int = _ACK_EVERY
    ack_delay: float = _ACK_DELAY


#: The environment of a real OS process.
PRODUCTION = Environment()


def production() -> Environment:
    """The environment of a real OS process (the controller, a proc, a worker daemon)."""
    return PRODUCTION
