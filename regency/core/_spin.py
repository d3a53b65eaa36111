"""How long a thread that reads its own messages polls before it sleeps (sans-IO policy).

A thread that blocks in ``poll`` until its reply arrives pays the kernel's wake-up when the
reply lands: 15-30 us on this kind of machine, twice per round trip (the callee's idle actor
thread, then the caller's ``get()``). A thread that polls without blocking for a short while
first catches a reply already on its way without that wake-up, the way kernel busy polling
(``net.core.busy_poll``) and NCCL's progress threads do. It costs CPU: the thread keeps a core
busy while it spins, so the policy spins only where spinning pays:

* only with more than one usable CPU (on one CPU, a spinner delays the very process it waits
  for), and never longer than ``spin_us`` (``regency.configure(spin_us=0)`` turns it off);
* a caller's wait (``Future.get``) only while the machine has a CPU to spare: it starts
  spinning only if no more tasks are runnable right now than there are CPUs (the kernel's
  instant count in ``/proc/loadavg``, read in about 2 us), so such spinners never crowd out
  work that is waiting for a CPU, and at most about one starts per idle CPU (the spinners
  count as runnable). Callees are the exception (below). A wait that
  finds every CPU taken counts as a spin that caught nothing (below): on a crowded machine
  (a 4-proc mesh call on 2 CPUs keeps 5 processes busy) a thread reads the count on one wait
  in ``PROBE_EVERY``, not on every one;
* only while spinning keeps catching: after ``MISSES_TO_STOP`` waits in a row that spun and
  caught nothing (a slow endpoint, an idle actor), the thread goes straight to sleep, probing
  again once every ``PROBE_EVERY`` waits, so an idle proc spins for a few us in thousands
  rather than after every message;
* the spinning loop (in ``core/_leader.py``) yields the CPU between polls
  (``sched_yield``), so a runnable thread elsewhere on the core is not kept off it.

Callees: an actor thread waiting for its next call (``LeadingMailbox``) spins also when every
CPU is taken (and an all-async actor keeps its proc's loop polling the same way:
``ActorCell._spin_for_next``), with a back-off of its own (``_Reading.callee_spinner``: the endpoint's own
calls, which sleep at once on a crowded machine, would otherwise count as its misses); the
other rules hold. On a VM whose idle vCPUs halt (KVM with
``guest_halt_poll_ns=0``, as here), waking a thread on an idle vCPU costs 35-40 us before it
runs (``perf sched``: the woken thread's scheduling delay with the CPU idle), paid by each
proc of a mesh call. A callee that spins after its reply keeps its vCPU from halting and
catches the next call without a wake-up: a 4-proc mesh call on 2 vCPUs took 193-216 us
instead of 230-246 us (CPU per call +5-15 %); 8 procs on 2 vCPUs, and 4 beside two CPU
burners, gained too. A caller that spins on a crowded machine gained nothing there: it takes
CPU from the very callees it waits for (docs/performance.md, "Idle vCPUs, spinning callees
and the burst window").

This module only decides; ``Leader._lead`` polls (and ``ActorCell._spin_for_next``, for an
all-async actor, checkpoints its proc's loop, yielding the CPU between passes). It keeps no
clock: the caller says whether a spin caught something.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

#: Waits in a row whose spin caught nothing, after which a thread stops spinning.
MISSES_TO_STOP = 3
#: A thread that stopped spinning spins again on one wait in this many (to notice that the
#: traffic came back).
PROBE_EVERY = 16


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def spin_limit(spin_us: float) -> float:
    """Seconds a wait may spin with ``spin_us`` configured: none with one usable CPU."""
    return spin_us * 1e-6 if usable_cpus() > 1 else 0.0


#: Seconds a reading of the gauge answers for (a round trip's waits, one per side every
#: 50-150 us, share one ``pread`` of ``/proc/loadavg`` and its parsing, about 2 us each).
REREAD = 0.001


class CpuGauge:
    """Whether every CPU is taken right now: more tasks runnable, machine-wide, than this
    process may use CPUs (``/proc/loadavg``'s fourth field, ``runnable/total``, counts the
    reader itself). Without the file (not Linux), never crowded. One reading answers for
    ``reread`` seconds (``clock``'s), for every thread of the process."""

    __slots__ = ("_clock", "_cpus", "_crowded", "_fd", "_reread", "_until")

    def __init__(
        self,
        path: str = "/proc/loadavg",
        cpus: int | None = None,
        *,
        reread: float = REREAD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpus = usable_cpus() if cpus is None else cpus
        self._reread, self._clock = reread, clock
        self._until = -math.inf
        self._crowded = False
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def runnable(self) -> int | None:
        """Tasks runnable now (None: unknown)."""
        if self._fd is None:
            return None
        try:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[3].partition(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None

    def crowded(self) -> bool:
        now = self._clock()
        if now < self._until:
            return self._crowded
        runnable = self.runnable()
        crowded = self._crowded = runnable is not None and runnable > self._cpus
        self._until = now + self._reread
        return crowded

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_gauge: CpuGauge | None = None


def cpu_gauge() -> CpuGauge:
    """The process's gauge (one descriptor, shared by every thread: ``pread`` keeps no
    offset; a forked child shares it too)."""
    global _gauge
    if _gauge is None:
        _gauge = CpuGauge()
    return _gauge


class SpinPolicy:
    """One thread's spin decisions (``Leader`` keeps one per thread)."""

    __slots__ = ("_misses", "_skipped")

    def __init__(self) -> None:
        self._misses = 0
        self._skipped = 0

    def budget(self, limit: float) -> float:
        """Seconds to spin on the wait about to start, at most ``limit`` (0.0: sleep at
        once)."""
        if not limit:
            return 0.0
        if self._misses < MISSES_TO_STOP:
            return limit
        self._skipped += 1
        if self._skipped >= PROBE_EVERY:
            self._skipped = 0
            return limit
        return 0.0

    def caught(self) -> None:
        """The spin ended because something arrived."""
        self._misses = 0
        self._skipped = 0

    def missed(self) -> None:
        """The spin ran out with nothing to read, or the wait could not spin (every CPU
        was taken); the thread sleeps."""
        self._misses += 1
