"""The dashboard's data, without processes: the tree from a runtime's snapshot and stacks,
rates and latencies from the flight recorder, the timeline's lanes."""

from __future__ import annotations

from typing import Any

from regency._dashboard import _model
from regency._dashboard._model import ChildInfo, MeshInfo, Snapshot, Timeline
from regency.core._stacks import (
    ActorState,
    Frame,
    Handled,
    JobStacks,
    ProcStacks,
    ThreadStack,
)
from regency.core._trace import ProcTrace


def test_procs_are_grouped_into_the_meshes_they_were_spawned_in() -> None:
    coords = [
        (("gpus", 0),), (("gpus", 1),),  # one mesh of 2
        (("hosts", 0), ("gpus", 0)), (("hosts", 0), ("gpus", 1)), (("hosts", 1), ("gpus", 0)),
        (),  # a mesh of one proc (no dims)
        (),
    ]  # fmt: skip
    assert _model.group_procs(coords) == [[0, 1], [2, 3, 4], [5], [6]]
    assert _model.mesh_name_of("c812.p3") == "p"
    assert _model.mesh_name_of("c812.trainers12") == "trainers"
    assert _model.mesh_name_of("c812.p0.q4") == "q"


def _handled(endpoint: str, started: float, took: float, outcome: str = "returned") -> Handled:
    return Handled(endpoint, "unix:///x.sock", started - 0.001, started, started + took, outcome)


def test_rates_and_latencies_come_from_the_flight_recorder() -> None:
    recent = [_handled("step", 100.0 + i, 0.010) for i in range(5)]
    recent.append(_handled("step", 106.0, 0.030, "raised ValueError: x"))
    numbers = _model.call_numbers(recent, clock=106.5, window=10.0)
    assert numbers["handled"] == 6 and numbers["errors"] == 1
    assert numbers["rate"] == 0.6
    assert numbers["latency_ms"]["max"] == 30.0
    assert numbers["latency_ms"]["p50"] == 10.0
    assert numbers["last"] == {"endpoint": "step", "outcome": "raised ValueError: x", "ago": 0.47}
    # A full recorder inside the window: the rate is over the time it covers.
    full = [_handled("ping", 200.0 + i * 0.01, 0.001) for i in range(64)]
    busy = _model.call_numbers(full, clock=200.64)
    assert 99 <= busy["rate"] <= 101
    # Nothing within the window: no rate, latencies of the last calls.
    old = _model.call_numbers(recent, clock=1000.0)
    assert old["rate"] == 0.0 and old["latency_ms"]["of"] == 6
    assert _model.call_numbers([], clock=1.0)["latency_ms"] is None


def _actor(mesh: str, rank: int, endpoint: str | None = None) -> ActorState:
    return ActorState(
        "app.Worker", mesh, rank, (("gpus", rank),), endpoint, 3.0 if endpoint else None,
        1 if endpoint else 0, (_handled("ping", 9.0, 0.002),),
    )  # fmt: skip


