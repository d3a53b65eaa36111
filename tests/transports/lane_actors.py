"""Actors for tests/transports/test_shm_lane_procs.py (importable by procs)."""

from __future__ import annotations

import gc
from typing import Any

from regency.actor import Actor, endpoint
from regency.transports._sockets import SocketConnection


def lane_frames() -> dict[int, int]:
    """Frames each open connection of this process with a shared-memory lane placed in its
    ring so far, by the connection's id. Found through the garbage collector: a test's
    view, not an API."""
    return {
        id(obj): obj._lane_out.placed
        for obj in gc.get_objects()
        if type(obj) is SocketConnection and obj._lane_out is not None and not obj.closed
    }


def placed_since(before: dict[int, int], after: dict[int, int]) -> int:
    """Frames placed between two :func:`lane_frames` (connections closed meanwhile aside)."""
    return sum(n - before.get(conn, 0) for conn, n in after.items())


class Holder(Actor):
    def __init__(self) -> None:
        self.kept: list[Any] = []

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def keep(self, value: Any) -> int:
        self.kept.append(value)
        return len(self.kept)

    @endpoint
    def kept_bytes(self) -> list[bytes]:
        return [bytes(v) for v in self.kept]

    @endpoint
    def lane_frames(self) -> dict[int, int]:
        return lane_frames()
