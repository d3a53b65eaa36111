"""The tensor engine: torch programs whose tensors live on the procs of a mesh.

Monarch's ``monarch`` tensor names, exported from :mod:`regency` (see docs/tensors.md). The
names load lazily: importing regency does not import torch.

Modules, one concept each: ``_records`` (what travels), ``_worker`` (the actor holding each
proc's tensors), ``_comm`` (gloo / simulated collectives), ``_engine`` (per-mesh controller
state and the op batcher), ``_tensor`` (the handle and torch dispatch), ``_context`` (active
mesh), ``_stream`` (streams, borrows), ``_collectives`` (reduce, to_mesh), ``_fetch``,
``_remote``, ``_grad``, ``_errors``, ``_procmesh`` (what ProcMesh gains).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Tensor": "._tensor",
    "MeshSliceTensor": "._tensor",
    "remote": "._remote",
    "fetch_shard": "._fetch",
    "inspect": "._fetch",
    "show": "._fetch",
    "call_on_shard_and_fetch": "._fetch",
    "reduce": "._collectives",
    "reduce_": "._collectives",
    "to_mesh": "._collectives",
    "slice_mesh": "._collectives",
    "Stream": "._stream",
    "Borrow": "._stream",
    "get_active_stream": "._stream",
    "get_active_mesh": "._context",
    "no_mesh": "._context",
    "grad_generator": "._grad",
    "RemoteException": "._errors",
    "current_worker_rank": "._worker",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
