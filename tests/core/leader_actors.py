"""Actors for tests/core/test_leader.py (importable by procs)."""

from __future__ import annotations

import os
import threading
import time

from regency.actor import Actor, endpoint
from regency.core._current import current_runtime_or_none

_GATE = threading.Event()


class Seq(Actor):
    """Records the order its calls arrive in."""

    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    def take(self, i: int) -> int:
        self.log.append(i)
        return i

    @endpoint
    def taken(self) -> list[int]:
        return self.log

    @endpoint
    def led(self) -> int:
        """How many times a thread of this proc read its own messages."""
        rt = current_runtime_or_none()
        assert rt is not None and rt.leader is not None
        return rt.leader.led

    @endpoint
    def spun(self) -> int:
        """How many waits of this proc's threads polled before sleeping (core/_spin.py)."""
        rt = current_runtime_or_none()
        assert rt is not None and rt.leader is not None
        return rt.leader.spun

    @endpoint
    def crowd(self, loadavg: str, spin: float) -> None:
        """This proc's threads read how many tasks are runnable from ``loadavg`` (a file
        the test writes) and may spin ``spin`` seconds."""
        from regency.core._spin import CpuGauge

        rt = current_runtime_or_none()
        assert rt is not None and rt.leader is not None
        rt.leader._gauge = CpuGauge(loadavg, cpus=2)
        rt.leader.spin = spin

    @endpoint
    def take_slowly(self, i: int) -> int:
        time.sleep(0.02)
        return i

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def block(self) -> None:
        threading.Event().wait()


class Gate(Actor):
    @endpoint
    def wait(self) -> str:
        return "opened" if _GATE.wait(60) else "timed out"


class Opener(Actor):
    @endpoint
    def open(self) -> None:
        _GATE.set()


class AsyncSeq(Actor):
    """Only async endpoints: an all-async actor, driven by a trio task on the proc's loop."""

    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    async def take(self, i: int) -> int:
        self.log.append(i)
        return i

    @endpoint
    async def spun(self) -> int:
        """How many waits of this proc polled before sleeping (its loop's included)."""
        rt = current_runtime_or_none()
        assert rt is not None and rt.leader is not None
        return rt.leader.spun
