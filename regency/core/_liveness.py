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
    """Remembers each pid's CPU time between looks."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}

    def busy(self, pid: int) -> bool:
        """True when ``pid`` used CPU since the previous look and is not stopped. The first
        look only takes a sample."""
        sample = cpu_sample(pid)
        if sample is None:
            self._last.pop(pid, None)
            return False
        state, cpu = sample
        previous = self._last.get(pid)
        self._last[pid] = cpu
        return state not in _HALTED and previous is not None and cpu > previous

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)
