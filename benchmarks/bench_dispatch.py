"""The runtime's own cost per message, without sockets or other processes: decoding a frame
and dispatching it (a reply to the waiting call's future, a call to the actor's mailbox), and
encoding and queueing a call on a connected outbox.

CPU time of this thread (``time.thread_time``), best of several rounds: on a loaded machine
wall-clock figures swing by tens of percent, these by a few. Run through ``make bench`` or
``python -m benchmarks.bench_dispatch``.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from typing import Any

from regency.core import _codec
from regency.core._config import Config
from regency.core._delivery import CONNECTED
from regency.core._future import Future
from regency.core._inbound import InboundSink
from regency.core._messages import Session
from regency.core._outbox import Outbox
from regency.core._replies import OneReply
from regency.core._runtime import Runtime


class _Cell:
    def enqueue(self, item: Any) -> None:
        pass


class _Connection:
    closed = False

    def send_nowait(self, frame: Any) -> None:
        pass


class _Nursery:
    def start_soon(self, *args: Any, **kwargs: Any) -> None:
        pass  # the batched ACK timer: not measured here


def _best_us(fn: Callable[[], object], n: int = 20000, rounds: int = 9) -> float:
    return min(timeit.repeat(fn, number=n, repeat=rounds, timer=time.thread_time)) / n * 1e6


def run() -> list[tuple[str, str, float, str]]:
    rt = Runtime("c1", secret=b"b" * 32, jobdir="/nowhere", config=Config(), address="inproc://c1")
    rt.actors["c1.echo.0"] = _Cell()  # type: ignore[assignment]
    reply = memoryview(_codec.encode_reply(5, 0, 0, 42))  # type: ignore[arg-type]
    args = _codec.dumps(((), {}))
    port = ("unix:///tmp/c1.sock", 5)
    call = _codec.encode_call("c1.echo.0", "ping", port, 0, ["gpus"], [1], args)
    call_view = memoryview(call if isinstance(call, bytes) else b"".join(call))

    def receive_reply() -> None:
        fut: Future[Any] = Future()
        rt.ports[5] = OneReply(fut, "Echo.ping", (0,), ("a",), frozenset(("a",)))
        rt.on_frame(reply)

    rt.nursery = _Nursery()  # type: ignore[assignment]
    sink, conn = InboundSink(rt), _Connection()
    sink.frame_received(conn, memoryview(_codec.encode(Session("s#1#1", 0))))  # type: ignore[arg-type]

    box = Outbox(rt, "unix:///tmp/p.sock")
    box._machine.state, box._machine.link = CONNECTED, _Connection()
    frame = bytes(call_view)

    def send_frame() -> None:
        box.send(frame)
        if len(box._unacked) > 1000:
            box._unacked.clear()

    return [
        ("receive a reply (decode, port, future)", "", _best_us(receive_reply), "us cpu"),
        ("receive a call (decode, to the mailbox)", "", _best_us(lambda: rt.on_frame(call_view)), "us cpu"),
        (
            "a call frame through the inbound session",
            "",
            _best_us(lambda: sink.frame_received(conn, call_view)),  # type: ignore[arg-type]
            "us cpu",
        ),
        ("send a frame on a connected outbox", "", _best_us(send_frame), "us cpu"),
        ("encode a call", "", _best_us(lambda: _codec.encode_call(
            "c1.echo.0", "ping", port, 0, ["gpus"], [1], args)), "us cpu"),
    ]


if __name__ == "__main__":
    for figure, _target, value, unit in run():
        print(f"{figure}: {value:.2f} {unit}")
