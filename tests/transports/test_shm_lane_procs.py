"""The shared-memory lane between real processes: ``configure(shm_lane=...)`` on and off, big
arguments and replies intact either way, values an actor keeps unchanged by later frames
(they must not alias the ring)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from regency.transports import _shm
from tests.conftest import SpawnProcs

from .lane_actors import Holder, lane_frames, placed_since

T = 30
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _shm.available(), reason="no memfd seals on this platform"),
]


@pytest.mark.parametrize(
    "on, thread_reads",
    [(True, True), (True, False), (False, True)],
    ids=["lane", "lane-loop-reads", "no-lane"],
)
def test_big_arguments_and_replies_with_the_lane_on_and_off(
    on: bool, thread_reads: bool, spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    # The proc gets both settings: it offers a lane only when on; without thread reads its
    # loop reads every frame (with them, the idle actor thread reads its calls).
    configured(shm_lane=on, thread_reads=thread_reads)
    holder = spawn_procs({"gpus": 1}).spawn("holder", Holder).slice(gpus=0)
    before = lane_frames()
    sizes = [1 << 20, 128 * 1024 - 200, 128 * 1024, 3 << 20, 10, 1 << 20]
    for i, size in enumerate(sizes * 3):
        payload = os.urandom(size)
        assert holder.echo.call_one(payload).get(T) == payload
        assert holder.keep.call_one(bytearray(payload)).get(T) == i + 1
    kept = holder.kept_bytes.call_one().get(T)
    assert [len(k) for k in kept] == sizes * 3
    there = holder.lane_frames.call_one().get(T)
    here = placed_since(before, lane_frames())
    if on:  # requests from here, replies from there: big ones through the rings
        assert len(there) >= 1 and sum(there.values()) >= 3 * 5  # 5 big replies a round
        assert here >= 3 * 2 * 5  # 5 big echoes and 5 big keeps a round
    else:
        assert there == {}
        assert here == 0
