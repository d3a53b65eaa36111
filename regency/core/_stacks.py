"""What a proc is doing, read by the proc itself: its threads' Python frames, named by the
actor, mesh, rank and endpoint each one runs; each running async call's coroutine chain;
each actor's mailbox depth and its last handled calls (the flight recorder). Plain attrs
records, so programs can read them and they travel between procs like any reply value.

``capture(rt)`` reads the runtime it is given (on its loop, where the actor table does not
change under it); :func:`render` turns a job's records into the dump ``str(JobStacks)``
prints, grouping ranks whose stacks are alike. The stall watch (:class:`StallWatch`) runs on
the runtime's watchdog tick, on the environment's clock, so that in the simulator stalls are
found in virtual time and replay from the seed.
"""

from __future__ import annotations

import linecache
import math
import os
import socket
import sys
import sysconfig
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from ._mailbox import ActorCell
    from ._runtime import Runtime

#: How many handled calls each actor remembers (the flight recorder).
RECENT = 64

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY = tuple(
    p + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
    if p
)


@attrs.frozen
class Frame:
    """One Python frame: where it is and the source line it runs."""

    file: str
    line: int
    function: str
    source: str

    def __str__(self) -> str:
        text = f'  File "{self.file}", line {self.line}, in {self.function}'
        return f"{text}\n    {self.source}" if self.source else text

    @property
    def is_user(self) -> bool:
        """Not Regency's own code, nor the standard library's, nor trio's or asyncio's."""
        return not (
            self.file.startswith(_PACKAGE)
            or self.file.startswith(_LIBRARY)
            or f"{os.sep}trio{os.sep}" in self.file
            or f"{os.sep}trio_asyncio{os.sep}" in self.file
            or f"{os.sep}greenlet{os.sep}" in self.file
            or self.file.startswith("<")
        )


@attrs.frozen
class Handled:
    """A call an actor handled (the flight recorder). Times are seconds on the proc's clock
    (``ProcStacks.clock`` is the same clock when the stacks were taken)."""

    endpoint: str
    #: The address of the proc waiting for the reply, or "" (a broadcast).
    sender: str
    queued: float
    started: float
    finished: float
    #: "returned", "raised <Type>: <message>" or "cancelled: <why>".
    outcome: str

    def __str__(self) -> str:
        took = _duration(self.finished - self.started)
        waited = _duration(max(self.started - self.queued, 0.0))
        sender = f" from {self.sender}" if self.sender else " (no reply)"
        return f"{self.endpoint}{sender}: {self.outcome} after {took} (queued {waited})"


def handled(entry: tuple[str, Any, float, float, float, str]) -> Handled:
    """The record of one flight-recorder entry (``ActorCell.recent``: endpoint, reply port,
    queued, started, finished, outcome; queued -inf: not stamped, read as started)."""
    endpoint, port, queued, started, finished, outcome = entry
    return Handled(
        endpoint,
        port[0] if port else "",
        queued if queued > -math.inf else started,
        started,
        finished,
        outcome,
    )


@attrs.frozen
class ActorState:
    """One actor: which, what it runs now and for how long, and what it handled last."""

    cls: str
    mesh: str
    rank: int
    #: Its place in the mesh: (label, index) pairs.
    point: tuple[tuple[str, int], ...]
    #: The endpoint it runs now, or None while idle.
    endpoint: str | None
    running_for: float | None
    #: Messages waiting in its mailbox.
    queued: int
    recent: tuple[Handled, ...]

    @property
    def name(self) -> str:
        return f"{self.cls.rsplit('.', 1)[-1]} {self.mesh!r}"


@attrs.frozen
class ThreadStack:
    """One thread of a proc; ``actor`` when it is an actor's thread. ``frames`` innermost
    last; an idle actor's thread and the thread that answered have none (``note`` says)."""

    name: str
    ident: int
    actor: ActorState | None
    frames: tuple[Frame, ...]
    note: str = ""