def test_the_tree_places_actors_on_their_procs_with_state_and_failure() -> None:
    addresses = [f"unix:///j/c1.p{i}.sock" for i in range(2)]
    snap = Snapshot(
        "c1", "unix:///j/c1.sock", 4242, "node3", ("train.py",), 10.0,
        (
            ChildInfo("c1.p0", addresses[0], (("gpus", 0),), 11, None, "", False),
            ChildInfo("c1.p1", addresses[1], (("gpus", 1),), 12, None, "", False),
            ChildInfo("c1.p2", "unix:///j/c1.p2.sock", (), 13, 0, "proc c1.p2 exited with status 0", True),
        ),
        (
            MeshInfo(
                "c1.workers.0", "workers", "client", "app.Worker", tuple(addresses), ("gpus",),
                (2,), ("running", "failed"), ((1, "endpoint step raised ValueError: 42", "Traceback..."),),
            ),
        ),
    )  # fmt: skip
    stuck = _actor("workers", 0, "step")
    frames = (Frame("/app/train.py", 88, "step", "self.ready.wait()"),)
    stacks = JobStacks(
        (
            ProcStacks("c1.p0", addresses[0], "node3", 11, (("gpus", 0),), True,
                       threads=(ThreadStack("actor", 1, stuck, frames),), actors=(stuck,),
                       clock=10.0),
            ProcStacks("c1.p1", addresses[1], "node3", 12, (("gpus", 1),), True, clock=10.0),
            # an actor's own proc, with a mesh the controller does not supervise
            ProcStacks("c1.p0.q0", "unix:///j/c1.p0.q0.sock", "node3", 14, (), True,
                       actors=(_actor("helpers", 0),), clock=10.0),
        ),
        2.0,
    )  # fmt: skip
    tree = _model.build_state(snap, stacks)
    first, stopped, nested = tree["proc_meshes"]
    assert first["name"] == "p" and first["dims"] == {"gpus": 2} and first["state"] == "running"
    assert [p["proc_id"] for p in first["procs"]] == ["c1.p0", "c1.p1"]
    assert stopped["state"] == "stopped" and stopped["procs"][0]["reason"].endswith("status 0")
    (workers,) = first["actor_meshes"]
    assert workers["state"] == "failed" and workers["dims"] == {"gpus": 2}
    zero, one = workers["ranks"]
    assert zero["endpoint"] == "step" and zero["running_for"] == 3.0 and zero["queued"] == 1
    assert zero["proc_id"] == "c1.p0" and zero["point"] == {"gpus": 0}
    assert one["state"] == "failed" and one["failure"]["summary"].endswith("ValueError: 42")
    assert one["point"] == {"gpus": 1} and not one["seen"]
    assert tree["failures"] == [
        {"mesh": "workers", "key": "c1.workers.0", "cls": "Worker", "rank": 1,
         "address": addresses[1], "summary": "endpoint step raised ValueError: 42",
         "traceback": "Traceback..."}
    ]  # fmt: skip
    assert nested["spawned_by"] == "an actor"
    assert [a["name"] for a in nested["actor_meshes"]] == ["helpers"]
    assert tree["hosts"] == [{"name": "node3", "procs": 4, "running": 3}]
    detail = _model.actor_detail(stacks, addresses[0], "workers", 0, tree)
    assert detail["actor"]["endpoint"] == "step"
    assert detail["frames"][0]["source"] == "self.ready.wait()"
    assert detail["row"]["state"] == "running"
    dead = _model.actor_detail(stacks, addresses[1], "workers", 1, tree)
    assert dead["actor"] is None and dead["row"]["failure"] is not None
    view = _model.stacks_view(stacks, addresses[0])
    assert view["text"].startswith("stacks of 1 proc(s)") and "self.ready.wait()" in view["text"]
    assert [p["proc_id"] for p in view["procs"]] == ["c1.p0", "c1.p1", "c1.p0.q0"]


def test_the_timeline_merges_close_calls_and_keeps_the_last_minutes() -> None:
    timeline = Timeline(keep=60.0)
    # Events as a proc's trace ring holds them (core/_trace.py): handled calls, sends, instants.
    port = ("unix:///tmp/c1.sock", 5)
    events: list[tuple[Any, ...]] = [
        ("C", "Worker w[0]", "step", t - 0.0001, t, t + 0.0005, "returned", port, 0)
        for t in (100.0 + i * 0.001 for i in range(10))
    ]
    events += [
        ("C", "Worker w[0]", "step", 110.0, 110.0, 111.0, "raised ValueError: x", None, 0),
        ("S", "Worker w[0]", "step", 110.0, port, range(2)),  # sends are left out
        ("i", "Worker w[0]", "stall", 112.0, {}),
    ]
    timeline.add([ProcTrace("c1.p0", "node3", 11, tuple(events), 2)], now=112.0)
    view = timeline.view(now=120.0, window=30.0, width=1000)
    (lane,) = view["lanes"]
    assert lane["track"] == "Worker w[0]" and lane["proc_id"] == "c1.p0"
    burst, failed = lane["spans"]
    assert burst["count"] == 10 and burst["ok"] and burst["name"] == "step"
    assert failed == {"from": 10.0, "to": 9.0, "name": "step", "count": 1, "ok": False}
    assert lane["instants"] == [{"at": 8.0, "name": "stall"}]
    assert view["dropped"] == 2
    running = _model.running_calls(
        JobStacks((ProcStacks("c1.p1", "a", "h", 1, (), True, actors=(_actor("w", 1, "step"),)),), 1.0),
        taken_at=118.0,
    )
    view = timeline.view(now=120.0, window=30.0, running=running)
    assert view["lanes"][1]["running"] == [5.0, 0.0]
    timeline.prune(now=200.0)  # older than `keep`: gone
    assert timeline.view(now=200.0, window=30.0)["lanes"] == []
