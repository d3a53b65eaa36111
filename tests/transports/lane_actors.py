"""Actors for tests/transports/test_shm_lane_procs.py (importable by procs)."""

from __future__ import annotations

import gc
from typing import Any

from regency.actor import Actor, endpoint
from regency.transports._sockets import SocketConnection


def lane_frames() -> tuple[int, int]:
    """(open connections of this process with a shared-memory lane, frames they placed in
    their rings so far). Found through the garbage collector: a test's view, not an API."""
    conns = [
        obj for obj in gc.get_objects()
        if isinstance(obj, SocketConnection) and obj.lane and not obj.closed
    ]
    return len(conns), sum(c._lane_out.placed for c in conns if c._lane_out is not None)


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
    def lane_frames(self) -> tuple[int, int]:
        return lane_frames()
