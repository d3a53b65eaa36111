"""Timelines of real runs: each proc records what it handles in a bounded ring while tracing
is on; the controller collects the rings (each proc its children's, clocks aligned) and
writes Chrome's trace-event JSON, which Perfetto and chrome://tracing open.

What a ring holds, as tuples, as raw as they come (cheap to make: one per call sent, one
per call handled; spans, arrows and ids are made only when the file is written):

* ``("C", track, endpoint, queued, started, end, outcome, port, rank, cast)``: a handled
  call, a span (its sender is the port's address); with a reply port, the end of an arrow
  (``cast``: the id of the casting tree it came down, whose replies a forwarder gathers:
  its arrow is the sender's, found through the ``K`` event);
* ``("S", track, endpoint, time, port, indices)``: a call sent to the ranks ``indices``: an
  instant, and with a reply port the start of an arrow to each (an arrow's id names the reply
  port and the rank, the same on both sides);
* ``("K", track, "cast", time, cast_id, port)``: the sender started casting tree ``cast_id``
  for the call whose replies go to ``port``;
* ``("i", track, name, time, args)``: an instant (a stall, a failure, a proc's exit).

Tracks are named by what runs on them: ``Class mesh[rank]`` for an actor, ``thread NAME``
for a program's thread. Times are the runtime's clock (monotonic, shared by the processes of
one host; the simulator's virtual clock there), aligned across hosts by the collection's
round trip. Tracing off costs one attribute test where a call is sent and where one is
handled (``rt.trace is None``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import _messages as M
from ._ports import PortBase

if TYPE_CHECKING:
    from ._mailbox import ActorCell
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")

#: Every runtime's trace control.
TRACE_PORT = (1 << 63) | 5
#: Of a collection's timeout, the part a proc gives its children.
_NESTED = 0.75


def flow_id(address: str, port_id: int, index: int) -> int:
    """The id of the arrow from a call's send to its handling (the same in both procs)."""
    digest = hashlib.blake2b(f"{address}|{port_id}|{index}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


class TraceRing:
    """One runtime's events while tracing is on: the newest ``capacity``; older ones are
    dropped and counted."""

    __slots__ = ("capacity", "clock", "dropped", "events", "lock")

    def __init__(self, capacity: int, clock: Any) -> None:
        self.capacity = capacity
        self.events: deque[tuple[Any, ...]] = deque(maxlen=capacity)
        self.dropped = 0
        self.clock = clock
        self.lock = threading.Lock()

    def add(self, event: tuple[Any, ...]) -> None:
        # No lock: deque.append is atomic, and a count of dropped events that two threads
        # race on is off by one at worst. (Collection takes the lock, and copies in C.)
        events = self.events
        if len(events) == self.capacity:
            self.dropped += 1
        events.append(event)

    def handled(
        self, cell: ActorCell, item: M.Call, queued: float, started: float, end: float,
        outcome: str,
    ) -> None:
        self.add(
            (
                "C", cell.track, item.method, queued, started, end, outcome, item.port,
                item.rank, item.cast,
            )
        )

    def sent(
        self, endpoint: str, port: tuple[str, int] | None, indices: Sequence[int], track: str
    ) -> None:
        """A call was sent to the ranks ``indices`` (local to the mesh: what each reply
        names), its replies to ``port``."""
        self.add(("S", track, endpoint, self.clock(), port, indices))

    def cast(self, cast_id: tuple[str, int], port: tuple[str, int] | None) -> None:
        """The call whose replies go to ``port`` went down casting tree ``cast_id``."""
        self.add(("K", "", "cast", self.clock(), cast_id, port))

    def instant(self, track: str, name: str, args: dict[str, Any]) -> None:
        self.add(("i", track, name, self.clock(), args))


def actor_track(cell: ActorCell) -> str:
    return f"{cell.instance.class_name.rsplit('.', 1)[-1]} {cell.name}[{cell.point.rank}]"


#: Tracks of sending actors, by actor id (a name is made once per actor, not per call).
_actor_tracks: dict[str, str] = {}


def sender_track() -> str:
    """The track of the code sending now: its actor, or its thread."""
    from ._context import current

    ctx = current.get(None)
    instance = getattr(ctx, "actor_instance", None) if ctx is not None else None
    if instance is not None and instance.class_name:
        track = _actor_tracks.get(instance.actor_id)
        if track is None:
            if len(_actor_tracks) > 4096:
                _actor_tracks.clear()
            track = _actor_tracks[instance.actor_id] = (
                f"{instance.class_name.rsplit('.', 1)[-1]} {instance.name}[{instance.rank.rank}]"
            )
        return track
    return f"thread {threading.current_thread().name}"


# -- control and collection ----------------------------------------------------------------


@attrs.frozen
class TraceStart:
    """Start recording (``capacity`` events at most), and tell your children."""

    capacity: int


@attrs.frozen
class TraceCollect:
    """Answer ``reply`` with your trace and your children's (within ``timeout`` seconds);
    with ``stop``, stop recording."""

    reply: tuple[str, int]
    timeout: float
    stop: bool


@attrs.frozen
class ProcTrace:
    """One proc's events, on the clock of the proc that collected them."""

    proc_id: str
    host: str
    pid: int
    events: tuple[tuple[Any, ...], ...]
    dropped: int
    #: Procs that did not answer (proc id: why), as seen by this one.
    missing: tuple[tuple[str, str], ...] = ()


def start(rt: Runtime, capacity: int) -> None:
    """Start recording in ``rt`` (on its loop) and in its children."""
    if rt.trace is None:
        rt.trace = TraceRing(capacity, rt.env.clock)
        for cell in list(rt.actors.values()):  # (after the ring: see ActorCell._handled)
            cell.watch()
    for child in list(rt.children.values()):
        if child.returncode is None:
            try:
                rt.send_port((child.address, TRACE_PORT), 0, M.OK, TraceStart(capacity))
            except Exception as exc:
                log.info("could not start tracing in %s: %s", child.proc_id, exc)


class TraceService(PortBase):
    """The handler of :data:`TRACE_PORT` (on the loop)."""

    dests: frozenset[str] = frozenset()

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if isinstance(value, TraceStart):
            start(self.rt, value.capacity)
        elif isinstance(value, TraceCollect):
            self.rt.start_soon(self._answer, index, value)
        else:
            raise TypeError(
                f"the trace port takes TraceStart or TraceCollect (got {type(value).__name__})"
            )
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass

    async def _answer(self, index: int, request: TraceCollect) -> None:
        received = self.rt.env.clock()
        traces = await collect(self.rt, request.timeout * _NESTED, stop=request.stop)
        answer = (received, self.rt.env.clock(), _same_clock_key(self.rt), traces)
        try:
            self.rt.send_port(request.reply, index, M.OK, answer)
        except Exception as exc:
            log.info("could not answer a trace collection: %s", exc)


def own_trace(rt: Runtime, stop: bool) -> ProcTrace:
    ring = rt.trace
    if stop:
        rt.trace = None
    simulated = rt.env.simulated_host
    if ring is None:
        events: tuple[tuple[Any, ...], ...] = ()
        dropped = 0
    else:
        with ring.lock:
            events, dropped = tuple(ring.events), ring.dropped
            if not stop:
                ring.events.clear()
                ring.dropped = 0
    return ProcTrace(
        rt.proc_id,
        simulated or socket.gethostname(),
        0 if simulated else os.getpid(),
        events,
        dropped,
    )


class _Gather(PortBase):
    keep_port_on_loss = True

    def __init__(self, addresses: Sequence[str], clock: Any) -> None:
        self.dests = frozenset(addresses)
        self.answers: dict[int, tuple[float, float, float, str, list[ProcTrace]]] = {}
        self.lost: dict[str, str] = {}
        self.missing = len(addresses)
        self.done = trio.Event()
        self.clock = clock

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if index not in self.answers and status == M.OK and isinstance(value, tuple):
            self.answers[index] = (self.clock(), *value)
            self._count()
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        if address is not None and address not in self.lost:
            self.lost[address] = str(exc)
            self._count()

    def _count(self) -> None:
        self.missing -= 1
        if self.missing <= 0:
            self.done.set()


def _same_clock_key(rt: Runtime) -> str:
    """Runtimes that answer the same key read the same clock: the simulator's, or one
    host's CLOCK_MONOTONIC (the boot id names the host's boot)."""
    if rt.env.simulated_host is not None:
        return "simulated"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"boot {f.read().strip()}"
    except OSError:
        return f"host {socket.gethostname()} {os.getpid()}"  # unknown: align by round trip


async def _settle(rt: Runtime, since: float, limit: float) -> None:
    """Give this runtime's actors up to ``limit`` seconds to handle what reached them
    before the collection (a call whose reply came back may not be recorded yet)."""
    clock = rt.env.clock
    deadline = clock() + limit
    while clock() < deadline:
        if all(
            (c.busy is None or c.busy[1] >= since) and not c.queued() for c in rt.actors.values()
        ):
            return
        await trio.sleep(0.001)


async def collect(rt: Runtime, timeout: float, *, stop: bool) -> list[ProcTrace]:
    """This runtime's trace and its children's (theirs moved onto this runtime's clock:
    the offset is estimated from the round trip of the request, NTP-style, unless both
    read the same clock)."""
    await _settle(rt, rt.env.clock(), min(0.1, timeout / 4))
    out = [own_trace(rt, stop)]
    children = [c for c in rt.children.values() if c.returncode is None]
    if not children:
        return out
    clock = rt.env.clock
    gather = _Gather([c.address for c in children], clock)
    port = rt.open_port(gather)
    sent_at = clock()
    try:
        for index, child in enumerate(children):
            try:
                rt.send_port(
                    (child.address, TRACE_PORT),
                    index,
                    M.OK,
                    TraceCollect(port, timeout * _NESTED, stop),
                )
            except Exception as exc:
                gather.fail(exc, child.address)
        with trio.move_on_after(timeout):
            await gather.done.wait()
    finally:
        rt.close_port(port[1])
    missing: list[tuple[str, str]] = []
    for index, child in enumerate(children):
        answer = gather.answers.get(index)
        if answer is None:
            why = gather.lost.get(child.address, f"did not answer within {timeout:.3g} s")
            missing.append((child.proc_id, why))
            continue
        received_at, they_received, they_sent, clock_key, traces = answer
        if clock_key == _same_clock_key(rt):
            out += traces
            continue
        # NTP's estimate of (ours - theirs), from the request's round trip.
        offset = ((sent_at - they_received) + (received_at - they_sent)) / 2
        out += [_shifted(trace, offset) for trace in traces]
    if missing:
        out[0] = attrs.evolve(out[0], missing=tuple(missing))
    return out


def _shifted(trace: ProcTrace, offset: float) -> ProcTrace:
    events = []
    for event in trace.events:
        if event[0] == "C":  # three times: queued, started, end
            times = tuple(t + offset for t in event[3:6])
            events.append((*event[:3], *times, *event[6:]))
        else:  # one time
            events.append((*event[:3], event[3] + offset, *event[4:]))
    return attrs.evolve(trace, events=tuple(events))


# -- Chrome's trace-event format -----------------------------------------------------------


def chrome_trace(traces: Sequence[ProcTrace]) -> dict[str, Any]:
    """The traces as Chrome trace-event JSON (a dict): a process per proc, a thread per
    track, spans, flow arrows from send to handling, instants."""
    out: list[dict[str, Any]] = []
    starts = [e[3] for t in traces for e in t.events]
    origin = min(starts) if starts else 0.0
    dropped = {t.proc_id: t.dropped for t in traces if t.dropped}
    missing = {p: why for t in traces for p, why in t.missing}

    def us(seconds: float) -> float:
        return round((seconds - origin) * 1e6, 3)

    flows_started: set[int] = set()
    #: Casting trees by id: the reply port of the call that went down each.
    cast_ports: dict[tuple[str, int], tuple[str, int]] = {}
    for t in traces:
        for event in t.events:
            if event[0] == "S" and event[4] is not None:
                address, port_id = event[4]
                flows_started.update(flow_id(address, port_id, i) for i in event[5])
            elif event[0] == "K" and event[5] is not None:
                cast_ports[tuple(event[4])] = event[5]
    for pid, trace in enumerate(traces, start=1):
        label = f"{trace.proc_id} ({trace.host}" + (f", pid {trace.pid})" if trace.pid else ")")
        out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        tids: dict[str, int] = {}

        def tid(track: str, pid: int = pid, tids: dict[str, int] = tids) -> int:
            if track not in tids:
                tids[track] = len(tids) + 1
                out.append(
                    {"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[track],
                     "args": {"name": track}}
                )
            return tids[track]

        if trace.dropped:
            out.append(
                {"ph": "i", "s": "p", "name": f"{trace.dropped} event(s) dropped (ring full)",
                 "pid": pid, "tid": 0, "ts": 0}
            )
        for event in trace.events:
            kind, track = event[0], event[1]
            if kind == "K":
                continue  # (read above: it names a tree's arrows)
            if kind == "C":
                _, _, name, queued, begin, end, outcome, port, rank, cast = event
                sender = cast_ports.get(tuple(cast)) if cast is not None else None
                if sender is not None:  # down a tree whose replies a forwarder gathers
                    port = sender
                if port:
                    flow = flow_id(port[0], port[1], rank)
                    if flow in flows_started:  # (its send may not have been traced)
                        out.append(
                            {"ph": "f", "bp": "e", "name": "call", "cat": "flow", "id": flow,
                             "pid": pid, "tid": tid(track), "ts": us(begin)}
                        )
                args = {
                    "sender": port[0] if port else "",
                    "outcome": outcome,
                    "queued_us": round((begin - queued) * 1e6),
                }
                out.append(
                    {"ph": "X", "name": name, "cat": "call", "pid": pid, "tid": tid(track),
                     "ts": us(begin), "dur": round(max(end - begin, 0.0) * 1e6, 3), "args": args}
                )
            elif kind == "S":
                _, _, name, at, port, indices = event
                out.append(
                    {"ph": "i", "s": "t", "name": f"send {name}", "cat": "event", "pid": pid,
                     "tid": tid(track), "ts": us(at), "args": {"ranks": len(indices)}}
                )
                if port is not None:
                    for index in indices:
                        out.append(
                            {"ph": "s", "name": "call", "cat": "flow",
                             "id": flow_id(port[0], port[1], index), "pid": pid,
                             "tid": tid(track), "ts": us(at)}
                        )
            else:
                _, _, name, at, args = event
                out.append(
                    {"ph": "i", "s": "t", "name": name, "cat": "event", "pid": pid,
                     "tid": tid(track), "ts": us(at), "args": args}
                )
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"dropped": dropped, "missing": missing},
    }


