"""Casting trees on the simulator (regency.core._casting): every adverb through the tree,
one sender's messages to one actor in order whatever path they took, and forwarders that
crash, are cut off or sit behind a slow link mid-cast."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import regency
from regency.actor import Accumulator, Actor, SupervisionError, endpoint
from regency.core._config import overridden
from regency.core._controller import current_runtime
from regency.sim._cluster import current, simulate

from ..conftest import RootFailures
from .actors import CastLog


class Relay(Actor):
    """Casts from inside a proc: the tree's sender is an actor, not the controller."""

    def __init__(self, logs: Any) -> None:
        self.logs = logs

    @endpoint
    def cast_and_read(self, item: int) -> tuple[list[list[int]], int]:
        from regency.core._current import current_runtime_or_none

        self.logs.add.broadcast(item)
        self.logs.flatten("r").slice(r=33).add.call_one(item + 1)
        seen = list(self.logs.log.call().get().values())
        rt = current_runtime_or_none()
        assert rt is not None
        return seen, rt.casting.tree_casts


@pytest.fixture(autouse=True)
def small_trees() -> Iterator[None]:
    """Trees from 8 procs up, 4 children each (deep trees on small meshes)."""
    with overridden(cast_tree_min=8, cast_fanout=4):
        yield


def test_every_adverb_goes_through_the_tree() -> None:
    def program(hosts: Any) -> dict[str, Any]:
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        logs = procs.spawn("logs", CastLog)
        rt = current_runtime()
        before = rt.casting.tree_casts
        ranks = list(logs.rank.call().get().values())
        streamed = sorted(f.get() for f in logs.rank.stream())
        total = Accumulator(logs.rank, 0, lambda a, b: a + b).accumulate().get()
        logs.add.broadcast(5)
        seen = list(logs.log.call().get().values())
        return {
            "ranks": ranks, "streamed": streamed, "total": total, "seen": seen,
            "tree_casts": rt.casting.tree_casts - before,
        }

    value = simulate(program, seed=1, hosts=8).value
    n = 64
    assert value["ranks"] == list(range(n))
    assert value["streamed"] == list(range(n))
    assert value["total"] == n * (n - 1) // 2
    assert value["seen"] == [[5]] * n
    assert value["tree_casts"] == 5


def test_an_actor_casts_through_a_tree_too() -> None:
    def program(hosts: Any) -> tuple[list[list[int]], int]:
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        logs = procs.spawn("relayed", CastLog)
        relay = procs.slice(hosts=0, gpus=0).spawn("relay", Relay, logs)
        result: tuple[list[list[int]], int] = relay.cast_and_read.call_one(7).get()
        return result

    seen, tree_casts = simulate(program, seed=8, hosts=8).value
    assert seen[33] == [7, 8]
    assert [s for i, s in enumerate(seen) if i != 33] == [[7]] * 63
    assert tree_casts == 2


def test_small_meshes_keep_the_direct_path() -> None:
    def program(hosts: Any) -> int:
        logs = hosts.spawn_procs(per_host={"gpus": 2}).spawn("logs", CastLog)  # 4 procs
        logs.rank.call().get()
        return current_runtime().casting.tree_casts

    assert simulate(program, seed=1, hosts=2).value == 0


