"""The simulated cluster: a deterministic network, virtual time, faults and exact replay.

The same core and supervision code that production runs can run here, inside one
``trio.run`` on a mock clock, with every decision drawn from one seeded generator. This
package provides the ``sim://`` transport (:class:`SimNetwork`), its faults
(:class:`Faults`, explicit :class:`FaultSchedule` entries and the Hypothesis strategy
:func:`fault_schedules`), and the tools that run a workload deterministically and check that
it is (:func:`run_deterministic`, :func:`check_determinism`, :class:`Trace`), and
:func:`explore`, which runs a program on many seeds in parallel worker processes and returns
the failing runs with their replay lines.
"""

from __future__ import annotations

from ._buggify import Buggify
from ._clock import (
    DEFAULT_TIMEOUT,
    SimEvent,
    Trace,
    check_determinism,
    current_trace,
    run_deterministic,
)
from ._cluster import (
    ReplayDiverged,
    SimCluster,
    SimLauncher,
    SimResult,
    check_simulation,
    current,
    simulate,
)
from ._explore import ExploreFailure, ExploreResult, explore
from ._export import chrome_trace, write_chrome_trace
from ._invariants import InvariantChecker, InvariantViolation
from ._network import (
    SCHEME,
    ClogFault,
    CrashHostFault,
    CrashProcFault,
    DelayFault,
    DisconnectFault,
    Faults,
    FaultSchedule,
    Latency,
    LinkFaults,
    PartitionFault,
    PauseProcFault,
    ScheduledFault,
    SimConnection,
    SimListener,
    SimNetwork,
    SimTransport,
    fault_schedules,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "SCHEME",
    "Buggify",
    "ClogFault",
    "CrashHostFault",
    "CrashProcFault",
    "DelayFault",
    "DisconnectFault",
    "ExploreFailure",
    "ExploreResult",
    "FaultSchedule",
    "Faults",
    "InvariantChecker",
    "InvariantViolation",
    "Latency",
    "LinkFaults",
    "PartitionFault",
    "PauseProcFault",
    "ReplayDiverged",
    "ScheduledFault",
    "SimCluster",
    "SimConnection",
    "SimEvent",
    "SimLauncher",
    "SimListener",
    "SimNetwork",
    "SimResult",
    "SimTransport",
    "Trace",
    "check_determinism",
    "check_simulation",
    "chrome_trace",
    "current",
    "current_trace",
    "explore",
    "fault_schedules",
    "run_deterministic",
    "simulate",
    "write_chrome_trace",
]
