"""Actors for tests/core/test_bulk.py (importable by procs)."""

from __future__ import annotations

from typing import Any

from regency.actor import Actor, endpoint


class Keeper(Actor):
    """Keeps what it is sent, to check later that nothing changed it."""

    def __init__(self) -> None:
        self.kept: list[Any] = []

    @endpoint
    def keep(self, value: Any) -> None:
        self.kept.append(value)

    @endpoint
    def sums(self) -> list[float]:
        return [float(v.sum()) for v in self.kept]

    @endpoint
    def echo(self, value: Any) -> Any:
        return value
