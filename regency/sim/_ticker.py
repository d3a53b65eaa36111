"""The periodic work of a simulated cluster, from one scheduler that skips idle time.

Every simulated runtime's heartbeats and watchdog (:mod:`regency.core._ticker`) and the
invariant checker's scan register here. A tick runs the same callback production runs, on the
same grid (each job's next tick is its last plus its interval). What changes is idle time:

When a tick falls due and the cluster is *quiet* (the network has nothing in flight and no
fault in force, no outbox waits for an acknowledgement, no task is runnable, and every proc a
runtime watches has a running heartbeat job), the only things that can happen before the next
other deadline ``T`` (a user's timer, a scheduled fault, a timeout) are heartbeats arriving and
watchdogs finding every proc alive. Their outcome is known, so the scheduler applies it
analytically: each watched proc's ``last_seen`` becomes the arrival of its last heartbeat
before ``T`` (its tick plus the link's base latency), each watchdog and scan runs once as of
its last skipped tick, and every job's next tick moves to the first grid point past the skipped
stretch. Ticks near ``T`` (within the time a heartbeat and its acknowledgement take) run for
real. A proc that stops answering can only stop at or after ``T`` (faults come from timers and
from the program), so it is found at the same tick as without skipping; ``tests/sim/
test_ticker.py`` checks that against a run with skipping switched off.
"""

from __future__ import annotations

import contextvars
import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio
from trio._core._run import GLOBAL_RUN_CONTEXT

from ..core._stacks import next_stall_due
from ..core._ticker import Tick

#: The most virtual time one idle skip covers when nothing else is scheduled (virtual s).
_LONGEST_SKIP = 3600.0

if TYPE_CHECKING:
    from ..core._runtime import Runtime
    from ._cluster import SimCluster


@attrs.define(eq=False)
class _Job:
    seq: int
    owner: Any
    kind: str
    target: str | None
    interval: Callable[[], float]
    tick: Tick
    context: contextvars.Context
    next_due: float
    done: trio.Event = attrs.Factory(trio.Event)
    error: BaseException | None = None


