"""Actors for tests/core/test_waiting.py (importable by procs and by simulated runs)."""

from __future__ import annotations

from typing import Any

import trio

from regency.actor import Actor, ActorMesh, endpoint


class Sleeper(Actor):
    @endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds


class Checker(Actor):
    """Runs the waiter conformance check on its own actor thread, against its proc's
    waiter, with replies from ``sleeper``."""

    @endpoint
    def check(self, sleeper: ActorMesh[Sleeper]) -> str:
        from regency.core import _waiting
        from regency.core._current import current_runtime_or_none
        from regency.testing import check_waiter

        rt = current_runtime_or_none()
        assert rt is not None
        waiter: Any = _waiting.current()
        # Production binds the thread to its runtime's waiter; the simulator each lockstep
        # thread to its own (which its runtime's finds).
        assert waiter is rt.waiter or not waiter.runs_freely, f"an actor thread waits with {waiter!r}"
        check_waiter(waiter, lambda seconds: sleeper.nap.call_one(seconds))
        return type(waiter).__name__
