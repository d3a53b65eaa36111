"""Casting trees between real processes (regency.core._casting): 8 procs, 2 children per
forwarder, so a cast goes 3 hops deep over real sockets and threads."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from regency.actor import Accumulator, Channel, send
from regency.core._config import overridden
from regency.core._controller import current_runtime

from ..conftest import RootFailures, SpawnProcs
from ..sim.actors import CastLog


@pytest.fixture(autouse=True)
def deep_trees() -> Iterator[None]:
    with overridden(cast_tree_min=2, cast_fanout=2):
        yield


def test_every_adverb_through_a_tree_of_real_procs(spawn_procs: SpawnProcs) -> None:
    logs = spawn_procs(per_host={"gpus": 8}).spawn("logs", CastLog)
    rt = current_runtime()
    before = rt.casting.tree_casts
    pids = logs.pid.call().get(30).values()
    assert len(set(pids)) == 8
    big = bytes(range(256)) * 1024  # 256 KiB: out of band, forwarded as it came
    assert all(v == big for v in logs.echo.call(big).get(30).values())
    assert sorted(f.get(30) for f in logs.pid.stream()) == sorted(pids)
    assert Accumulator(logs.pid, 0, lambda a, b: a + b).accumulate().get(30) == sum(pids)
    port, receiver = Channel[int].open()
    send(logs.pid, (), {}, port=port)
    assert sorted(receiver.recv().get(30) for _ in range(8)) == sorted(pids)
    assert rt.casting.tree_casts - before == 5


def test_casts_and_direct_messages_from_one_sender_stay_in_order(
    spawn_procs: SpawnProcs,
) -> None:
    logs = spawn_procs(per_host={"gpus": 8}).spawn("order", CastLog)
    logs.log.call().get(30)
    flat = logs.flatten("r")
    expected: list[list[int]] = [[] for _ in range(8)]
    value = 0
    for round_ in range(30):
        logs.add.broadcast(value)  # through the tree
        for r in range(8):
            expected[r].append(value)
        value += 1
        target = (round_ * 3) % 8
        flat.slice(r=target).add.call_one(value)  # straight, not awaited
        expected[target].append(value)
        value += 1
        half = logs.slice(gpus=slice(0, 4))  # another tree
        half.add.broadcast(value)
        for r in range(4):
            expected[r].append(value)
        value += 1
    assert list(logs.log.call().get(30).values()) == expected


def test_a_forwarder_killed_mid_broadcast_is_taken_over(
    spawn_procs: SpawnProcs, roots: RootFailures
) -> None:
    """8 procs, fan-out 2: the proc at position 4 is to forward to 5 and 7 (5 to 6). It is
    stopped (SIGSTOP) so the broadcast waits in its socket, then killed: the controller
    sends the broadcast to 5 and 7 itself, and the failure of rank 4 is reported once."""
    logs = spawn_procs(per_host={"gpus": 8}).spawn("takeover", CastLog)
    pids = list(logs.pid.call().get(30).values())
    os.kill(pids[4], signal.SIGSTOP)
    logs.add.broadcast(1)
    os.kill(pids[4], signal.SIGKILL)
    below = logs.flatten("r").slice(r=slice(5, 8))
    assert list(below.log.call().get(30).values()) == [[1], [1], [1]]
    assert roots.wait_for("takeover").ranks == (4,)
    assert len(roots.of("takeover")) == 1