# Slices of a 4 x 8 mesh a program casts to; None: one rank (a direct call_one).
SLICES: list[dict[str, Any]] = [
    {}, {"hosts": slice(0, 2)}, {"gpus": slice(0, 4)}, {"hosts": 1}, {"gpus": slice(1, None, 2)},
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("cast"), st.integers(0, len(SLICES) - 1)),
            st.tuples(st.just("one"), st.integers(0, 31)),
        ),
        min_size=1,
        max_size=12,
    ),
    fanout=st.integers(2, 6),
    seed=st.integers(0, 2**16),
)
# Found by this test: a cast held behind a call_one took another tree once it was released.
@example(ops=[("cast", 3), ("one", 14), ("cast", 3)], fanout=5, seed=0)
def test_one_senders_messages_arrive_in_order_whatever_the_path(
    ops: list[tuple[str, int]], fanout: int, seed: int
) -> None:
    """A call_one right after a cast never overtakes it at that rank, nor does a cast over
    a different slice (another tree) overtake an earlier one."""

    def program(hosts: Any) -> list[list[int]]:
        regency.configure(cast_fanout=fanout)
        logs = hosts.spawn_procs(per_host={"gpus": 8}).spawn("logs", CastLog)
        flat = logs.flatten("r")
        for value, (kind, arg) in enumerate(ops):
            if kind == "cast":
                logs.slice(**SLICES[arg]).add.broadcast(value)
            else:
                flat.slice(r=arg).add.call_one(value)  # not awaited: pipelined
        return list(logs.log.call().get().values())

    got = simulate(program, seed=seed, hosts=4).value
    expected: list[list[int]] = [[] for _ in range(32)]
    for value, (kind, arg) in enumerate(ops):
        if kind == "cast":
            sl = SLICES[arg]

            def pick(index: Any, size: int) -> list[int]:
                picked = range(size)[index]
                return [picked] if isinstance(picked, int) else list(picked)

            targets = sorted(
                h * 8 + g
                for h in pick(sl.get("hosts", slice(None)), 4)
                for g in pick(sl.get("gpus", slice(None)), 8)
            )
        else:
            targets = [arg]
        for r in targets:
            expected[r].append(value)
    assert got == expected


def test_a_forwarder_that_crashes_mid_broadcast_does_not_lose_it_below(
    roots: RootFailures,
) -> None:
    """64 procs, fan-out 4: position 1 forwards to 2, 3 and 4. It crashes as the broadcast
    leaves; its parent reaches 2, 3 and 4 itself, once each."""

    def program(hosts: Any) -> list[list[int]]:
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        logs = procs.spawn("fwdcrash", CastLog)
        logs.log.call().get()
        logs.add.broadcast(7)
        current().crash_proc(procs.slice(hosts=0, gpus=1))
        logs.add.broadcast(8)  # the crash is not known yet: this one is taken over too
        survivors = logs.slice(hosts=0, gpus=slice(2, 5))
        return list(survivors.log.call().get().values())

    assert simulate(program, seed=2, hosts=8).value == [[7, 8]] * 3
    failures = roots.of("fwdcrash")
    assert len(failures) == 1 and failures[0].ranks == (1,)


def test_a_forwarder_that_crashes_mid_call_fails_it_naming_the_ranks_behind(
    roots: RootFailures,
) -> None:
    def program(hosts: Any) -> str:
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        logs = procs.spawn("callcrash", CastLog)
        logs.log.call().get()
        fut = logs.rank.call()
        current().crash_proc(procs.slice(hosts=0, gpus=1))
        try:
            fut.get()
        except SupervisionError as exc:
            return str(exc)
        return "no error"

    message = simulate(program, seed=3, hosts=8).value
    assert "callcrash.rank() failed, The actors <" in message
    assert "> at ranks [1, 2, 3, 4] and all their descendants have failed" in message
    assert [f.ranks for f in roots.of("callcrash")] == [(1,)]  # reported once


def test_a_forwarder_cut_off_for_a_while_delivers_late_and_in_order() -> None:
    """A partition shorter than delivery_timeout: the forwarder's host is cut from the
    controller mid-cast; the cast arrives once it heals, and a call_one to a rank behind the
    forwarder waits for it."""

    def program(hosts: Any) -> tuple[list[list[int]], float]:
        logs = hosts.spawn_procs(per_host={"gpus": 8}).spawn("cut", CastLog)
        logs.log.call().get()
        start = current().now()
        current().partition(["controller"], ["host2"], duration=2.0)
        logs.add.broadcast(1)
        flat = logs.flatten("r")
        flat.slice(r=17).add.call_one(2).get()  # rank 17: behind the forwarder at 16
        return list(logs.log.call().get().values()), current().now() - start

    seen, took = simulate(program, seed=4, hosts=8).value
    assert seen[17] == [1, 2]
    assert [s for i, s in enumerate(seen) if i != 17] == [[1]] * 63
    assert took >= 2.0