@attrs.frozen
class CallStack:
    """A running async endpoint call: its coroutine chain (what it awaits), outermost first."""

    actor: ActorState
    endpoint: str
    running_for: float
    frames: tuple[Frame, ...]
    concurrent: bool = False


@attrs.frozen
class ProcStacks:
    """One proc: where it is, and what its threads and calls do. ``answered`` False: it did
    not answer in time, and ``reason`` says what is known (exited, paused, not answering)."""

    proc_id: str
    address: str
    host: str
    pid: int
    #: Its coordinates in the proc mesh asked about: (label, index) pairs; () when unknown.
    coords: tuple[tuple[str, int], ...]
    answered: bool
    reason: str = ""
    threads: tuple[ThreadStack, ...] = ()
    calls: tuple[CallStack, ...] = ()
    actors: tuple[ActorState, ...] = ()
    #: The proc's clock when it answered (the flight recorder's times are on it).
    clock: float = 0.0

    def located(self, coords: tuple[tuple[str, int], ...]) -> ProcStacks:
        return attrs.evolve(self, coords=coords) if coords else self


@attrs.frozen
class JobStacks:
    """Stacks of a job (``regency.stacks()``): one :class:`ProcStacks` per proc, in the
    order asked; ``str()`` is a readable dump that groups alike ranks."""

    procs: tuple[ProcStacks, ...]
    timeout: float

    @property
    def unanswered(self) -> tuple[ProcStacks, ...]:
        return tuple(p for p in self.procs if not p.answered)

    def actor(self, mesh: str, rank: int) -> tuple[ProcStacks, ActorState] | None:
        """The proc and state of rank ``rank`` of actor mesh ``mesh``, if it answered."""
        for proc in self.procs:
            for actor in proc.actors:
                if actor.mesh == mesh and actor.rank == rank:
                    return proc, actor
        return None

    def frames_of(self, mesh: str, rank: int) -> tuple[Frame, ...]:
        """The frames of what rank ``rank`` of ``mesh`` runs now (its thread's, or its
        running async call's chain); () when idle or unknown."""
        for proc in self.procs:
            for thread in proc.threads:
                actor = thread.actor
                if actor and (actor.mesh, actor.rank) == (mesh, rank) and thread.frames:
                    return thread.frames
            for call in proc.calls:
                if (call.actor.mesh, call.actor.rank) == (mesh, rank):
                    return call.frames
        return ()

    def __str__(self) -> str:
        return render(self)


# -- reading a proc --------------------------------------------------------------------


def frames_of(frame: Any, limit: int = 200) -> tuple[Frame, ...]:
    """The frames of a thread, from its innermost ``frame``: outermost first."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        out.append(_frame(frame.f_code, frame.f_lineno, frame.f_globals))
        frame = frame.f_back
    out.reverse()
    return tuple(out)


def _frame(code: Any, line: int, globals_: dict[str, Any] | None) -> Frame:
    file = code.co_filename
    source = linecache.getline(file, line, globals_).strip() if line else ""
    return Frame(file, line or 0, code.co_name, source)


def coroutine_chain(coro: Any, limit: int = 100) -> tuple[Frame, ...]:
    """What a suspended coroutine awaits, down to the innermost coroutine or generator:
    outermost first."""
    out: list[Frame] = []
    while coro is not None and len(out) < limit:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is not None:
            out.append(_frame(frame.f_code, frame.f_lineno, frame.f_globals))
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
    return tuple(out)


def _user_part(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """An actor thread's frames from the first frame outside Regency on (the mailbox loop
    and its drivers below it say nothing about the user's code)."""
    for i, frame in enumerate(frames):
        if not frame.file.startswith(_PACKAGE) and not frame.file.startswith(_LIBRARY):
            return frames[i:]
    return frames


