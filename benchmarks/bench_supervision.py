"""Failure detection: time from ``kill -9`` of a busy proc to the error at the
caller, and to the owner's ``__supervise__``. ``python -m benchmarks.bench_supervision``."""

from __future__ import annotations

import os
import signal
import statistics
import time

from regency.actor import Actor, MeshFailure, endpoint, this_host


class Busy(Actor):
    @endpoint
    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(Actor):
    """Owns one Busy proc; records when its __supervise__ ran (CLOCK_MONOTONIC is shared by
    the processes of one host)."""

    def __init__(self) -> None:
        self.busy = this_host().spawn_procs(per_host={"b": 1}).spawn("busy", Busy)
        self.supervised_at: float | None = None

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.supervised_at = time.monotonic()
        return True

    @endpoint
    def victim(self) -> int:
        pid: int = self.busy.pid.call_one().get(timeout=30)
        self.busy.spin.broadcast(30)
        return pid

    @endpoint
    def when(self) -> float | None:
        return self.supervised_at


def _caller_error_s() -> float:
    pm = this_host().spawn_procs(per_host={"b": 1})
    busy = pm.spawn("busy", Busy)
    pid = busy.pid.call_one().get(30)
    fut = busy.spin.call_one(30)
    time.sleep(0.05)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    try:
        fut.get(30)
    except Exception:
        pass
    elapsed = time.monotonic() - t0
    pm.stop().get(30)
    return elapsed


def _owner_notified_s() -> float:
    pm = this_host().spawn_procs(per_host={"o": 1})
    owner = pm.spawn("owner", Owner)
    pid = owner.victim.call_one().get(30)
    time.sleep(0.05)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while (at := owner.when.call_one().get(30)) is None:
        time.sleep(0.001)
    pm.stop().get(30)
    return at - t0


def run() -> list[tuple[str, str, float, str]]:
    caller = statistics.median(_caller_error_s() for _ in range(5)) * 1e3
    owner = statistics.median(_owner_notified_s() for _ in range(5)) * 1e3
    return [
        ("kill -9 of a busy proc -> SupervisionError at the caller", "< 1000", caller, "ms"),
        ("kill -9 of a busy proc -> owner's __supervise__", "", owner, "ms"),
    ]


if __name__ == "__main__":
    import regency.actor

    regency.actor.unhandled_fault_hook = lambda failure: None
    for figure, target, value, unit in run():
        print(f"{figure:60s} {value:10.1f} {unit}  target {target}")