class SimTicker:
    """One cluster's periodic jobs (see the module docstring). ``skip`` switches the
    skipping of idle time off (every tick then runs, as in production)."""

    def __init__(self, cluster: SimCluster, *, skip: bool = True) -> None:
        self.cluster = cluster
        self.skip = skip
        self._jobs: dict[int, _Job] = {}
        #: (next_due, seq) of every job; entries whose job moved on or ended are stale.
        self._heap: list[tuple[float, int]] = []
        self._seq = 0
        self._changed = trio.Event()
        self._waiting_until = math.inf
        #: Ticks applied analytically instead of run, and how many skips there were.
        self.skipped_ticks = 0
        self.skips = 0

    async def every(
        self,
        interval: Callable[[], float],
        tick: Tick,
        *,
        owner: Any,
        kind: str,
        target: str | None = None,
    ) -> None:
        self._seq += 1
        job = _Job(
            self._seq,
            owner,
            kind,
            target,
            interval,
            tick,
            contextvars.copy_context(),
            trio.current_time() + interval(),
        )
        self._jobs[job.seq] = job
        heapq.heappush(self._heap, (job.next_due, job.seq))
        if job.next_due < self._waiting_until:
            self._changed.set()
        try:
            await job.done.wait()
        finally:
            self._jobs.pop(job.seq, None)  # its heap entry goes stale
        if job.error is not None:
            raise job.error

    def _next_due(self) -> float:
        heap, jobs = self._heap, self._jobs
        while heap:
            due, seq = heap[0]
            job = jobs.get(seq)
            if job is not None and job.next_due == due:
                return due
            heapq.heappop(heap)  # stale
        return math.inf

    async def run(self) -> None:
        """The scheduler: run due ticks, or skip an idle stretch."""
        jobs, heap = self._jobs, self._heap
        while True:
            self._changed = trio.Event()
            due = self._waiting_until = self._next_due()
            with trio.move_on_at(due):
                await self._changed.wait()
                continue  # a job that is due earlier came: look again
            self._waiting_until = math.inf
            now = trio.current_time()
            if self.skip and self._skip_idle(now):
                continue
            while heap and heap[0][0] <= now:
                due, seq = heapq.heappop(heap)
                job = jobs.get(seq)
                if job is None or job.next_due != due:
                    continue  # stale
                job.next_due = now + job.interval()
                heapq.heappush(heap, (job.next_due, seq))
                try:
                    keep = job.context.run(job.tick, now)
                except BaseException as exc:
                    job.error, keep = exc, False
                if keep is False:
                    del jobs[seq]
                    job.done.set()

    # -- skipping idle time -------------------------------------------------------------

    def _skip_idle(self, now: float) -> bool:
        runner = GLOBAL_RUN_CONTEXT.runner
        if runner.runq or runner.entry_queue.size():
            return False  # something else happens now
        cluster = self.cluster
        network = cluster.network
        # Leave the ticks near the next other deadline to run for real: a heartbeat sent
        # then, and its acknowledgement, would still be in flight at that deadline.
        # With no other deadline at all (a notebook's main thread waiting for news that only
        # a fault could bring), skip a bounded stretch at a time, never to infinity.
        ahead = min(runner.deadlines.next_deadline(), now + _LONGEST_SKIP)
        runtimes = self._runtimes()
        # A stall warning falls due: the watchdog tick that gives it runs for real.
        ahead = min([ahead, *(next_stall_due(rt) for rt in runtimes)])
        top = self._jobs.get(self._heap[0][1]) if self._heap else None
        if top is None or ahead - now < 2 * top.interval():
            return False  # cheap first: too little idle time ahead to be worth a look
        horizon = 2 * network.max_latency() + self._max_ack_delay + 0.001
        until = ahead - horizon
        if not network.quiet(now):
            return False
        if not self._settled(runtimes):
            return False
        jobs = sorted(self._jobs.values(), key=lambda j: (j.next_due, j.seq))
        if not jobs or jobs[0].next_due > until:
            return False
        plans: list[tuple[_Job, float, int]] = []
        for job in jobs:
            interval = job.interval()
            if job.next_due > until or not interval > 0:
                continue
            count = math.floor((until - job.next_due) / interval) + 1
            plans.append((job, job.next_due + (count - 1) * interval, count))
        if sum(count for _, _, count in plans) < 2 * len(self._jobs):
            return False  # not worth it: less than about two rounds to skip
        skipped = 0
        # Heartbeats first: a watchdog's round sees the last_seen they leave.
        for job, last, _count in plans:
            if job.kind == "heartbeat":
                self._arrive(job, last)
        for job, last, count in plans:
            if job.kind != "heartbeat":
                try:
                    job.context.run(job.tick, last)
                except BaseException as exc:
                    job.error = exc
                    self._jobs.pop(job.seq, None)
                    job.done.set()
            job.next_due = last + job.interval()
            heapq.heappush(self._heap, (job.next_due, job.seq))
            skipped += count
        self.skipped_ticks += skipped
        self.skips += 1
        network._record("skip", f"{skipped} idle ticks, to {until:.9f}")
        return True

    @property
    def _max_ack_delay(self) -> float:
        return max((rt.ack_delay for rt in self._runtimes()), default=0.0)

    def _runtimes(self) -> list[Runtime]:
        cluster = self.cluster
        runtimes = [proc.rt for proc in cluster.procs.values() if not proc.crashed]
        if cluster.controller is not None:
            runtimes.append(cluster.controller)
        return runtimes

    def _settled(self, runtimes: list[Runtime]) -> bool:
        """Nothing waits to be handled or acknowledged, and every watched proc has a
        heartbeat job."""
        if self.cluster.checker.frames_in_flight():
            return False  # sent, never handled: the checker's scans must see it age
        beating = {
            (job.owner.address, job.target) for job in self._jobs.values() if job.kind == "heartbeat"
        }
        for rt in runtimes:
            if rt.inbound.ack_scheduled:
                return False
            for box in list(rt.outboxes.values()):
                if not box.idle:
                    return False
            for address, child in rt.children.items():
                if child.returncode is not None or child.last_seen is None:
                    continue
                if (address, rt.address) not in beating:
                    return False  # a silent proc: its watchdog must run tick by tick
        return True

    def _arrive(self, job: _Job, last: float) -> None:
        """The heartbeat sent at ``last`` arrives at its target, a base latency later."""
        sender: Runtime = job.owner
        target = job.target
        parent = self._runtime_at(target) if target is not None else None
        if parent is None:
            return
        child = parent.children.get(sender.address)
        if child is None or child.last_seen is None:
            return
        network = self.cluster.network
        arrival = last + network.base_latency(_host(sender.address), _host(parent.address))
        child.last_seen = max(child.last_seen, arrival)

    def _runtime_at(self, address: str) -> Runtime | None:
        cluster = self.cluster
        if cluster.controller is not None and cluster.controller.address == address:
            return cluster.controller
        proc = cluster.procs.get(address)
        return proc.rt if proc is not None else None


def _host(address: str) -> str:
    return address[len("sim://"):].split("/", 1)[0]
