"""What the dashboard shows, as plain JSON-ready data: the tree of hosts, proc meshes and actor
meshes with their state and failures, each actor's live numbers, stacks, a timeline.

Two halves. :func:`snapshot` reads the controller's runtime (its children, its supervision
machine's meshes and failure causes) and must run on the runtime's loop, where those do not
change under it. Everything else is pure: it turns a :class:`Snapshot` and a
:class:`~regency.core._stacks.JobStacks` into the page's JSON, so it is tested without
processes.
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import sys
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..core._introspect import _host_of
from ..core._stacks import RECENT, ActorState, Handled, JobStacks, ProcStacks, render
from ..core._trace import ProcTrace
from ..supervision import FAILED, RUNNING, STOPPED

if TYPE_CHECKING:
    from ..core._runtime import Runtime

#: The window the handled-message rate and latencies are measured over (seconds).
RATE_WINDOW = 10.0
#: Rows of an actor mesh the page lists (the rest are counted).
MAX_RANKS_SHOWN = 256


@attrs.frozen
class ChildInfo:
    """A proc the controller launched, as its runtime knows it."""

    proc_id: str
    address: str
    coords: tuple[tuple[str, int], ...]
    pid: int
    #: None while it runs; else its exit status (negative: killed by that signal).
    returncode: int | None
    #: "proc ... exited with status 0", "... was killed by signal 9 (SIGKILL)", or "".
    exit: str
    #: Whether the controller stopped it on purpose (a stopped proc, not a failed one).
    stopped: bool


@attrs.frozen
class MeshInfo:
    """An actor mesh the controller's supervision machine knows."""

    key: str
    name: str
    owner_name: str
    actor_class: str
    addresses: tuple[str, ...]
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    #: Each rank's "running", "failed" or "stopped".
    status: tuple[str, ...]
    #: Failed ranks: (rank, one-line summary, remote traceback).
    causes: tuple[tuple[int, str, str], ...]


@attrs.frozen
class Snapshot:
    """The controller, read on its loop."""

    proc_id: str
    address: str
    pid: int
    host: str
    argv: tuple[str, ...]
    clock: float
    children: tuple[ChildInfo, ...]
    meshes: tuple[MeshInfo, ...]
    #: Why the supervision machine stopped accepting events, if it did.
    broken: str | None = None


def snapshot(rt: Runtime) -> Snapshot:
    """Read the controller's runtime. On its loop only."""
    oversight = rt.oversight
    children = []
    for child in rt.children.values():
        handle = child.handle
        pid = handle.pid if handle is not None and not handle.remote else 0
        code = child.returncode
        stopped = code is not None and not child.killed_for and code in (0, -15)
        exit = child.describe_exit() if code is not None else ""
        info = ChildInfo(
            child.proc_id, child.address, tuple(child.coords), pid, code, exit, stopped
        )
        children.append(info)
    meshes = []
    for key, mesh in oversight.meshes().items():
        causes = tuple(
            (rank, cause.summary, cause.traceback)
            for rank in range(len(mesh.status))
            if (cause := oversight.failures.get((key, rank))) is not None
        )
        info_ = MeshInfo(
            key, mesh.name, mesh.owner_name, mesh.actor_class, tuple(mesh.addresses),
            tuple(mesh.labels), tuple(mesh.sizes), tuple(mesh.status), causes,
        )  # fmt: skip
        meshes.append(info_)
    return Snapshot(
        rt.proc_id,
        rt.address,
        os.getpid(),
        socket.gethostname(),
        tuple(sys.argv),
        rt.env.clock(),
        tuple(children),
        tuple(meshes),
        oversight.broken,
    )


# -- per-actor numbers ------------------------------------------------------------------