def _up_to_user(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """Frames down to the innermost frame of the user's code (the library frames below it,
    a lock's or trio's, say little), or all of them when none is the user's."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i].is_user:
            return frames[: i + 2]  # and the call it is in
    return frames


def innermost_user(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame of the user's own code (else the innermost frame)."""
    for frame in reversed(frames):
        if frame.is_user:
            return frame
    return frames[-1] if frames else None


def actor_state(cell: ActorCell, now: float, recent: bool = True) -> ActorState:
    busy = cell.busy
    point = cell.point
    return ActorState(
        cell.instance.class_name,
        cell.name,
        point.rank,
        tuple(point.items()),
        busy[0].method if busy is not None else None,
        now - busy[1] if busy is not None else None,
        cell.queued(),
        tuple(map(handled, list(cell.recent))) if recent else (),
    )


def capture(rt: Runtime) -> ProcStacks:
    """This runtime's proc, as it is now. Call it on the runtime's loop (or under its
    dispatch lock): the actor table does not change meanwhile."""
    now = rt.env.clock()
    running = sys._current_frames()
    me = threading.get_ident()
    cells = list(rt.actors.values())
    actors = {id(cell): actor_state(cell, now) for cell in cells}
    by_thread = {cell.thread_ident: cell for cell in cells if cell.thread_ident is not None}
    simulated = rt.env.simulated_host is not None
    threads: list[ThreadStack] = []
    if simulated:
        # Procs of a simulated cluster share one OS process: only this proc's actor threads.
        named = [(f"actor {c.name}[{c.point.rank}]", ident) for ident, c in by_thread.items()]
    else:
        named = [(t.name, t.ident) for t in threading.enumerate() if t.ident is not None]
    for name, ident in named:
        cell = by_thread.get(ident)
        state = actors[id(cell)] if cell is not None else None
        frame = running.get(ident)
        if ident == me:
            threads.append(ThreadStack(name, ident, state, (), "the event loop (answering)"))
            continue
        if frame is None:
            continue
        frames = frames_of(frame)
        note = ""
        if cell is not None:
            if cell.busy is None:
                frames, note = (), "idle: waiting for its next message"
            elif cell.coro is not None:
                frames, note = (), "waiting for its async endpoint (see its call below)"
            else:
                frames = _user_part(frames)
        threads.append(ThreadStack(name, ident, state, frames, note))
    calls: list[CallStack] = []
    for cell in cells:
        state = actors[id(cell)]
        busy = cell.busy
        if cell.coro is not None and busy is not None:
            chain = coroutine_chain(cell.coro)
            calls.append(CallStack(state, busy[0].method, now - busy[1], chain))
        for item, started, coro in list(cell.concurrent.values()):
            if coro is not None:
                chain = coroutine_chain(coro)
                calls.append(CallStack(state, item.method, now - started, chain, True))
    host = rt.env.simulated_host or socket.gethostname()
    return ProcStacks(
        rt.proc_id,
        rt.address,
        host,
        0 if simulated else os.getpid(),
        (),
        True,
        "",
        tuple(threads),
        tuple(calls),
        tuple(actors.values()),
        now,
    )


# -- the stall watch ---------------------------------------------------------------------


def outcome_of(exc: BaseException) -> str:
    """A handled call's outcome for the flight recorder, when its handler raised."""
    text = str(exc)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"raised {type(exc).__name__}: {text}" if text else f"raised {type(exc).__name__}"


@attrs.frozen
class Stall:
    """A stall report, sent by a proc to the controller (logger ``regency.stall``)."""

    #: "stalled" (still running), "ended" (the stalled call ended).
    kind: str
    actor: str
    mesh: str
    rank: int
    host: str
    pid: int
    proc_id: str
    endpoint: str
    elapsed: float
    frames: tuple[Frame, ...] = ()

    def __str__(self) -> str:
        who = (
            f"{self.actor.rsplit('.', 1)[-1]} {self.mesh!r} rank {self.rank} "
            f"(proc {self.proc_id}, host {self.host}, pid {self.pid})"
        )
        if self.kind == "ended":
            return f"{who}: endpoint {self.endpoint} ended after {_duration(self.elapsed)}"
        text = f"{who}: endpoint {self.endpoint} has run for {_duration(self.elapsed)}"
        if self.frames:
            text += "; innermost frames:\n" + "\n".join(str(f) for f in self.frames)
        return text


#: How many innermost frames a stall warning shows.
STALL_FRAMES = 5


def _current_frames_of(cell: ActorCell) -> tuple[Frame, ...]:
    if cell.coro is not None:
        return coroutine_chain(cell.coro)
    ident = cell.thread_ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    return _user_part(frames_of(frame)) if frame is not None else ()


def _stall(cell: ActorCell, kind: str, endpoint: str, elapsed: float) -> Stall:
    rt = cell.rt
    frames = _up_to_user(_current_frames_of(cell))[-STALL_FRAMES:] if kind == "stalled" else ()
    simulated = rt.env.simulated_host
    return Stall(
        kind,
        cell.instance.class_name,
        cell.name,
        cell.point.rank,
        simulated or socket.gethostname(),
        0 if simulated else os.getpid(),
        rt.proc_id,
        endpoint,
        elapsed,
        frames,
    )


def check_stalls(rt: Runtime, threshold: float, report: Any) -> None:
    """One look (the runtime's watchdog tick): an actor whose call has run for
    ``threshold`` seconds, then 2x, 4x, ... gets a "stalled" report each time."""
    if not threshold:
        return
    now = rt.env.clock()
    for cell in list(rt.actors.values()):
        busy = cell.busy
        if busy is None:
            continue
        elapsed = now - busy[1]
        if elapsed >= threshold * (1 << cell.stall_warned):
            cell.stall_warned += 1
            cell.watch()  # its mailbox loop tells when it ends
            report(_stall(cell, "stalled", busy[0].method, elapsed))
            if rt.trace is not None:
                from ._trace import actor_track

                rt.trace.instant(
                    actor_track(cell), "stall", {"endpoint": busy[0].method, "elapsed_s": elapsed}
                )


def next_stall_due(rt: Runtime) -> float:
    """When the stall watch of ``rt`` next has a warning to give (on its clock; inf: none):
    a scheduler that skips idle time must not skip past it (the simulator's ticker)."""
    threshold = rt.config.stall_warning_s
    if not threshold:
        return math.inf
    due = math.inf
    for cell in list(rt.actors.values()):
        busy = cell.busy
        if busy is not None:
            due = min(due, busy[1] + threshold * (1 << cell.stall_warned))
    return due


def stall_ended(cell: ActorCell, endpoint: str, elapsed: float) -> None:
    """A call that was reported stalled ended: one line (its runtime's reporter)."""
    report = getattr(cell.rt, "report_stall", None)
    if report is not None:
        report(_stall(cell, "ended", endpoint, elapsed))


# -- the dump ----------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.1f} s"


def span(times: Sequence[float]) -> str:
    """1.2 s, or 1.2 s to 3.4 s."""
    low, high = _duration(min(times)), _duration(max(times))
    return low if low == high else f"{low} to {high}"


def ranges(numbers: Iterable[int]) -> str:
    """0,1,2,3,5 -> "0-3, 5"."""
    out: list[str] = []
    values = sorted(set(numbers))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)


