"""Casting trees between real processes (regency.core._casting): 8 procs, 2 children per
forwarder, so a cast goes 3 hops deep over real sockets and threads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from regency.actor import Accumulator, Actor, Channel, endpoint, send
from regency.core._config import overridden
from regency.core._controller import current_runtime

from ..conftest import SpawnProcs


class Log(Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def add(self, item: int) -> None:
        self.seen.append(item)

    @endpoint
    def log(self) -> list[int]:
        return list(self.seen)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, value: Any) -> Any:
        return value


@pytest.fixture(autouse=True)
def deep_trees() -> Iterator[None]:
    with overridden(cast_tree_min=2, cast_fanout=2):
        yield


def test_every_adverb_through_a_tree_of_real_procs(spawn_procs: SpawnProcs) -> None:
    logs = spawn_procs(per_host={"gpus": 8}).spawn("logs", Log)
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
    logs = spawn_procs(per_host={"gpus": 8}).spawn("order", Log)
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
