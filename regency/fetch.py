"""Monarch's ``monarch.fetch``: bring a mesh tensor's value (or one shard of it) back to the
controller. The same functions as ``regency.fetch_shard``, ``regency.inspect`` and
``regency.show`` (docs/tensors.md); importing this module imports torch."""

from __future__ import annotations

from ._tensor_engine import fetch_shard, inspect, show

__all__ = ["fetch_shard", "inspect", "show"]