def call_numbers(recent: Sequence[Handled], clock: float, window: float = RATE_WINDOW) -> dict[str, Any]:
    """Handled-message rate (per second, over the last ``window`` seconds) and latencies
    (handling time, in ms) from an actor's flight recorder (its last calls, oldest first;
    ``clock``: its proc's clock when they were read)."""
    if not recent:
        return {"rate": 0.0, "handled": 0, "errors": 0, "latency_ms": None, "last": None}
    inside = [h for h in recent if h.finished >= clock - window]
    if len(inside) == len(recent) and len(recent) >= RECENT:
        # The recorder holds fewer calls than the window saw: rate over what it holds.
        rate = len(recent) / max(clock - recent[0].started, 1e-6)
    else:
        rate = len(inside) / window
    sample = inside or list(recent[-8:])
    took = [max(h.finished - h.started, 0.0) * 1e3 for h in sample]
    last = recent[-1]
    return {
        "rate": round(rate, 3),
        "handled": len(inside),
        "errors": sum(1 for h in inside if not h.outcome.startswith("returned")),
        "latency_ms": {
            "mean": round(statistics.fmean(took), 3),
            "p50": round(statistics.median(took), 3),
            "max": round(max(took), 3),
            "of": len(took),
        },
        "last": {
            "endpoint": last.endpoint,
            "outcome": last.outcome,
            "ago": round(max(clock - last.finished, 0.0), 3),
        },
    }


def recent_calls(actor: ActorState, clock: float) -> list[dict[str, Any]]:
    """An actor's flight recorder, newest first, for the page."""
    return [
        {
            "endpoint": h.endpoint,
            "sender": h.sender,
            "outcome": h.outcome,
            "took_ms": round(max(h.finished - h.started, 0.0) * 1e3, 3),
            "queued_ms": round(max(h.started - h.queued, 0.0) * 1e3, 3),
            "ago": round(max(clock - h.finished, 0.0), 3),
        }
        for h in reversed(actor.recent)
    ]


# -- the tree ----------------------------------------------------------------------------


def _coords(coords: Iterable[tuple[str, int]]) -> dict[str, int]:
    return {label: index for label, index in coords}


def _first_of_mesh(coords: tuple[tuple[str, int], ...]) -> bool:
    """A proc mesh's procs are launched in rank order: its rank 0 starts a new one."""
    return not coords or all(index == 0 for _, index in coords)


def group_procs(coords: Sequence[tuple[tuple[str, int], ...]]) -> list[list[int]]:
    """Indices of consecutive procs (in launch order) that form one proc mesh each."""
    groups: list[list[int]] = []
    for i, point in enumerate(coords):
        if not groups or _first_of_mesh(point):
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


_TRAILING_DIGITS = re.compile(r"\d+$")


def mesh_name_of(proc_id: str) -> str:
    """The name a proc mesh was spawned with, from one of its procs' ids
    (``c812.trainers3``: ``trainers``; the default name is ``p``)."""
    tail = proc_id.rsplit(".", 1)[-1]
    return _TRAILING_DIGITS.sub("", tail) or tail


def _state_of(states: Iterable[str]) -> str:
    seen = set(states)
    if FAILED in seen:
        return FAILED
    if RUNNING in seen:
        return RUNNING
    return STOPPED if seen else RUNNING


def _short(cls: str) -> str:
    return cls.rsplit(".", 1)[-1] if cls else "?"


def _host_name(address: str, here: str) -> str:
    host = _host_of(address)
    return here if host == "this host" else host


