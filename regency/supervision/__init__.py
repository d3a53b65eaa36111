"""Supervision: who owns which mesh, what happens when actors fail, and who is told.

The decisions live in a pure state machine (:class:`Supervisor`); the runtime feeds it events
and carries out its actions. See docs/supervision.md.
"""

from ._failure import FailureCause, MeshFailure, describe_actor
from ._machine import (
    FAILED,
    ROOT,
    RUNNING,
    STOPPED,
    Action,
    Escalate,
    Event,
    MeshSpawned,
    MeshState,
    MeshStopped,
    Notify,
    OwnerGone,
    ProcLost,
    ProcStopped,
    RanksFailed,
    RunRootHook,
    StopMeshes,
    SuperviseDone,
    Supervisor,
)

__all__ = [
    "FAILED",
    "ROOT",
    "RUNNING",
    "STOPPED",
    "Action",
    "Escalate",
    "Event",
    "FailureCause",
    "MeshFailure",
    "MeshSpawned",
    "MeshState",
    "MeshStopped",
    "Notify",
    "OwnerGone",
    "ProcLost",
    "ProcStopped",
    "RanksFailed",
    "RunRootHook",
    "StopMeshes",
    "SuperviseDone",
    "Supervisor",
    "describe_actor",
]
