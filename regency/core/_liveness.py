"""Telling a busy proc from a stuck one.

A proc's heartbeats come from its trio loop, which needs the GIL: a C call that holds the
GIL for a long time (``sum(range(10**10))``, a big NumPy reduction) silences them although
nothing is wrong. So before a silent proc is declared stuck, whoever can see it (its spawner
on the same host, or the worker that launched it) looks at the kernel's record of it: a proc
whose CPU time keeps advancing and that is not stopped is computing; a stopped one (SIGSTOP,
a debugger) or one that uses no CPU while silent is stuck.

Pure except for reading ``/proc`` (Linux); elsewhere nothing is ever "busy", and silence
alone decides, as before.
"""

from __future__ import annotations


def cpu_sample(pid: int) -> tuple[str, int] | None:
    """(state letter, user + system CPU ticks) of ``pid``, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    try:
        return fields[0].decode(), int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


#: Process states (``/proc/PID/stat``) in which a proc cannot be making progress.
_HALTED = frozenset("TtZXx")


class BusyWatch:
    """Remembers each pid's CPU time, and when it last advanced, between looks."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, float | None]] = {}

    def busy(self, pid: int, now: float, window: float) -> bool:
        """True when ``pid`` is not stopped and its CPU time advanced within the last
        ``window`` seconds (as seen by these looks; ``now`` is the caller's clock). A window
        rather than one interval: on a loaded machine a computing proc may get no CPU tick
        in a tenth of a second, but it does within a second."""
        sample = cpu_sample(pid)
        if sample is None:
            self._last.pop(pid, None)
            return False
        state, cpu = sample
        previous = self._last.get(pid)
        advanced_at = previous[1] if previous is not None else None
        if previous is not None and cpu > previous[0]:
            advanced_at = now
        self._last[pid] = (cpu, advanced_at)
        if state in _HALTED or advanced_at is None:
            return False
        return now - advanced_at <= window

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)