def write(traces: Sequence[ProcTrace], path: str) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(traces), f)


# -- the controller's API ------------------------------------------------------------------


def collect_and_write(rt: Runtime, path: str, *, stop: bool, timeout: float = 10.0) -> None:
    """From a thread of the controller: collect every proc's trace and write ``path``."""
    from ._future import Future

    fut: Future[list[ProcTrace]] = Future()

    async def run() -> None:
        try:
            fut.set_result(await collect(rt, timeout, stop=stop))
        except BaseException as exc:
            fut.set_exception(exc)

    rt.start_soon(run)
    write(fut.get(timeout + 10), path)


@contextmanager
def trace(path: str, *, capacity: int | None = None, timeout: float = 10.0) -> Iterator[None]:
    """Record a timeline of what runs inside the block, in every proc of the job (procs
    spawned meanwhile too), and write it to ``path`` as Chrome trace-event JSON when the
    block ends (docs/observability.md)."""
    from ._config import current_config, overridden
    from ._controller import current_runtime

    if not isinstance(path, str) or not path:
        raise TypeError(f"trace() needs a file path (got {path!r})")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"trace(): the directory of {path!r} does not exist")
    size = current_config().trace_buffer if capacity is None else capacity
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"trace(): capacity must be a positive int of events (got {size!r})")
    rt = current_runtime()
    if rt.on_runtime_thread():
        raise RuntimeError("trace() would block the runtime's event loop")
    with overridden(trace_path=path, trace_buffer=size):
        rt.refresh_config()
        ready = threading.Event()

        def begin() -> None:
            start(rt, size)
            ready.set()

        rt.call_soon(begin)
        ready.wait(timeout)
        try:
            yield
        finally:
            collect_and_write(rt, path, stop=True, timeout=timeout)
    rt.refresh_config()


def install(rt: Runtime) -> None:
    """Give a runtime its trace control; record from the start when configured to."""
    rt.ports[TRACE_PORT] = TraceService(rt)
    if rt.config.trace_path:
        rt.trace = TraceRing(rt.config.trace_buffer, rt.env.clock)
