"""Property tests of the supervision state machine (pure: no processes)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regency.supervision import (
    ROOT,
    Escalate,
    FailureCause,
    MeshFailure,
    MeshSpawned,
    MeshStopped,
    Notify,
    OwnerGone,
    ProcLost,
    RanksFailed,
    RunRootHook,
    StopMeshes,
    SuperviseDone,
    Supervisor,
)

ADDRESSES = ["unix:///a", "unix:///b", "unix:///c"]
OWNERS = [ROOT, "o1", "o2"]
CAUSE = FailureCause("boom")

meshes = st.lists(
    st.tuples(st.sampled_from(OWNERS), st.lists(st.sampled_from(ADDRESSES), min_size=1, max_size=4)),
    min_size=1,
    max_size=4,
)


def events_for(spawned: list[tuple[str, list[str]]]) -> st.SearchStrategy[object]:
    keys = [f"m{i}" for i in range(len(spawned))]
    rank = st.integers(0, 3)
    failure = st.builds(
        lambda k, r: MeshFailure(k, k, (r,), CAUSE, ()), st.sampled_from(keys), rank
    )
    return st.one_of(
        st.builds(
            lambda k, rs: RanksFailed(k, tuple(r % 4 for r in rs), CAUSE),
            st.sampled_from(keys),
            st.lists(rank, min_size=1, max_size=3),
        ),
        st.builds(lambda a: ProcLost(a, CAUSE), st.sampled_from(ADDRESSES)),
        st.builds(lambda k: MeshStopped(k), st.sampled_from(keys)),
        st.builds(
            lambda o, f, h: SuperviseDone(o, f, h),
            st.sampled_from(OWNERS),
            failure,
            st.booleans(),
        ),
        st.builds(OwnerGone, st.sampled_from(OWNERS[1:])),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, list[str]]], list[object]]:
    spawned = draw(meshes)
    events = draw(st.lists(events_for(spawned), max_size=30))
    return spawned, events


def _spawn(machine: Supervisor, spawned: list[tuple[str, list[str]]]) -> None:
    for i, (owner, addresses) in enumerate(spawned):
        assert machine.handle(MeshSpawned(f"m{i}", f"m{i}", owner, owner, tuple(addresses))) == []


@settings(max_examples=300, deadline=None)
@given(scenarios())
@pytest.mark.slow
def test_each_rank_is_reported_at_most_once_and_never_after_stop(
    scenario: tuple[list[tuple[str, list[str]]], list[object]],
) -> None:
    spawned, events = scenario
    machine = Supervisor()
    _spawn(machine, spawned)
    reported: Counter[tuple[str, int]] = Counter()
    stopped: set[tuple[str, int]] = set()
    for event in events:
        if isinstance(event, RanksFailed):
            size = len(spawned[int(event.key[1:])][1])
            if any(r >= size for r in event.ranks):
                continue  # illegal; covered by its own test
        actions = machine.handle(event)  # type: ignore[arg-type]
        if isinstance(event, MeshStopped):
            size = len(spawned[int(event.key[1:])][1])
            stopped |= {(event.key, r) for r in range(size)}
        for action in actions:
            if isinstance(action, (Notify, RunRootHook)) and not isinstance(event, SuperviseDone):
                for rank in action.failure.ranks:
                    reported[(action.failure.mesh_key, rank)] += 1
                    assert (action.failure.mesh_key, rank) not in stopped
                owner = spawned[int(action.failure.mesh_key[1:])][0]
                # Root-owned meshes go to the hook, others to their owner.
                assert isinstance(action, RunRootHook) == (owner == ROOT)
                if isinstance(action, Notify):
                    assert action.owner == owner
        # ``causes`` holds exactly the failed ranks (senders read it as "none failed").
        assert set(machine.causes) == {
            (f"m{i}", r)
            for i, (_, addresses) in enumerate(spawned)
            for r in range(len(addresses))
            if machine.failed(f"m{i}", r)
        }
        if isinstance(event, OwnerGone):
            size_of = {f"m{i}": len(a) for i, (_, a) in enumerate(spawned)}
            for action in actions:
                assert isinstance(action, StopMeshes)
                stopped |= {(k, r) for k in action.keys for r in range(size_of[k])}
    assert all(count == 1 for count in reported.values())
    assert machine.broken is None


@given(st.sampled_from(OWNERS), st.booleans(), st.booleans())
def test_supervise_answer_decides_escalation(owner: str, handled: bool, raised: bool) -> None:
    machine = Supervisor()
    failure = MeshFailure("w", "w", (0,), CAUSE)
    error = FailureCause("oops", "Traceback ...") if raised else None
    actions = machine.handle(SuperviseDone(owner, failure, handled and not raised, error))
    if handled and not raised:
        assert actions == []
    elif owner == ROOT:
        assert actions == [RunRootHook(actions[0].failure)]  # type: ignore[union-attr]
    else:
        assert len(actions) == 1 and isinstance(actions[0], Escalate)
        assert actions[0].owner == owner and actions[0].cause.chained == failure
        assert ("raised" in actions[0].cause.summary) == raised


def test_proc_lost_fails_every_rank_there_once() -> None:
    machine = Supervisor()
    machine.handle(MeshSpawned("m", "m", "o1", "o1", ("a", "b", "a")))
    machine.handle(MeshSpawned("n", "n", ROOT, "client", ("a",)))
    actions = machine.handle(ProcLost("a", CAUSE))
    assert actions == [
        Notify("o1", MeshFailure("m", "m", (0, 2), CAUSE, ("o1",))),
        RunRootHook(MeshFailure("n", "n", (0,), CAUSE, ("client",))),
    ]
    assert machine.handle(ProcLost("a", CAUSE)) == []
    assert machine.failed("m", 0) and not machine.failed("m", 1)
    assert machine.cause_of("m", 2) == CAUSE


def test_illegal_events_break_the_machine_for_good() -> None:
    machine = Supervisor()
    machine.handle(MeshSpawned("m", "m", "o1", "o1", ("a",)))
    assert machine.handle(MeshSpawned("m", "m", "o1", "o1", ("a",))) == []
    assert machine.broken == "mesh 'm' spawned twice"
    assert machine.handle(RanksFailed("m", (0,), CAUSE)) == []
    other = Supervisor()
    other.handle(MeshSpawned("m", "m", "o1", "o1", ("a",)))
    assert other.handle(RanksFailed("m", (3,), CAUSE)) == []
    assert other.broken == "mesh 'm' has no rank 3"


def test_owner_gone_stops_only_running_meshes() -> None:
    machine = Supervisor()
    machine.handle(MeshSpawned("m", "m", "o1", "o1", ("a",)))
    machine.handle(MeshSpawned("n", "n", "o1", "o1", ("b",)))
    machine.handle(MeshStopped("n"))
    assert machine.handle(OwnerGone("o1")) == [StopMeshes(("m",))]
    assert machine.owned_by("o1") == []