def test_a_slow_link_under_a_subtree_slows_only_that_subtree() -> None:
    """A slow link between host2 and host3 (inside one range of the tree): a call over the
    whole mesh waits for it once, not once per level; one over the other hosts does not."""

    def program(hosts: Any) -> tuple[list[int], float, float]:
        logs = hosts.spawn_procs(per_host={"gpus": 8}).spawn("slow", CastLog)
        logs.log.call().get()
        current().delay("host2", "host3", extra=0.5, duration=60.0)
        start = current().now()
        ranks = list(logs.rank.call().get().values())
        whole = current().now() - start
        start = current().now()
        logs.slice(hosts=slice(4, None)).rank.call().get()
        return ranks, whole, current().now() - start

    ranks, whole, elsewhere = simulate(program, seed=5, hosts=8).value
    assert ranks == list(range(64))
    assert 0.5 <= whole < 1.5
    assert elsewhere < 0.1


def test_a_forwarder_cut_off_from_its_children_hands_them_to_the_sender() -> None:
    """host0 and host1 cannot talk for a minute; the forwarder at position 0 (host0) was to
    reach 9 and 13 (host1). It gives up on them after delivery_timeout and hands their
    ranges up; the controller, which reaches host1, sends them the cast itself. Every rank
    gets it once, and a call_one sent right after the broadcast still lands behind it."""

    def program(hosts: Any) -> list[list[int]]:
        logs = hosts.spawn_procs(per_host={"gpus": 8}).spawn("cutkids", CastLog)
        logs.log.call().get()
        current().partition(["host0"], ["host1"], duration=60.0)
        logs.add.broadcast(1)
        logs.flatten("r").slice(r=10).add.call_one(2)
        # Read back without crossing the cut (a gathered call over it fails, naming ranks).
        return [
            log
            for part in ({"hosts": 0}, {"hosts": 1}, {"hosts": slice(2, None)})
            for log in logs.slice(**part).log.call().get().values()
        ]

    seen = simulate(program, seed=6, hosts=8).value
    assert seen[10] == [1, 2]
    assert [s for i, s in enumerate(seen) if i != 10] == [[1]] * 63


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fanout=st.integers(2, 5),
    victim=st.integers(1, 31),
    seed=st.integers(0, 2**16),
)
def test_any_proc_crashing_mid_broadcast_loses_it_only_for_itself(
    fanout: int, victim: int, seed: int
) -> None:
    """32 procs, any fan-out, any proc (a forwarder or a leaf) crashing as a broadcast
    leaves: every other proc gets it exactly once."""

    def program(hosts: Any) -> list[list[int]]:
        regency.configure(cast_fanout=fanout)
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        logs = procs.spawn("anycrash", CastLog)
        logs.log.call().get()
        logs.add.broadcast(1)
        current().crash_proc(procs.flatten("r").slice(r=victim))
        flat = logs.flatten("r")
        seen: list[list[int]] = []
        parts = [slice(0, victim)] + ([slice(victim + 1, None)] if victim < 31 else [])
        for part in parts:
            seen.extend(flat.slice(r=part).log.call().get().values())
        return seen

    assert simulate(program, seed=seed, hosts=4).value == [[1]] * 31


def test_fences_are_per_actor() -> None:
    """A slow tree cast to one actor mesh holds back a direct message to that actor only:
    another actor on the same proc answers at once."""

    def program(hosts: Any) -> tuple[float, float, list[int]]:
        procs = hosts.spawn_procs(per_host={"gpus": 8})
        slow, other = procs.spawn("slowcast", CastLog), procs.spawn("other", CastLog)
        slow.log.call().get()
        other.log.call().get()
        # Rank 9 (host1) is reached through the proc at position 0 (host0).
        current().delay("host0", "host1", extra=1.0, duration=60.0)
        slow.add.broadcast(1)
        start = current().now()
        other.flatten("r").slice(r=9).add.call_one(5).get()
        other_took = current().now() - start
        slow.flatten("r").slice(r=9).add.call_one(2).get()
        slow_took = current().now() - start
        return other_took, slow_took, slow.flatten("r").slice(r=9).log.call_one().get()

    other_took, slow_took, seen = simulate(program, seed=7, hosts=8).value
    assert other_took < 0.1
    assert slow_took >= 1.0
    assert seen == [1, 2]
