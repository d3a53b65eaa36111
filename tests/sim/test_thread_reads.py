"""The simulator runs the code a production thread runs when it reads its own reply or its
actor's next call (core/_leader.py, on the simulation's lockstep I/O: sim/_leading.py): a
thread that waits leads the simulated connections and hands each frame to
``InboundSink.frame_on_thread``, and what it declines goes the loop's way."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from regency.actor import Actor, endpoint
from regency.core import _codec
from regency.core._inbound import InboundSink
from regency.core._messages import Call
from regency.sim import simulate


class Seq(Actor):
    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    def take(self, i: int) -> int:
        self.log.append(i)
        return i

    @endpoint
    def taken(self) -> list[int]:
        return self.log


class AsyncOnly(Actor):
    @endpoint
    async def ping(self) -> str:
        return "pong"


def program(hosts: Any) -> tuple[list[int], list[int], str]:
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    seq = procs.slice(hosts=0).spawn("seq", Seq)
    futures = [seq.take.call_one(i) for i in range(50)]
    answers = [f.get() for f in futures]
    pong = procs.slice(hosts=1).spawn("async_only", AsyncOnly).ping.call_one().get()
    return answers, seq.taken.call_one().get(), pong


def test_frames_go_through_the_thread_path_in_a_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: Counter[str] = Counter()
    original = InboundSink.frame_on_thread

    def observed(self: InboundSink, conn: Any, frame: memoryview) -> bool:
        kind = "reply" if _codec.is_compact_reply(frame) else "other"
        if kind == "reply":
            handler = self._rt.ports.get(_codec.compact_reply_port(frame))
            if not getattr(handler, "on_any_thread", False):
                kind = "loop-only reply"  # e.g. a proc's stop acknowledgements: the loop's
        if kind == "other" and frame[:4] != _codec.SESSION_MARK:
            try:
                msg = _codec.decode(frame)
            except ValueError:
                msg = None
            kind = "call" if type(msg) is Call else "other"
        result = original(self, conn, frame)
        taken[f"{kind} {'taken' if result else 'declined'}"] += 1
        return result

    monkeypatch.setattr(InboundSink, "frame_on_thread", observed)
    result = simulate(program, seed=7, hosts=2)
    assert result.value == (list(range(50)), list(range(50)), "pong")
    assert taken["reply taken"] >= 50  # every compact reply
    # Calls to an actor with a thread, read by that thread while it waits for its next one
    # (as in production, one that comes before the thread waits is read by the loop).
    assert taken["call taken"] >= 45
    # Spawns, acknowledgements... that a leading thread meets: the loop's. (A call to an
    # all-async actor, whose proc has no thread to lead, reaches its loop directly.)
    assert taken["other declined"] >= 1
    assert taken["reply declined"] == 0


class Bulk(Actor):
    @endpoint
    def echo(self, data: bytes) -> bytes:
        return data


def bulk_program(hosts: Any) -> list[bool]:
    bulk = hosts.spawn_procs(per_host={"gpus": 1}).spawn("bulk", Bulk)
    sizes = [10, 64 * 1024, 1 << 20] * 4
    return [bulk.echo.call_one(bytes([n % 251]) * n).get() == bytes([n % 251]) * n for n in sizes]


def test_big_replies_with_out_of_band_parts_are_taken_by_the_waiting_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reply carrying a big ``bytes`` out of band (the envelope layout) is read by the
    thread that waits for it, like a compact reply (it used to go the loop's way: a wake-up
    and a hop more per big reply)."""
    taken: Counter[bool] = Counter()
    original = InboundSink.frame_on_thread

    def observed(self: InboundSink, conn: Any, frame: memoryview) -> bool:
        result = original(self, conn, frame)
        if len(frame) >= 64 * 1024 and _codec.bulk_reply_port(frame) is not None:
            taken[result] += 1
        return result

    monkeypatch.setattr(InboundSink, "frame_on_thread", observed)
    result = simulate(bulk_program, seed=3, hosts=1)
    assert result.value == [True] * 12
    assert taken == Counter({True: 8})
