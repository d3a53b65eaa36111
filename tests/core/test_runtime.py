"""The local runtime end to end, with real processes."""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from regency.actor import (
    Accumulator,
    ActorError,
    Channel,
    Future,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    as_endpoint,
    proc_mesh,
    send,
    this_host,
    this_proc,
)
from regency.sim import simulate

from ..conftest import SpawnProcs
from .actors import (
    AsyncCaller,
    Bad,
    Blocker,
    Caller,
    Counter,
    Mixed,
    Ported,
    Producer,
    Raiser,
    Recorder,
    Releaser,
    Where,
)

# Tests on the module's real procs are in the slow tier (tests/conftest.py marks every test
# that uses the ``procs`` fixture); those that take ``on_procs`` run on real procs (slow) and
# on a simulated cluster (fast), the same test body for both.

T = 30  # generous timeout for .get(): a hang fails the test instead of the suite


OnProcs = Callable[[Callable[[ProcMesh], None]], None]


@pytest.fixture(params=[pytest.param("real", marks=pytest.mark.slow), "sim"])
def on_procs(request: pytest.FixtureRequest) -> OnProcs:
    """Run ``body(procs)`` on four procs: the module's real ones, or four simulated ones
    (``body`` runs as the simulated program; its assertions and errors come back here)."""
    if request.param == "real":
        real: ProcMesh = request.getfixturevalue("procs")
        return lambda body: body(real)

    def simulated(body: Callable[[ProcMesh], None]) -> None:
        def program(hosts: Any) -> None:
            body(hosts.spawn_procs(per_host={"gpus": 4}))

        simulate(program, seed=1, hosts=1)

    return simulated


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 4}, env={"REGENCY_TEST_ENV": "hello"})
    try:
        pm.initialized.get(T)
        yield pm
    finally:
        pm.stop().get(T)


@pytest.mark.slow
def test_this_proc_actor_runs_in_the_controller_process() -> None:
    c = this_proc().spawn("local_counter", Counter, 41)
    c.incr.broadcast()
    assert c.value.call_one().get(T) == 42
    # A Counter has no "where" endpoint: the mesh says so and names those it has.
    with pytest.raises(AttributeError, match=r"Counter has no endpoint 'where'; endpoints: "):
        _ = c.where
    w = this_proc().spawn("local_where", Where)
    assert w.where.call_one().get(T)["pid"] == os.getpid()