def build_state(snap: Snapshot, stacks: JobStacks | None) -> dict[str, Any]:
    """The page's tree: hosts; proc meshes with their procs and the actor meshes on them;
    each actor's state, failure and live numbers; the failures."""
    by_address: dict[str, ProcStacks] = {}
    if stacks is not None:
        by_address = {p.address: p for p in stacks.procs}
    actors: dict[tuple[str, str, int], ActorState] = {}
    for proc in by_address.values():
        for actor in proc.actors:
            actors[(proc.address, actor.mesh, actor.rank)] = actor

    # Procs: the controller's children in launch order, then procs spawned by actors
    # (known from the stacks only).
    procs: list[dict[str, Any]] = []
    for child in snap.children:
        answer = by_address.get(child.address)
        if child.returncode is None:
            state, reason = RUNNING, ""
            if answer is not None and not answer.answered:
                reason = answer.reason
        else:
            state = STOPPED if child.stopped else FAILED
            reason = child.exit
        procs.append(
            {
                "proc_id": child.proc_id,
                "address": child.address,
                "host": _host_name(child.address, snap.host),
                "pid": child.pid or (answer.pid if answer is not None else 0),
                "coords": _coords(child.coords),
                "state": state,
                "reason": reason,
                "spawned_by": "controller",
                "_coords": child.coords,
            }
        )
    known = {c.address for c in snap.children}
    for proc in by_address.values():
        if proc.address in known:
            continue
        procs.append(
            {
                "proc_id": proc.proc_id,
                "address": proc.address,
                "host": proc.host if proc.answered else _host_name(proc.address, snap.host),
                "pid": proc.pid,
                "coords": _coords(proc.coords),
                "state": RUNNING if proc.answered or "exited" not in proc.reason else FAILED,
                "reason": proc.reason,
                "spawned_by": "an actor",
                "_coords": proc.coords,
            }
        )

    # Proc meshes: consecutive procs from one spawn, among the controller's and among the
    # actors' own.
    proc_meshes: list[dict[str, Any]] = []
    mesh_of_address: dict[str, dict[str, Any]] = {}
    for spawner in ("controller", "an actor"):
        mine = [p for p in procs if p["spawned_by"] == spawner]
        for group in group_procs([p["_coords"] for p in mine]):
            members = [mine[i] for i in group]
            last = members[-1]["coords"]
            dims = {label: index + 1 for label, index in last.items()}
            pmesh: dict[str, Any] = {
                "id": members[0]["proc_id"],
                "name": mesh_name_of(members[0]["proc_id"]),
                "dims": dims,
                "spawned_by": spawner,
                "hosts": sorted({p["host"] for p in members}),
                "state": _state_of(p["state"] for p in members),
                "procs": members,
                "actor_meshes": [],
            }
            proc_meshes.append(pmesh)
            for p in members:
                mesh_of_address[p["address"]] = pmesh
    for p in procs:
        del p["_coords"]
    here: dict[str, Any] = {
        "id": snap.proc_id,
        "name": "controller",
        "dims": {},
        "spawned_by": "",
        "hosts": [snap.host],
        "state": RUNNING,
        "procs": [
            {"proc_id": snap.proc_id, "address": snap.address, "host": snap.host,
             "pid": snap.pid, "coords": {}, "state": RUNNING, "reason": "",
             "spawned_by": ""}
        ],
        "actor_meshes": [],
    }  # fmt: skip
    mesh_of_address[snap.address] = here

    failures: list[dict[str, Any]] = []
    seen_actors: set[tuple[str, str, int]] = set()
    for mesh in snap.meshes:
        causes = {rank: (summary, tb) for rank, summary, tb in mesh.causes}
        ranks = []
        for rank, address in enumerate(mesh.addresses):
            status = mesh.status[rank] if rank < len(mesh.status) else RUNNING
            seen_actors.add((address, mesh.name, rank))
            row = _actor_row(
                rank, address, mesh.labels, mesh.sizes, status,
                actors.get((address, mesh.name, rank)), by_address.get(address), mesh_of_address,
            )  # fmt: skip
            if rank in causes:
                summary, traceback = causes[rank]
                row["failure"] = {"summary": summary, "traceback": traceback}
                failures.append(
                    {
                        "mesh": mesh.name,
                        "key": mesh.key,
                        "cls": _short(mesh.actor_class),
                        "rank": rank,
                        "address": address,
                        "summary": summary,
                        "traceback": traceback,
                    }
                )
            ranks.append(row)
        entry: dict[str, Any] = {
            "key": mesh.key,
            "name": mesh.name,
            "cls": _short(mesh.actor_class),
            "class": mesh.actor_class,
            "owner": mesh.owner_name,
            "dims": dict(zip(mesh.labels, mesh.sizes, strict=False)),
            "state": _state_of(r["state"] for r in ranks),
            "size": len(ranks),
            "ranks": ranks[:MAX_RANKS_SHOWN],
        }
        home = mesh_of_address.get(mesh.addresses[0]) if mesh.addresses else None
        (home or here)["actor_meshes"].append(entry)

    # Actors the stacks show that the controller's supervision machine does not know:
    # meshes spawned by actors (their owner supervises them).
    others: dict[tuple[int, str], dict[str, Any]] = {}
    for (address, name, rank), actor in sorted(actors.items(), key=lambda kv: kv[0][1:]):
        if (address, name, rank) in seen_actors:
            continue
        pmesh = mesh_of_address.get(address, here)
        other = others.get((id(pmesh), name))
        if other is None:
            other = {
                "key": f"{pmesh['id']}/{name}",
                "name": name,
                "cls": _short(actor.cls),
                "class": actor.cls,
                "owner": "an actor",
                "dims": {},
                "state": RUNNING,
                "size": 0,
                "ranks": [],
            }
            others[(id(pmesh), name)] = other
            pmesh["actor_meshes"].append(other)
        other["size"] += 1
        if len(other["ranks"]) < MAX_RANKS_SHOWN:
            row = _actor_row(
                rank, address, (), (), RUNNING, actor, by_address.get(address), mesh_of_address
            )
            other["ranks"].append(row)
    if here["actor_meshes"]:
        proc_meshes.insert(0, here)

    hosts: dict[str, dict[str, Any]] = {}
    for p in procs:
        host = hosts.setdefault(p["host"], {"name": p["host"], "procs": 0, "running": 0})
        host["procs"] += 1
        host["running"] += p["state"] == RUNNING
    unanswered = [
        {"proc_id": p.proc_id, "address": p.address, "reason": p.reason}
        for p in (stacks.procs if stacks is not None else ())
        if not p.answered
    ]
    return {
        "controller": {
            "proc_id": snap.proc_id,
            "pid": snap.pid,
            "host": snap.host,
            "argv": list(snap.argv),
        },
        "hosts": list(hosts.values()),
        "proc_meshes": proc_meshes,
        "failures": failures,
        "stacks": {
            "procs": len(stacks.procs) if stacks is not None else 0,
            "answered": sum(p.answered for p in stacks.procs) if stacks is not None else 0,
            "unanswered": unanswered,
        },
        "supervision_broken": snap.broken,
    }


