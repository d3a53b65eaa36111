"""Actors for tests/core/test_flood.py and test_busy_link.py (importable by child procs)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from regency.actor import Actor, ActorMesh, Channel, Port, endpoint
from regency.core._outbox import SendBufferFull


class Sink(Actor):
    """Receives stamped values on a channel and checks they come in order, once each."""

    def __init__(self) -> None:
        self.port, self.receiver = Channel[Any].open()
        self.got = 0
        self.errors: list[str] = []

    @endpoint
    async def open(self) -> Port[Any]:
        return self.port

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def drain(self, n: int) -> tuple[int, list[str]]:
        """Take ``n`` values: each ``(seq, payload)`` must be the next number."""
        for _ in range(n):
            seq, _payload = await self.receiver.recv()
            if seq != self.got:
                self.errors.append(f"got {seq} where {self.got} was due")
            self.got = seq + 1
        return self.got, self.errors


class Flooder(Actor):
    """Sends from its proc's loop (an async endpoint) without ever yielding."""

    @endpoint
    async def flood(self, port: Port[Any], n: int, size: int) -> tuple[int, str]:
        """Send up to ``n`` values of ``size`` bytes; how many went, and the error that
        stopped it ("" if none)."""
        blob = b"x" * size
        for seq in range(n):
            try:
                port.send((seq, blob))
            except SendBufferFull as exc:
                return seq, str(exc)
        return n, ""


class Hog(Actor):
    """Holds its proc's GIL in one C call (a sync endpoint: on its actor thread)."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def hold_gil(self, seconds: float) -> float:
        """Compute for ``seconds`` without letting another thread of the proc run: the GIL's
        switch interval is raised past that, so the loop thread, which waits for the GIL,
        does not get it before this returns (a long C call would do the same, for a
        duration that depends on the machine's load); returns how long it took."""
        interval = sys.getswitchinterval()
        sys.setswitchinterval(seconds + 60.0)
        try:
            t0 = time.monotonic()
            end = t0 + seconds
            while time.monotonic() < end:
                pass
            return time.monotonic() - t0
        finally:
            sys.setswitchinterval(interval)

    @endpoint
    async def echo(self, value: Any) -> Any:
        return value


class Caller(Actor):
    """Calls another proc's actor: a sibling's view of a busy or stopped proc."""

    @endpoint
    async def echo_via(self, target: ActorMesh[Hog], value: Any) -> Any:
        return await target.echo.call_one(value)