def test_issue_example(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        cs = procs.spawn("cs", Counter, 0)
        cs.slice(gpus=slice(0, 2)).incr.broadcast()
        result = cs.value.call().get(T)
        assert isinstance(result, ValueMesh)
        assert [(p["gpus"], v) for p, v in result.items()] == [(0, 1), (1, 1), (2, 0), (3, 0)]
        assert result.item(gpus=1) == 1
        assert len(result) == 4

    on_procs(body)


def test_each_point_is_its_own_process_with_env_and_context(procs: ProcMesh) -> None:
    ws = procs.spawn("where", Where)
    info = ws.where.call().get(T)
    pids = {v["pid"] for v in info.values()}
    assert len(pids) == 4 and os.getpid() not in pids
    for point, v in info.items():
        assert v["rank"] == {"gpus": point["gpus"]}
        assert v["flat"] == point.rank
        assert v["size"] == {"gpus": 4}
        assert ".where." in v["name"] and v["name"].endswith(f"[{point.rank}]")
        assert v["env"] == "hello"
    assert len({v["name"] for v in info.values()}) == 4  # one per actor instance
    # message_rank is relative to the addressed slice, rank to the whole mesh.
    sliced = ws.slice(gpus=slice(2, 4)).where.call().get(T)
    assert [v["message_rank"] for v in sliced.values()] == [{"gpus": 0}, {"gpus": 1}]
    assert [v["rank"] for v in sliced.values()] == [{"gpus": 2}, {"gpus": 3}]


def test_call_one_needs_exactly_one_rank(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        cs = procs.spawn("c1", Counter)
        with pytest.raises(ValueError, match=r"call_one needs a mesh of exactly 1 rank \(got 4 ranks"):
            cs.value.call_one()
        assert cs.slice(gpus=3).value.call_one().get(T) == 0

    on_procs(body)


def test_wrong_dim_and_index_name_the_valid_range(procs: ProcMesh) -> None:
    cs = procs.spawn("c2", Counter)
    with pytest.raises(ValueError, match=r"dims must be one of \('gpus',\) \(got 'gpu'\)"):
        cs.slice(gpu=0)
    with pytest.raises(IndexError, match=r"index 4 out of range for dim 'gpus' of size 4"):
        cs.slice(gpus=4)
    assert cs.size("gpus") == 4 and cs.sizes == {"gpus": 4} and len(cs) == 4
    flat = cs.split(gpus=("a", "b"), b=2)
    assert flat.sizes == {"a": 2, "b": 2}
    assert flat.slice(a=1).value.call().get(T).values() == [0, 0]


def test_choose_stream_and_accumulator(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        ws = procs.spawn("w3", Where)
        chosen = ws.where.choose().get(T)
        assert 0 <= chosen["flat"] < 4
        streamed = [f.get(T)["flat"] for f in ws.where.stream()]
        assert sorted(streamed) == [0, 1, 2, 3]
        cs = procs.spawn("c3", Counter, 5)
        total = Accumulator(cs.value, 0, lambda acc, v: acc + v).accumulate().get(T)
        assert total == 20

    on_procs(body)


def test_channel_fan_in_with_ports_passed_to_actors(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        ps = procs.spawn("producers", Producer)
        port, receiver = Channel[int].open()
        ps.produce.broadcast(port, 50)
        got = [receiver.recv().get(T) for _ in range(200)]
        assert sorted(got) == sorted(r * 1000 + i for r in range(4) for i in range(50))
        for r in range(4):  # per-sender order holds
            mine = [g for g in got if g // 1000 == r]
            assert mine == sorted(mine)
        assert pickle.loads(pickle.dumps(port))._ref == port._ref

    on_procs(body)


def test_send_with_explicit_port_and_selection(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        cs = procs.spawn("c4", Counter, 7)
        port, receiver = Channel[int].open()
        send(cs.value, (), {}, port=port, selection="all")
        assert [receiver.recv().get(T) for _ in range(4)] == [7, 7, 7, 7]
        send(cs.value, (), {}, port=port, selection="choose")
        assert receiver.recv().get(T) == 7
        with pytest.raises(ValueError, match="selection must be one of"):
            send(cs.value, (), {}, selection="some")

    on_procs(body)


def test_explicit_response_port(procs: ProcMesh) -> None:
    # Real procs only: the actor answers from a threading.Timer, a real thread, which a
    # simulation cannot schedule.
    p = procs.spawn("ported", Ported)
    assert p.slice(gpus=0).answer_later.call_one(3).get(T) == "answer 3"
    assert p.answer_later.call(4).get(T).values() == ["answer 4"] * 4


def test_mixed_sync_and_async_endpoints_run_one_at_a_time(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        m = procs.spawn("mixed", Mixed).slice(gpus=0)
        futs = [m.slow_sync.call_one(0.02) if i % 2 else m.slow_async.call_one(0.02) for i in range(10)]
        assert [f.get(T) for f in futs] == ["async", "sync"] * 5
        assert m.overlap_count.call_one().get(T) == 0

    on_procs(body)


def test_different_actors_in_one_proc_run_concurrently(procs: ProcMesh) -> None:
    one = procs.slice(gpus=1)
    blocker = one.spawn("blocker", Blocker)
    releaser = one.spawn("releaser", Releaser)
    waiting = blocker.wait_for_release.call_one()
    releaser.release.call_one().get(T)
    assert waiting.get(T) is True


def test_meshes_are_arguments_and_actors_call_them_directly(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        counters = procs.spawn("peers", Counter, 0)
        counters.incr.call(10).get(T)
        callers = procs.spawn("callers", Caller, counters)
        # Sync endpoints block on another actor's reply without deadlocking their proc.
        assert callers.peer_value_sync.call().get(T).values() == [10] * 4
        assert callers.peer_value_async.call().get(T).values() == [10] * 4
        callers.slice(gpus=0).incr_peers.call_one().get(T)
        assert counters.value.call().get(T).values() == [11] * 4

    on_procs(body)


def test_get_on_the_event_loop_raises_instead_of_freezing(procs: ProcMesh) -> None:
    counters = procs.spawn("c5", Counter)
    ac = procs.slice(gpus=0).spawn("ac", AsyncCaller)
    with pytest.raises(ActorError, match=r"use `await fut` inside async endpoints"):
        ac.get_blocking.call_one(counters).get(T)


def test_endpoint_exception_reaches_caller_and_actor_survives(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        r = procs.spawn("raiser", Raiser)
        with pytest.raises(ActorError) as info:
            r.slice(gpus=2).boom.call_one("bad input").get(T)
        err = info.value
        assert isinstance(err.exception, ValueError)
        assert str(err.exception) == "bad input"
        assert "Actor call raiser.boom failed" in str(err)
        assert "in boom" in str(err) and 'raise ValueError(message)' in str(err)
        with pytest.raises(ActorError, match="KeyError"):
            r.aboom.call("x").get(T)
        assert r.ok.call().get(T).values() == ["still alive"] * 4
        with pytest.raises(ActorError, match="returned a value that cannot be sent"):
            r.slice(gpus=0).unpicklable_result.call_one().get(T)
        assert r.slice(gpus=0).ok.call_one().get(T) == "still alive"

    on_procs(body)


def test_unpicklable_argument_fails_at_the_call_site(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        rec = procs.spawn("rec", Recorder)
        with pytest.raises(TypeError, match=r"cannot pickle argument #0 \(lock\) of endpoint rec.record"):
            rec.record.broadcast(threading.Lock())
        with pytest.raises(TypeError, match=r"cannot pickle argument 'item' \(lock\) of endpoint"):
            rec.record.call(item=threading.Lock())

    on_procs(body)


def test_unknown_endpoint_has_a_hint(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        cs = procs.spawn("c6", Counter)
        with pytest.raises(AttributeError, match=r"Counter has no endpoint 'valu'; endpoints: \['incr', 'value'\]"):
            cs.valu  # noqa: B018
        with pytest.raises(AttributeError, match=r"Counter.plain is not an endpoint; decorate it"):
            cs.plain.call()
        assert as_endpoint(cs.plain).call().get(T).values() == [-1] * 4

    on_procs(body)


def test_per_pair_order_holds(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        rec = procs.spawn("order", Recorder)
        for i in range(500):
            rec.record.broadcast(i)
        logs = rec.log.call().get(T)
        assert all(v == list(range(500)) for v in logs.values())

    on_procs(body)


def test_future_get_timeout_is_reobservable_and_cached(procs: ProcMesh) -> None:
    m = procs.spawn("slow", Mixed).slice(gpus=0)
    fut = m.slow_sync.call_one(0.5)
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)
    assert fut.get(T) == "sync"
    assert fut.get() == "sync"
    assert fut.result() == "sync"


async def test_await_from_trio(procs: ProcMesh) -> None:
    cs = procs.spawn("c7", Counter, 3)
    assert await cs.slice(gpus=0).value.call_one() == 3
    values = await cs.value.call()
    assert values.values() == [3] * 4
    await cs.initialized


def test_await_from_asyncio(procs: ProcMesh) -> None:
    cs = procs.spawn("c8", Counter, 9)

    async def main() -> list[int]:
        one = await cs.slice(gpus=1).value.call_one()
        mesh = await cs.value.call()
        return [one, *mesh.values()]

    assert asyncio.run(main()) == [9] * 5


def test_init_failure_is_reported_and_calls_fail(spawn_procs: SpawnProcs) -> None:
    pm = spawn_procs(per_host={"gpus": 2})
    bad = pm.spawn("bad", Bad)
    with pytest.raises(SupervisionError, match="init exploded"):
        bad.initialized.get(T)
    with pytest.raises(SupervisionError, match=r"__init__ raised builtins.RuntimeError: init exploded"):
        bad.never.call().get(T)
    pm.stop().get(T)


def test_actor_mesh_stop(on_procs: OnProcs) -> None:
    def body(procs: ProcMesh) -> None:
        cs = procs.spawn("stoppable", Counter)
        cs.value.call().get(T)
        cs.stop().get(T)
        with pytest.raises(SupervisionError, match="was stopped"):
            cs.value.call().get(T)
        # Other meshes on the same procs keep working.
        assert procs.spawn("after_stop", Counter, 1).value.call().get(T).values() == [1] * 4

    on_procs(body)


@pytest.mark.slow
def test_proc_mesh_stop_and_older_constructor() -> None:
    pm = proc_mesh(gpus=2).get(T)
    ws = pm.spawn("w", Where)
    pids = [v["pid"] for v in ws.where.call().get(T).values()]
    pm.stop().get(T)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(SupervisionError):
        ws.where.call().get(T)


def test_future_is_resolved_once() -> None:
    f: Future[int] = Future()
    f.set_result(1)
    f.set_result(2)
    f.set_exception(RuntimeError())
    assert f.get() == 1


async def test_trio_can_await_many_futures_concurrently(procs: ProcMesh) -> None:
    cs = procs.spawn("c9", Counter, 1)
    results = []

    async def one(i: int) -> None:
        results.append(await cs.slice(gpus=i % 4).value.call_one())

    async with trio.open_nursery() as n:
        for i in range(40):
            n.start_soon(one, i)
    assert results == [1] * 40


@pytest.mark.slow
def test_the_controller_freezes_the_heap_it_started_with(procs: ProcMesh) -> None:
    """Once the first production runtime runs, what was alive then (the imports) is out of
    the collector's way: full collections during pipelined calls would traverse it all."""
    import gc

    from regency.core import _controller

    assert _controller._heap_frozen
    assert gc.get_freeze_count() > 1000  # the import-time heap: tens of thousands