def _actor_row(
    rank: int,
    address: str,
    labels: tuple[str, ...],
    sizes: tuple[int, ...],
    status: str,
    actor: ActorState | None,
    proc: ProcStacks | None,
    mesh_of_address: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    point: dict[str, int] = {}
    if actor is not None:
        point = dict(actor.point)
    elif labels:
        rest = rank
        for label, size in reversed(list(zip(labels, sizes, strict=True))):
            rest, point[label] = divmod(rest, size) if size else (rest, 0)
        point = dict(reversed(list(point.items())))
    pmesh = mesh_of_address.get(address)
    proc_id = next((p["proc_id"] for p in pmesh["procs"] if p["address"] == address), "?") if (
        pmesh is not None
    ) else (proc.proc_id if proc is not None else "?")
    row: dict[str, Any] = {
        "rank": rank,
        "point": point,
        "address": address,
        "proc_id": proc_id,
        "state": status,
        "failure": None,
        "endpoint": None,
        "running_for": None,
        "queued": None,
        "numbers": None,
        "seen": actor is not None,
    }
    if status == RUNNING and proc is not None and not proc.answered:
        row["note"] = proc.reason
    if actor is not None:
        row["endpoint"] = actor.endpoint
        row["running_for"] = (
            round(actor.running_for, 3) if actor.running_for is not None else None
        )
        row["queued"] = actor.queued
        row["numbers"] = call_numbers(actor.recent, proc.clock if proc is not None else 0.0)
    return row


# -- one actor, stacks ----------------------------------------------------------------------


def actor_detail(
    stacks: JobStacks, address: str, mesh: str, rank: int, tree: dict[str, Any] | None
) -> dict[str, Any]:
    """What the page shows of one actor: its state and failure (from ``tree``, the last
    :func:`build_state`), what it runs, its frames (innermost last) and its last calls."""
    row = None
    if tree is not None:
        for pmesh in tree["proc_meshes"]:
            for amesh in pmesh["actor_meshes"]:
                for r in amesh["ranks"]:
                    if r["address"] == address and amesh["name"] == mesh and r["rank"] == rank:
                        row = {**r, "mesh": amesh["name"], "cls": amesh["cls"]}
    proc = next((p for p in stacks.procs if p.address == address), None)
    out: dict[str, Any] = {
        "address": address,
        "mesh": mesh,
        "rank": rank,
        "row": row,
        "answered": proc is not None and proc.answered,
        "reason": proc.reason if proc is not None else "no stacks from its proc",
        "proc": None,
        "actor": None,
        "frames": [],
        "async": False,
        "recent": [],
    }
    if proc is None:
        return out
    out["proc"] = {"proc_id": proc.proc_id, "host": proc.host, "pid": proc.pid,
                   "coords": _coords(proc.coords)}  # fmt: skip
    actor = next((a for a in proc.actors if a.mesh == mesh and a.rank == rank), None)
    if actor is None:
        return out
    out["actor"] = {
        "cls": actor.cls,
        "name": actor.name,
        "endpoint": actor.endpoint,
        "running_for": actor.running_for,
        "queued": actor.queued,
        "numbers": call_numbers(actor.recent, proc.clock),
    }
    frames: tuple[Any, ...] = ()
    for thread in proc.threads:
        if thread.actor is not None and (thread.actor.mesh, thread.actor.rank) == (mesh, rank):
            frames = thread.frames
    if not frames:
        for call in proc.calls:
            if (call.actor.mesh, call.actor.rank) == (mesh, rank):
                frames = call.frames
                out["async"] = True
    out["frames"] = [
        {"file": f.file, "line": f.line, "function": f.function, "source": f.source,
         "user": f.is_user}
        for f in frames
    ]  # fmt: skip
    out["recent"] = recent_calls(actor, proc.clock)
    return out


def stacks_view(stacks: JobStacks, address: str | None) -> dict[str, Any]:
    """The stacks tab: the job-wide dump, or one proc's (``address``), and the list of procs."""
    procs = [
        {
            "address": p.address,
            "proc_id": p.proc_id,
            "label": f"{p.proc_id}"
            + (" {" + ", ".join(f"{k}={v}" for k, v in p.coords) + "}" if p.coords else "")
            + (f" pid {p.pid}" if p.pid else ""),
            "answered": p.answered,
        }
        for p in stacks.procs
    ]
    if address:
        chosen = tuple(p for p in stacks.procs if p.address == address)
        text = render(JobStacks(chosen, stacks.timeout)) if chosen else f"no proc at {address}"
    else:
        text = str(stacks)
    return {"procs": procs, "address": address or "", "text": text}


# -- the timeline ----------------------------------------------------------------------------


class Timeline:
    """The last ``keep`` seconds of handled calls and events, from the trace rings (events
    on the controller's clock). Not thread-safe: one owner (the dashboard's loop)."""

    def __init__(self, keep: float = 300.0, limit: int = 200_000) -> None:
        self.keep = keep
        #: ("X", lane, name, start, end, outcome) and ("i", lane, name, time).
        self.events: deque[tuple[Any, ...]] = deque(maxlen=limit)
        self.labels: dict[str, tuple[str, str]] = {}
        self.dropped = 0
        self.missing: dict[str, str] = {}

    def add(self, traces: Sequence[ProcTrace], now: float) -> None:
        self.missing = {}
        for trace in traces:
            self.dropped += trace.dropped
            for proc_id, why in trace.missing:
                self.missing[proc_id] = why
            for event in trace.events:
                kind, track = event[0], event[1]
                lane = f"{trace.proc_id}|{track}"
                if kind == "C":  # a handled call (core/_trace.py)
                    name, begin, end, outcome = event[2], event[4], event[5], event[6]
                    self.events.append(("X", lane, name, begin, end, outcome))
                elif kind == "i":
                    name = event[2]
                    if name.startswith("send "):
                        continue  # one per call sent: the spans show the calls
                    self.events.append(("i", lane, name, event[3]))
                else:
                    continue
                self.labels.setdefault(lane, (track, trace.proc_id))
        self.prune(now)

    def prune(self, now: float) -> None:
        horizon = now - self.keep
        events = self.events
        while events and _end(events[0]) < horizon:
            events.popleft()

    def view(
        self, now: float, window: float, running: Sequence[tuple[str, str, str, float]] = (),
        width: int = 1000,
    ) -> dict[str, Any]:
        """Lanes of the last ``window`` seconds, times as seconds before ``now``; spans closer
        than ``window / width`` merged (a busy actor's calls become one bar with a count).
        ``running``: (lane, track, proc id, started) of calls still running (from the
        stacks), drawn open-ended."""
        since = now - window
        merge = window / max(width, 1)
        lanes: dict[str, dict[str, Any]] = {}

        def lane_of(key: str) -> dict[str, Any]:
            entry = lanes.get(key)
            if entry is None:
                track, proc_id = self.labels.get(key, (key.split("|", 1)[-1], key.split("|")[0]))
                entry = {"lane": key, "track": track, "proc_id": proc_id, "spans": [],
                         "instants": []}  # fmt: skip
                lanes[key] = entry
            return entry

        for event in self.events:
            if _end(event) < since:
                continue
            entry = lane_of(event[1])
            if event[0] == "X":
                _, _, name, begin, end, outcome = event
                ok = outcome.startswith("returned")
                spans = entry["spans"]
                span = [round(now - max(begin, since), 4), round(now - end, 4), name, 1, ok]
                if spans and spans[-1][1] - span[0] < merge and span[0] <= spans[-1][0]:
                    last = spans[-1]  # overlaps or nearly touches the previous: merge
                    last[1] = min(last[1], span[1])
                    last[3] += 1
                    last[4] = last[4] and ok
                    if last[2] != name:
                        last[2] = "calls"
                else:
                    spans.append(span)
            else:
                entry["instants"].append([round(now - event[3], 4), event[2]])
        for key, track, proc_id, started in running:
            entry = lane_of(key)
            entry["track"], entry["proc_id"] = track, proc_id
            entry["running"] = [round(now - max(started, since), 4), 0.0]
        ordered = sorted(lanes.values(), key=lambda e: (e["proc_id"], e["track"]))
        for entry in ordered:
            spans = entry["spans"]
            entry["spans"] = [
                {"from": s[0], "to": s[1], "name": s[2], "count": s[3], "ok": s[4]} for s in spans
            ]
            entry["instants"] = [{"at": a, "name": n} for a, n in entry["instants"]]
        return {"window": window, "lanes": ordered, "dropped": self.dropped,
                "missing": self.missing}  # fmt: skip


def _end(event: tuple[Any, ...]) -> float:
    end: float = event[4] if event[0] == "X" else event[3]
    return end


def running_calls(stacks: JobStacks | None, taken_at: float) -> list[tuple[str, str, str, float]]:
    """Calls running when the stacks were taken (at ``taken_at`` on the controller's clock),
    as timeline lanes: (lane, track, proc id, started on the controller's clock)."""
    if stacks is None:
        return []
    out = []
    for proc in stacks.procs:
        for actor in proc.actors:
            if actor.endpoint is not None and actor.running_for is not None:
                track = f"{_short(actor.cls)} {actor.mesh}[{actor.rank}]"
                out.append(
                    (f"{proc.proc_id}|{track}", track, proc.proc_id, taken_at - actor.running_for)
                )
    return out
