"""Acknowledgements between real processes are rare while calls and replies stream: every
one is a frame that wakes the peer's loop (core/_inbound.py: every ``_ACK_EVERY`` frames,
``Receiver.ack_bytes`` bytes, or ``_ACK_DELAY`` seconds)."""

from __future__ import annotations

import time

import pytest

from regency.core._inbound import _ACK_DELAY, _ACK_EVERY
from regency.core._outbox import Outbox

from ..conftest import SpawnProcs
from .leader_actors import Seq

T = 30


@pytest.mark.slow
def test_a_stream_of_mesh_calls_is_acknowledged_by_time_not_per_64_calls(
    spawn_procs: SpawnProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    seq = spawn_procs(per_host={"gpus": 2}).spawn("ack_seq", Seq)
    assert list(seq.take.call(-1).get(T).values()) == [-1, -1]
    acks: list[int] = []
    real = Outbox.acknowledged

    def counted(self: Outbox, count: int) -> None:
        acks.append(count)
        real(self, count)

    monkeypatch.setattr(Outbox, "acknowledged", counted)
    calls = 300  # 300 call frames to each proc: 4 acknowledgements each at one per 64
    started = time.monotonic()
    for i in range(calls):
        assert list(seq.take.call(i).get(T).values()) == [i, i]
    elapsed = time.monotonic() - started
    assert calls < _ACK_EVERY
    # Each proc acknowledges when its delay runs out after a frame: at most once per delay
    # (and once more for the delay running when the stream started), whatever the load.
    bound = 2 * (elapsed / _ACK_DELAY + 2)
    assert len(acks) <= bound, (len(acks), elapsed)
    assert list(seq.take.call(calls).get(T).values()) == [calls, calls]