def _coords(coords: tuple[tuple[str, int], ...]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in coords) + "}" if coords else ""


def _where(frames: tuple[Frame, ...]) -> tuple[tuple[str, int, str], ...]:
    return tuple((f.file, f.line, f.function) for f in frames)


def render(stacks: JobStacks, recent: int = 5) -> str:
    """The dump: procs and who did not answer; then each actor's stack, alike ranks of a
    mesh grouped ("ranks 0-6, 8-15: same stack"); then other threads, alike ones grouped
    across procs; then the last calls each busy or stalled actor handled."""
    procs = stacks.procs
    answered = sum(1 for p in procs if p.answered)
    lines = [f"stacks of {len(procs)} proc(s), {answered} answered (timeout {stacks.timeout} s)"]
    for proc in procs:
        where = f"host {proc.host}" + (f" pid {proc.pid}" if proc.pid else "")
        coords = _coords(proc.coords)
        state = "" if proc.answered else f": {proc.reason}"
        lines.append(f"  proc {proc.proc_id} {coords} {where}{state}".replace("  ", " ", 1))
    # Actors: group by (mesh, class, endpoint, note, frames).
    groups: dict[Any, list[tuple[ProcStacks, ActorState, float | None, tuple[Frame, ...]]]]
    groups = {}
    other: dict[Any, list[tuple[ProcStacks, ThreadStack]]] = {}
    for proc in procs:
        for thread in proc.threads:
            actor = thread.actor
            if actor is None:
                other.setdefault((thread.name, thread.note, _where(thread.frames)), []).append(
                    (proc, thread)
                )
                continue
            if thread.note.startswith("waiting for its async"):
                continue  # shown with its call
            key = (actor.mesh, actor.cls, actor.endpoint, thread.note, _where(thread.frames))
            groups.setdefault(key, []).append((proc, actor, actor.running_for, thread.frames))
        for call in proc.calls:
            key = (call.actor.mesh, call.actor.cls, call.endpoint, "async", _where(call.frames))
            groups.setdefault(key, []).append((proc, call.actor, call.running_for, call.frames))
        # All-async actors that are idle have no thread and no call: list them too.
        shown = {(t.actor.mesh, t.actor.rank) for t in proc.threads if t.actor is not None}
        shown |= {(c.actor.mesh, c.actor.rank) for c in proc.calls}
        for actor in proc.actors:
            if (actor.mesh, actor.rank) not in shown and actor.endpoint is None:
                key = (actor.mesh, actor.cls, None, "idle: waiting for its next message", ())
                groups.setdefault(key, []).append((proc, actor, None, ()))
    if groups:
        lines.append("")
        lines.append("actors:")
    for (mesh, cls, endpoint, note, _), members in sorted(
        groups.items(), key=lambda kv: (kv[0][0], min(m[1].rank for m in kv[1]))
    ):
        ranks = [m[1].rank for m in members]
        times = [m[2] for m in members if m[2] is not None]
        name = f"{cls.rsplit('.', 1)[-1]} {mesh!r}"
        which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"
        same = ": same stack" if len(ranks) > 1 else ""
        queued = sum(m[1].queued for m in members)
        if endpoint is None:
            what = note or "idle"
        else:
            took = span(times) if times else "?"
            kind = " (async)" if note == "async" else ""
            what = f"in endpoint {endpoint}{kind} for {took}"
        lines.append(f"  {name} {which}{same}: {what}; {queued} message(s) queued")
        for frame in members[0][3]:
            lines.append("  " + str(frame).replace("\n", "\n  "))
    if other:
        lines.append("")
        lines.append("other threads:")
        for (name, note, _), alike in sorted(other.items(), key=lambda kv: kv[0][0]):
            count = len(alike)
            where = f"in {count} procs: same stack" if count > 1 else f"in proc {alike[0][0].proc_id}"
            suffix = f" ({note})" if note else ""
            lines.append(f"  thread {name!r} {where}{suffix}")
            for frame in alike[0][1].frames:
                lines.append("  " + str(frame).replace("\n", "\n  "))
    busy = [
        (proc, actor)
        for proc in procs
        for actor in proc.actors
        if actor.recent and (actor.endpoint is not None or actor.queued)
    ]
    if busy and recent:
        lines.append("")
        lines.append(f"last calls handled (up to {recent} per busy actor, newest last):")
        for proc, actor in busy:
            lines.append(f"  {actor.name} rank {actor.rank}:")
            for handled in actor.recent[-recent:]:
                ago = _duration(max(proc.clock - handled.finished, 0.0))
                lines.append(f"    {handled} ({ago} ago)")
    return "\n".join(lines)
