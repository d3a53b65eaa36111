"""Actors for the hardening tests (importable by child procs)."""

from __future__ import annotations

import os
import time
from typing import Any

from regency.actor import Actor, endpoint


def _environ_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


class EnvProbe(Actor):
    @endpoint
    def secret_seen(self) -> dict[str, Any]:
        """Where this proc (and the process that forked it) could find REGENCY_SECRET."""
        return {
            "os.environ": "REGENCY_SECRET" in os.environ,
            "/proc/self/environ": b"REGENCY_SECRET=" in _environ_of(os.getpid()),
            "parent": os.getppid(),
            "/proc/parent/environ": b"REGENCY_SECRET=" in _environ_of(os.getppid()),
        }


class ExitOnUnpickle:
    """Unpickling this raises ``exc`` (what a buggy or hostile value's __reduce__ can do)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __reduce__(self) -> Any:
        return (_raise, (self.exc,))


def _raise(exc: BaseException) -> None:
    raise exc


class Returner(Actor):
    @endpoint
    def give(self, what: str) -> Any:
        if what == "systemexit":
            return ExitOnUnpickle(SystemExit(3))
        if what == "valueerror":
            return ExitOnUnpickle(ValueError("bad state in __setstate__"))
        if what == "baseexception":
            return ExitOnUnpickle(GeneratorExit())
        return what

    @endpoint
    def take(self, value: Any) -> str:
        return f"took {value!r}"

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Busy(Actor):
    @endpoint
    def crunch(self, seconds: float) -> float:
        """Hold the GIL in one C call (a sum over a range object) for at least ``seconds``;
        return how long that one call took. Calibrated here, now, and retried longer if the
        machine got faster meanwhile."""
        n = 2_000_000
        started = time.perf_counter()
        sum(range(n))
        took = time.perf_counter() - started
        while True:
            n = int(n * 1.2 * seconds / max(took, 1e-6))
            started = time.monotonic()
            total = sum(range(n))
            took = time.monotonic() - started
            if took >= seconds or total < 0:
                return round(took, 1)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Big(Actor):
    @endpoint
    def take(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def give(self, n: int) -> bytes:
        return bytes(n)

    @endpoint
    def rss(self) -> int:
        import gc

        gc.collect()
        return rss()
