"""The runtime's own cost per message, without sockets or other processes: decoding a frame
and dispatching it (a reply to the waiting call's future, a call to the actor's mailbox), and
encoding and queueing a call on a connected outbox.

CPU time of this thread (``time.thread_time``), best of several rounds: on a loaded machine
wall-clock figures swing by tens of percent, these by a few. Run through ``make bench`` or
``python -m benchmarks.bench_dispatch``.

``python -m benchmarks.bench_dispatch --callgrind [N]`` counts the instructions of a whole
``call_one`` round trip to a sync endpoint of another process, per thread, with valgrind's
callgrind (exact and independent of load; run it twice, the paths taken vary a little with
timing): the controller's side (this script re-run under callgrind: the user thread's
``call_one()`` and ``get()``, and the runtime's loop thread) and the proc's (the proc started
under callgrind: its actor thread, which reads the call, runs it and writes the reply, and its
loop). Counters are zeroed after a warm-up and dumped after ``N`` round trips.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

from regency.actor import Actor, endpoint
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
    call = _codec.encode_call("c1.echo.0", "ping", port, 0, ("gpus",), (1,), args)
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
            "c1.echo.0", "ping", port, 0, ("gpus",), (1,), args)), "us cpu"),
        ("decode a call read by the actor's thread", "", _best_us(
            lambda: _codec.decode_call_to(call_view, wanted)), "us cpu"),
        ("encode a reply of None", "", _best_us(lambda: _codec.encode_reply(5, 0, 0, None)), "us cpu"),
        *round_trip_cpu(),
    ]


def _wanted(actor: str) -> bool:
    return True


wanted = _wanted


def round_trip_cpu(n: int = 2000, rounds: int = 5) -> list[tuple[str, str, float, str]]:
    """The whole of each side of a ``call_one`` round trip to a sync endpoint of another
    process, as CPU time of the thread that does it (best of ``rounds`` means of ``n``):
    the user thread's ``call_one()`` (arguments, future, port, encode, outbox, the socket
    write) and ``get()`` (taking the sockets over, ``poll``, reading, decoding, resolving,
    setting them aside for the next wait), and the proc's actor thread per call (the same reading, the mailbox,
    the endpoint, the reply's encoding and write). A thread that spins before it sleeps
    (``core/_spin.py``, when a CPU is free) counts its spinning here too."""
    from regency.actor import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    echo = procs.spawn("echo", _Echo)
    ping = echo.ping
    for _ in range(1000):
        ping.call_one().get()
    clock = time.thread_time
    sends, gets, procs_cpu = [], [], []
    for _ in range(rounds):
        echo.cpu_start.call_one().get()
        send = get = 0.0
        for _ in range(n):
            t0 = clock()
            fut = ping.call_one()
            t1 = clock()
            fut.get()
            t2 = clock()
            send += t1 - t0
            get += t2 - t1
        procs_cpu.append(echo.cpu_since_start.call_one().get() / n * 1e6)
        sends.append(send / n * 1e6)
        gets.append(get / n * 1e6)
    procs.stop().get(30)
    return [
        ("call_one(): the whole send path, socket write included", "", min(sends), "us cpu"),
        ("get(): the whole receive path (poll, read, decode, resolve)", "", min(gets), "us cpu"),
        ("the proc's actor thread per call (read, run, reply)", "", min(procs_cpu), "us cpu"),
    ]


class _Echo(Actor):
    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def cpu_start(self) -> None:
        self._cpu = time.thread_time()

    @endpoint
    def cpu_since_start(self) -> float:
        return time.thread_time() - self._cpu

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def _round_trips(side: str, n: int, out: str) -> None:
    """One side of :func:`callgrind`: spawn the proc (under callgrind for ``side ==
    "proc"``), warm up, zero the counters, make ``n`` round trips, dump."""
    import regency
    from regency.actor import this_host
    from regency.core._bootstrap_command import BOOTSTRAP_ARGS, BootstrapCommand

    # Under valgrind a process runs some 50x slower: no heartbeat may time out meanwhile.
    regency.configure(heartbeat_timeout=600.0, spawn_timeout=600.0, delivery_timeout=600.0)
    command = None
    if side == "proc":
        command = BootstrapCommand(shutil.which("valgrind") or "valgrind", args=[
            "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
            "--separate-threads=yes", sys.executable, *BOOTSTRAP_ARGS,
        ])
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=command)
    echo = procs.spawn("echo", _Echo)
    for _ in range(300):
        echo.ping.call_one().get()
    target = echo.pid.call_one().get() if side == "proc" else os.getpid()
    _callgrind_control("-z", str(target))
    for _ in range(n):
        echo.ping.call_one().get()
    _callgrind_control("-d", str(target))


def _per_thread(pattern: str, n: int) -> list[int]:
    """Instructions per round trip of each thread's dump (largest first)."""
    counts = []
    for path in glob.glob(pattern):
        with open(path) as f:
            text = f.read()
        found = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(
            r"^totals:\s+(\d+)", text, re.M
        )
        if found and int(found.group(1)):
            counts.append(int(found.group(1)) // n)
    return sorted(counts, reverse=True)


def callgrind(n: int = 2000) -> None:
    """Print the instructions per round trip of each busy thread on both sides."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    me = [sys.executable, "-m", "benchmarks.bench_dispatch"]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "REGENCY_ZYGOTE": "0"}  # the proc's own command, not a fork
        subprocess.run([*me, "--side", "proc", str(n), f"{tmp}/proc.out"], check=True, env=env)
        subprocess.run([
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/ctl.out",
            "--dump-instr=no", "--separate-threads=yes", "-q",
            *me, "--side", "ctl", str(n), f"{tmp}/none",
        ], check=True)
        ctl, proc = _per_thread(f"{tmp}/ctl.out.1-*", n), _per_thread(f"{tmp}/proc.out.1-*", n)
    print(f"instructions per call_one round trip ({n} trips), by thread, busiest first")
    print(f"  controller (user thread, then the runtime's loop): {ctl}, in all {sum(ctl)}")
    print(f"  proc (actor thread, then the proc's loop): {proc}, in all {sum(proc)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        _round_trips(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1:2] == ["--callgrind"]:
        callgrind(int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
    else:
        for figure, _target, value, unit in run():
            print(f"{figure}: {value:.2f} {unit}")
