"""Identities for workers' host services: Monarch's service ProcId helpers.

Monarch names each worker's host service with a fresh instance ProcId (``service<2Mu...>``)
and passes it to the worker inside a ProcAddr, ``<proc-id>@<address>``. Per-host launchers
put the whole ProcAddr in the worker's address; launchers that set one environment for many
workers (a SLURM array, a Kubernetes StatefulSet) set a JSON list of ProcIds in
:data:`SERVICE_PROC_IDS_ENV` and each worker's index in :data:`SERVICE_PROC_RANK_ENV`.

Regency's worker functions and ``attach_to_workers`` (from ``regency.actor``) accept such
ProcAddr strings; a worker is reached by its address and authenticated by the job secret,
so the identity itself changes nothing there. The variables are named ``REGENCY_...``, as
every Monarch ``MONARCH_...`` variable is here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from ..actor import ProcId, Uid

#: A JSON list of service ProcIds shared by the workers of one launch.
SERVICE_PROC_IDS_ENV = "REGENCY_SERVICE_PROC_IDS"
#: Each worker's index into :data:`SERVICE_PROC_IDS_ENV`.
SERVICE_PROC_RANK_ENV = "REGENCY_SERVICE_PROC_RANK"


def new_service_proc_id() -> ProcId:
    """A fresh instance ProcId for a worker's host service (``service<...>``)."""
    return ProcId(Uid.instance("service"))


def serialize_service_proc_ids(proc_ids: Sequence[ProcId]) -> str:
    """ProcIds as the JSON list a launcher puts in :data:`SERVICE_PROC_IDS_ENV`."""
    return json.dumps([str(proc_id) for proc_id in proc_ids])


def deserialize_service_proc_ids(serialized: str) -> list[ProcId]:
    """The ProcIds of :func:`serialize_service_proc_ids`'s JSON list."""
    items = json.loads(serialized)
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError(f"expected a JSON list of proc ids (got {serialized!r})")
    return [ProcId.from_string(item) for item in items]


def service_proc_addr(address: str, proc_id: ProcId | None) -> str:
    """``<proc-id>@<address>``, or ``address`` itself without an identity."""
    return address if proc_id is None else f"{proc_id}@{address}"


def service_proc_addrs(addresses: Sequence[str], proc_ids: Sequence[ProcId] | None) -> list[str]:
    """:func:`service_proc_addr` of corresponding addresses and ProcIds."""
    if proc_ids is None:
        return list(addresses)
    if len(addresses) != len(proc_ids):
        raise ValueError(
            f"got {len(addresses)} worker addresses and {len(proc_ids)} service ProcIds"
        )
    return [
        service_proc_addr(address, proc_id)
        for address, proc_id in zip(addresses, proc_ids, strict=True)
    ]


def ranked_service_proc_id_from_env(*, rank_env: str = SERVICE_PROC_RANK_ENV) -> ProcId | None:
    """This worker's ProcId: the entry of :data:`SERVICE_PROC_IDS_ENV` at the index in
    ``rank_env`` (``SLURM_NODEID``, a pod index, ...). None when either is unset, so the
    caller falls back to a plain address."""
    serialized = os.environ.get(SERVICE_PROC_IDS_ENV)
    if serialized is None:
        return None
    rank = os.environ.get(rank_env)
    if rank is None:
        return None
    return deserialize_service_proc_ids(serialized)[int(rank)]
