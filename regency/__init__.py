"""Regency: a single-controller actor runtime for distributed PyTorch.

User code imports :mod:`regency.actor` (Monarch's names); :func:`configure` selects
transports and limits; the tensor engine's names (``regency.Tensor``, ``regency.remote``,
``regency.inspect``, ...) are Monarch's ``monarch`` ones.
"""

from typing import Any

from . import _prestart

_prestart.start()  # the zygote imports on another core while we do (see _prestart)

from .config import configure  # noqa: E402

__version__ = "0.1.0"

# The packages above the core (debugger, tensor engine, log forwarding, the controller's boot)
# plug into it here, in every process, before anything can call it (see regency/_boot.py).
from . import _boot  # noqa: E402, F401

#: The tensor engine's names (Monarch's ``monarch`` top level); they import torch, so they
#: load on first use (docs/tensors.md).
_TENSOR_NAMES = (
    "Stream",
    "Tensor",
    "call_on_shard_and_fetch",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
)

#: Seeing inside a running job (docs/observability.md): loaded on first use.
_INTROSPECTION_NAMES = ("CallTimeoutError", "JobStacks", "stacks", "trace")

#: The live dashboard (docs/observability.md): loaded on first use.
_DASHBOARD_NAMES = ("serve_dashboard",)

__all__ = ["configure", *_INTROSPECTION_NAMES, *_DASHBOARD_NAMES, *_TENSOR_NAMES]


def __getattr__(name: str) -> Any:
    if name in _INTROSPECTION_NAMES:
        from . import introspection

        value = getattr(introspection, name)
        globals()[name] = value
        return value
    if name in _DASHBOARD_NAMES:
        from . import _dashboard

        value = getattr(_dashboard, name)
        globals()[name] = value
        return value
    if name in _TENSOR_NAMES:
        from . import _tensor_engine

        value = getattr(_tensor_engine, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'regency' has no attribute {name!r}")
