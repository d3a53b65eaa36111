"""The mailbox and its executor: one message at a time, in order; failures bounce what is
queued; cleanup runs once. Each test runs on real procs and on the simulator, the same
program in both (the real runs are in the slow tier)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from regency.actor import ActorError, HostMesh, SupervisionError, as_endpoint, this_host
from regency.core._executor import ThreadExecutor
from regency.sim import simulate
from regency.sim._lockstep import _LockstepMailbox

from .mailbox_actors import AsyncMortal, FailsInit, Mortal, Overlap, Plain

T = 30
Run = Callable[[Callable[[HostMesh], Any]], Any]


@pytest.fixture(params=["sim", pytest.param("real", marks=pytest.mark.slow)])
def run(request: pytest.FixtureRequest, roots: Any) -> Iterator[Run]:
    """Run ``program(hosts)`` on real procs of this host, or on one simulated host."""
    if request.param == "sim":
        yield lambda program: simulate(program, seed=5, hosts=1).value
        return
    made: list[Any] = []

    class Tracking:
        """this_host(), remembering the proc meshes it starts (stopped after the test)."""

        def spawn_procs(self, **options: Any) -> Any:
            pm = this_host().spawn_procs(**options)
            made.append(pm)
            return pm

    try:
        yield lambda program: program(Tracking())  # type: ignore[arg-type]
    finally:
        for pm in made:
            pm.stop().get(T)


def test_sync_and_async_handlers_never_overlap_and_keep_order(run: Run) -> None:
    def program(hosts: HostMesh) -> tuple[int, list[int]]:
        actor = hosts.spawn_procs(per_host={"gpus": 1}).spawn("overlap", Overlap)
        for i in range(12):
            (actor.async_step if i % 3 else actor.sync_step).broadcast(i)
        most, order = actor.report.call_one().get(T)
        return most, order

    most, order = run(program)
    assert most == 1
    assert order == list(range(12))


def test_plain_methods_through_as_endpoint_async_or_handing_back_a_coroutine(run: Run) -> None:
    """A sync endpoint's call runs without a generator of its own; what must be awaited
    (an async plain method, a coroutine a sync one returns) still is, errors included."""

    def program(hosts: HostMesh) -> list[Any]:
        actor = hosts.spawn_procs(per_host={"gpus": 1}).spawn("plain", Plain)
        got: list[Any] = [
            as_endpoint(actor.later).call_one(3).get(T),
            as_endpoint(actor.hands_back).call_one(4).get(T),
        ]
        for method in (actor.later, actor.hands_back):
            try:
                as_endpoint(method).call_one(-1).get(T)
            except ActorError as exc:
                got.append(str(exc).splitlines()[0])
        got.append(actor.where.call_one().get(T))  # the actor lives on
        return got

    assert run(program) == [
        3,
        4,
        "Actor call plain.later failed on rank 0: builtins.ValueError: later(-1)",
        "Actor call plain.hands_back failed on rank 0: builtins.ValueError: later(-1)",
        (0, 0),
    ]


def test_message_rank_follows_each_call_of_a_burst(run: Run) -> None:
    """Calls to the whole mesh and to a slice, interleaved and issued before any is
    awaited: each handler sees its own call's message rank (a context is shared only
    between consecutive calls to the same slice)."""

    def program(hosts: HostMesh) -> list[Any]:
        actors = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Plain)
        futures = []
        for i in range(40):
            target = actors if i % 3 else actors.slice(gpus=slice(1, 2))
            futures.append((i % 3 != 0, target.where.call()))
        return [(whole, f.get(T).values()) for whole, f in futures]

    for whole, values in run(program):
        if whole:
            assert values == [(0, 0), (1, 1)]
        else:
            assert values == [(1, 0)]


@pytest.mark.slow
def test_a_proc_freezes_its_import_time_heap(roots: Any) -> None:
    """Full collections in a proc skip what it imported (pipelined calls trigger several)."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert procs.spawn("plain", Plain).frozen.call_one().get(T) > 10_000
    finally:
        procs.stop().get(T)


def test_a_failed_init_bounces_what_was_queued(run: Run) -> None:
    def program(hosts: HostMesh) -> str:
        actor = hosts.spawn_procs(per_host={"gpus": 1}).spawn("failsinit", FailsInit)
        try:
            actor.hello.call_one().get(T)
        except SupervisionError as exc:
            return str(exc)
        return "answered"

    assert "__init__ raised builtins.ValueError: init refused" in run(program)


@pytest.mark.parametrize("cls", [Mortal, AsyncMortal], ids=["thread", "loop"])
def test_death_bounces_later_calls_and_cleanup_runs_once(
    run: Run, cls: type, tmp_path: Path
) -> None:
    log = tmp_path / "cleanup.log"

    def program(hosts: HostMesh) -> list[str]:
        actor = hosts.spawn_procs(per_host={"gpus": 1}).spawn("mortal", cls, str(log))
        outcomes = [actor.ok.call_one().get(T)]
        for call in (actor.die.call_one, actor.ok.call_one):
            try:
                call().get(T)
                outcomes.append("answered")
            except (SupervisionError, ActorError) as exc:
                outcomes.append(type(exc).__name__)
        return outcomes

    assert run(program) == ["ok", "SupervisionError", "SupervisionError"]
    # The caller hears of the death before __cleanup__ ends (a real proc's may still run).
    assert cleaned_up(log) == ["cleanup SystemExit"]


@pytest.mark.parametrize("cls", [Mortal, AsyncMortal], ids=["thread", "loop"])
def test_stop_runs_cleanup_and_later_calls_bounce(run: Run, cls: type, tmp_path: Path) -> None:
    log = tmp_path / "cleanup.log"

    def program(hosts: HostMesh) -> str:
        actor = hosts.spawn_procs(per_host={"gpus": 1}).spawn("stopped", cls, str(log))
        actor.ok.call_one().get(T)
        actor.stop().get(T)
        try:
            actor.ok.call_one().get(T)
        except SupervisionError as exc:
            return str(exc)
        return "answered"

    assert "was stopped" in run(program)
    assert cleaned_up(log) == ["cleanup None"]


def cleaned_up(log: Path) -> list[str]:
    """The cleanup log's lines, once there are any: simulated, at once; on a real proc the
    actor's thread may still be writing it when its failure reached the caller, so this
    polls (a real process is the point there) for up to T seconds."""
    deadline = time.monotonic() + T
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return log.read_text().splitlines() if log.exists() else []


# -- the mailboxes themselves ---------------------------------------------------------------


def test_production_mailbox_is_fifo_and_says_when_empty() -> None:
    class NoRuntime:
        token = None
        leader = None  # (threads wait on locks: the mailbox is a plain queue)

    box = ThreadExecutor(NoRuntime()).mailbox()  # type: ignore[arg-type]
    for item in [("a",), ("b",), ("c",)]:
        box.put(item)
    assert [box.get(), box.get_nowait(), box.get()] == [("a",), ("b",), ("c",)]
    with pytest.raises(queue.Empty):
        box.get_nowait()


def test_lockstep_mailbox_is_fifo_and_says_when_empty() -> None:
    box = _LockstepMailbox()
    for item in [("a",), ("b",)]:
        box.put(item)
    assert [box.get(), box.get_nowait()] == [("a",), ("b",)]
    with pytest.raises(queue.Empty):
        box.get_nowait()
