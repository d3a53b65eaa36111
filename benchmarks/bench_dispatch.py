"""The runtime's own cost per message, without sockets or other processes: decoding a frame
and dispatching it (a reply to the waiting call's future, a call to the actor's mailbox), and
encoding and queueing a call on a connected outbox.

CPU time of this thread (``time.thread_time``), best of several rounds: on a loaded machine
wall-clock figures swing by tens of percent, these by a few. Run through ``make bench`` or
``python -m benchmarks.bench_dispatch``.

``python -m benchmarks.bench_dispatch --callgrind [N [PROCS [ctl|proc]]]`` counts the
instructions of a whole ``call_one`` round trip to a sync endpoint of another process, per
thread, with valgrind's callgrind (exact and independent of load; run it twice, the paths
taken vary a little with timing): the controller's side (this script re-run under callgrind: the user thread's
``call_one()`` and ``get()``, and the runtime's loop thread) and the proc's (the proc started
under callgrind: its actor thread, which reads the call, runs it and writes the reply, and its
loop). Counters are zeroed after a warm-up and dumped after ``N`` round trips. With
``PROCS`` > 1 the controller has that many procs (the calls go to the first), as in
``side_by_side``'s tiny round trip; ``ctl`` or ``proc`` measures one side only.

``python -m benchmarks.bench_dispatch --threads [N [PROCS]]`` makes ``N`` round trips and
prints each busy thread's user and system CPU per round trip on both sides, and how many
waits read their own reply, set its connection aside and spun (see :func:`threads`).

The flight recorder's cost (docs/performance.md, "What the always-on introspection costs"):
``--steps`` also counts the steps it touches with it switched off (:func:`no_recorder`), and
``--callgrind N 1 proc --pipelined --no-recorder`` counts a proc whose actor runs without
it (run it beside the same command without the flag).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Generator, Iterator
from typing import Any

from regency.actor import Actor, endpoint
from regency.core import _codec
from regency.core._config import Config
from regency.core._delivery import CONNECTED
from regency.core._inbound import InboundSink
from regency.core._messages import Session
from regency.core._outbox import Outbox
from regency.core._replies import OneReply
from regency.core._runtime import Runtime


class _Cell:
    def enqueue(self, item: Any) -> None:
        pass

    def accept(self, item: Any) -> None:
        pass


class _Connection:
    closed = False
    readable_by_threads = False

    def send_nowait(self, frame: Any, *more: Any) -> None:
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
        rt.ports[5] = OneReply("Echo.ping", (0,), ("a",), frozenset(("a",)))
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
        *[(name, "", _best_us(step), "us cpu") for name, step in proc_steps()],
        *round_trip_cpu(),
    ]


class _Ping(Actor):
    @endpoint
    def ping(self) -> None:
        return None


class _NoToken:
    def run_sync_soon(self, fn: Any) -> None:
        pass  # the writer task's wake-up: not measured here


def proc_steps(metrics: bool = False, tracing: bool = False) -> list[tuple[str, Callable[[], object]]]:
    """The proc's side of a call, step by step, in this process with no loop: a real
    actor cell (its mailbox, its mailbox loop driven as its thread drives it), a real
    inbound session, a connected outbox whose connection drops what it is given, and a
    real socket connection over a socketpair for the write (its burst path: queued for the
    writer task). Each returns the name and one step to repeat. With ``metrics``, the
    runtime keeps metrics (``config.metrics``, its metrics service installed); with
    ``tracing``, it records a trace (a ring of a million events: the oldest go)."""
    import socket

    from regency.core import _metrics
    from regency.core._mailbox import ActorCell
    from regency.core._trace import TraceRing
    from regency.transports._sockets import SocketConnection

    config = Config(metrics=metrics)
    rt = Runtime("p1", secret=b"b" * 32, jobdir="/nowhere", config=config, address="inproc://p1")
    if metrics:
        _metrics.install(rt)
    if tracing:
        rt.trace = TraceRing(1 << 20, rt.env.clock)
    rt.nursery = _Nursery()  # type: ignore[assignment]
    rt.thread_id = -1  # no loop thread: the ACK timer is scheduled, never run
    rt.call_soon = lambda fn: None  # type: ignore[method-assign]
    key, caller = "c.echo.0", "unix:///tmp/c.sock"
    cell = ActorCell(rt, key, "echo", (0, ("gpus",), (1,)), (_Ping, (), {}), None, (caller, "client", "client"))
    rt.actors[key] = cell
    mailbox_loop = cell._main()
    mailbox_loop.send(None)  # __init__; now it waits for its first message
    box = rt.outbox(caller)
    box._machine.state, box._machine.link = CONNECTED, _Connection()
    call = _codec.encode_call(key, "ping", (caller, 5), 0, ("gpus",), (1,), _codec.dumps(((), {})))
    view = memoryview(call if isinstance(call, bytes) else b"".join(call))
    sink, conn = InboundSink(rt), _Connection()
    sink.frame_received(conn, memoryview(_codec.encode(Session("s#1#1", 0))))  # type: ignore[arg-type]
    sink._ack_pending = True  # one ACK on its way: none scheduled per frame
    queue = cell._queue
    item = _codec.decode(view)
    queue.put(item)  # stamped as a queued call is (the flight recorder's queued time)
    queue.get()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    link = SocketConnection(ours, "caller", _NoToken(), 1 << 30)  # type: ignore[arg-type]
    reply = _codec.encode_reply(5, 0, 0, None)
    drain = bytearray(1 << 16)
    waits = _actor_thread_waits(rt, queue, view)

    def loop_reads() -> None:
        sink.frame_received(conn, view)  # type: ignore[arg-type]
        queue.get_nowait()  # (the actor's: not counted above)

    def thread_reads() -> None:
        sink.frame_on_thread(conn, view)  # type: ignore[arg-type]
        queue.get_nowait()

    def handle() -> None:
        mailbox_loop.send(item)
        if len(box._unacked) > 1000:
            box._unacked.clear()

    def write_burst(_peer: socket.socket = theirs) -> None:  # (the peer stays open)
        link.send_nowait(reply)
        if len(link._pending) > 500:
            link._pending.clear()
            link._kicked = False

    unacked = box._machine.unacked

    def send_reply() -> None:
        cell._succeeded(item, None, item.port)  # type: ignore[arg-type,union-attr]
        if len(unacked) > 1000:
            unacked.clear()

    def write_now(_peer: socket.socket = theirs) -> None:
        link._pending.clear()  # (what write_burst left)
        link._kicked, link._last_send = False, 0.0  # no burst: straight to the kernel
        link.send_nowait(reply)
        if _peer.recv_into(drain, 1 << 16) == 0:
            raise RuntimeError("the peer closed")

    return [
        ("proc: a call read by the loop, through the session to the mailbox", loop_reads),
        ("proc: a call read by the actor's thread, to its mailbox", thread_reads),
        ("proc: decode a call", lambda: _codec.decode(view)),
        ("proc: the mailbox's put and get", lambda: (queue.put(item), queue.get())),
        ("proc: the actor thread waits for a call (leads, reads it off a socket, queues, takes it)", waits),
        ("proc: the actor thread runs a call (context, endpoint, reply to the outbox)", handle),
        ("proc: encode a reply of None", lambda: _codec.encode_reply(5, 0, 0, None)),
        ("proc: write a reply in a burst (queued for the writer task)", write_burst),
        ("proc: reply None to the outbox (_succeeded: encode, Outbox.send)", send_reply),
        ("proc: write a reply at once (send_nowait's send, the peer drained)", write_now),
    ]


# -- the flight recorder switched off, for comparisons -----------------------------------


def _bare_main(self: Any) -> Generator[Any, Any, None]:
    """``ActorCell._main`` without the flight recorder and what it feeds (the stall watch's
    ``busy``, traces, metrics): the mailbox loop as it is, less the recorder's lines. Keep
    it so when ``_main`` changes."""
    from regency.core import _messages as M
    from regency.core._mailbox import _NEXT

    alive = self._init()
    while alive:
        item = yield _NEXT
        match item:
            case M.Call():
                rest = self._call(item, item.method, item.port)
                if rest is not None:
                    alive = yield from rest
                del item, rest
            case M.Supervise():
                yield from self._supervise(item.failure)
            case M.Escalate():
                yield from self._die(item.cause, None)
                return
            case M.StopActor():
                yield from self._stop(item.port)
                return
            case M.Abandon():
                return
            case _:
                raise AssertionError(f"unexpected mailbox item {item!r}")


class _NotACall:
    """What the leader's mailbox takes for a call while its stamps are off: nothing is."""


@contextlib.contextmanager
def no_recorder() -> Iterator[None]:
    """In this process, meanwhile: actors made run the mailbox loop without the flight
    recorder (:func:`_bare_main`), and production mailboxes (``LeadingMailbox.put``) stamp
    no call with the time it was queued. For benchmarks only: the recorder is always on."""
    from regency.core import _leader
    from regency.core._mailbox import ActorCell

    if not isinstance(getattr(_leader, "_Call", None), type):
        raise RuntimeError("core/_leader.py no longer names the Call record _Call: update this")
    main, call = ActorCell._main, getattr(_leader, "_Call")  # noqa: B009
    ActorCell._main = _bare_main  # type: ignore[method-assign]
    setattr(_leader, "_Call", _NotACall)  # noqa: B010
    try:
        yield
    finally:
        ActorCell._main = main  # type: ignore[method-assign]
        setattr(_leader, "_Call", call)  # noqa: B010


#: The steps of :func:`proc_steps` the flight recorder touches.
RECORDER_STEPS = ("to its mailbox", "put and get", "runs a call")


def _actor_thread_waits(rt: Runtime, mailbox: Any, call: memoryview) -> Callable[[], object]:
    """An idle actor thread's wait for its next call, as in a proc: ``LeadingMailbox.get``
    finds the mailbox empty, leads the inbound connection (a real socket connection over a
    socketpair, its interest in a private epoll as in the loop's), polls, reads the call
    the peer wrote, hands it to the inbound session, which queues it, and gives the
    connection back; ``get`` then takes it. The thread does not spin (``Leader.spin`` 0:
    the same path whatever the machine's load)."""
    import select
    import socket

    from regency.transports import _sockets
    from regency.transports._sockets import SocketConnection

    assert rt.leader is not None
    rt.leader.spin = 0.0
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = SocketConnection(ours, "caller", _NoToken(), 1 << 30)  # type: ignore[arg-type]
    epoll = select.epoll()
    epoll.register(ours.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
    conn._epoll, conn._baton = epoll, _sockets._LOOP_WAITING  # (as the reader task leaves it)
    conn._rview = memoryview(bytearray(1 << 16))
    sink = InboundSink(rt)
    conn.sink = sink
    sink.frame_received(conn, memoryview(_codec.encode(Session("s#2#1", 0))))  # (now leadable)
    sink._ack_pending = True  # one ACK on its way: none scheduled per frame
    wire = len(call).to_bytes(4, "little") + bytes(call)

    def waits(_peer: socket.socket = theirs) -> None:
        _peer.send(wire)
        mailbox.get()

    return waits


def steps_callgrind(n: int = 3000) -> None:
    """Instructions per step of :func:`proc_steps`, this process counting itself under
    callgrind (re-run under valgrind; exact, independent of load)."""
    if os.environ.get("_BENCH_UNDER_CALLGRIND") != "1":
        if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
            raise SystemExit("--steps needs valgrind (apt-get install valgrind)")
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "_BENCH_UNDER_CALLGRIND": "1", "_BENCH_OUT": f"{tmp}/steps.out",
                   "PYTHONHASHSEED": "0"}
            subprocess.run([
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/steps.out",
                "--dump-instr=no", "-q", sys.executable, "-m", "benchmarks.bench_dispatch",
                "--steps", str(n),
            ], check=True, env=env)
        return
    out, me = os.environ["_BENCH_OUT"], str(os.getpid())

    def count(step: Callable[[], object]) -> int:
        for _ in range(500):
            step()
        _callgrind_control("-z", me)
        for _ in range(n):
            step()
        before = set(glob.glob(out + "*"))
        _callgrind_control("-d", me)
        dump = max(set(glob.glob(out + "*")) - before, key=os.path.getmtime)
        with open(dump) as f:
            text = f.read()
        found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        assert found is not None
        return int(found.group(1)) // n

    print(f"instructions per step ({n} of each, after 500 to warm up)")
    for name, step in proc_steps():
        print(f"  {name}: {count(step)}", flush=True)
    with no_recorder():
        for name, step in proc_steps():
            if any(part in name for part in RECORDER_STEPS):
                print(f"  {name}, no flight recorder: {count(step)}", flush=True)
    for what, kwargs in (("metrics on", {"metrics": True}), ("tracing on", {"tracing": True})):
        for name, step in proc_steps(**kwargs):
            if any(part in name for part in RECORDER_STEPS):
                print(f"  {name}, {what}: {count(step)}", flush=True)


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


def _thread_ticks(pid: int) -> dict[str, tuple[int, int]]:
    """``(utime, stime)`` clock ticks of each thread of ``pid``, by ``tid:name``."""
    ticks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        ticks[f"{tid}:{name}"] = (int(fields[11]), int(fields[12]))
    return ticks


def threads(n: int = 20000, procs_n: int = 1) -> None:
    """``n`` ``call_one`` round trips (to the first of ``procs_n`` procs) from this thread,
    and what each busy thread of both processes spent on them: user and system CPU per
    round trip (``/proc/<pid>/task/*/stat``, whole process lifetimes of the threads, so
    spinning, loop wake-ups and the kernel's part all count), how many waits read their own
    reply (``Leader.led``; the rest the loop read: a wake-up and a hop each), set the
    connection aside for the next call (``Leader.holds``) and spun. Load-robust where wall
    clock is not: run alternating fresh processes of two trees to compare them."""
    from regency.actor import this_host
    from regency.core._controller import current_runtime

    procs = this_host().spawn_procs(per_host={"gpus": procs_n})
    echo = procs.spawn("echo", _Echo)
    echo.ping.call().get()
    one = echo.slice(gpus=0)
    ping = one.ping
    for _ in range(1000):
        ping.call_one().get()
    proc_pid = one.pid.call_one().get()
    leader = current_runtime().leader
    assert leader is not None
    counts = (leader.led, leader.holds, leader.spun)
    proc_led = one.led.call_one().get()
    me = os.getpid()
    before = (_thread_ticks(me), _thread_ticks(proc_pid))
    t0 = time.perf_counter()
    for _ in range(n):
        ping.call_one().get()
    wall = time.perf_counter() - t0
    after = (_thread_ticks(me), _thread_ticks(proc_pid))
    proc_led = one.led.call_one().get() - proc_led - 1  # (less the call that asks)
    led, holds, spun = (b - a for a, b in zip(counts, (leader.led, leader.holds, leader.spun), strict=True))
    hz = os.sysconf("SC_CLK_TCK")
    print(f"{n} round trips ({procs_n} procs; load {os.getloadavg()[0]:.1f}): "
          f"{wall / n * 1e6:.1f} us each; waits that read their reply {led / n:.1%}, "
          f"set it aside {holds / n:.1%}, spun {spun / n:.1%}; calls read by the proc's "
          f"actor thread {proc_led / n:.1%}")
    for side, (start, end) in zip(("controller", "proc"), zip(before, after, strict=True), strict=True):
        for thread, (user, system) in end.items():
            if thread not in start:
                continue
            u = (user - start[thread][0]) / hz / n * 1e6
            k = (system - start[thread][1]) / hz / n * 1e6
            if u + k >= 0.5:
                print(f"  {side} thread {thread}: user {u:.1f} us, system {k:.1f} us a round trip")
    procs.stop().get(30)


class _Switch(Actor):
    @endpoint
    def no_recorder(self) -> None:
        """Actors made in this proc from now on run without the flight recorder."""
        global _switched_off
        if _switched_off is None:
            _switched_off = no_recorder()  # (kept: its generator restores when collected)
            _switched_off.__enter__()


_switched_off: Any = None


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

    @endpoint
    def led(self) -> int:
        """How many waits of this proc's threads read their messages themselves."""
        from regency.core._current import current_runtime_or_none

        rt = current_runtime_or_none()
        return 0 if rt is None or rt.leader is None else rt.leader.led


def _callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def _round_trips(
    side: str,
    n: int,
    out: str,
    procs_n: int = 1,
    pipelined: bool = False,
    recorder: bool = True,
) -> None:
    """One side of :func:`callgrind`: spawn the proc (under callgrind for ``side ==
    "proc"``; with ``procs_n`` > 1, that many procs, the calls going to the first), warm
    up, zero the counters, make ``n`` round trips (``pipelined``: issued 1,000 at a time,
    then awaited), dump. Without ``recorder``, the procs' actor runs without the flight
    recorder (:func:`no_recorder`)."""
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
    procs = this_host().spawn_procs(per_host={"gpus": procs_n}, bootstrap_command=command)
    if not recorder:
        procs.spawn("switch", _Switch).no_recorder.call().get()
    echo = procs.spawn("echo", _Echo)
    echo.ping.call().get()
    echo = echo.slice(gpus=0)
    for _ in range(300):
        echo.ping.call_one().get()
    target = echo.pid.call_one().get() if side == "proc" else os.getpid()
    ping = echo.ping
    if pipelined:
        for f in [ping.call_one() for _ in range(1000)]:
            f.get()
    _callgrind_control("-z", str(target))
    if pipelined:
        for _ in range(0, n, 1000):
            for f in [ping.call_one() for _ in range(1000)]:
                f.get()
    else:
        for _ in range(n):
            ping.call_one().get()
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


def callgrind(
    n: int = 2000,
    procs_n: int = 1,
    sides: tuple[str, ...] = ("proc", "ctl"),
    pipelined: bool = False,
    recorder: bool = True,
) -> None:
    """Print the instructions per round trip of each busy thread on both sides (``sides``;
    ``procs_n`` procs, the calls going to the first: the controller's thread then has that
    many connections it could read); with ``pipelined``, per call of the proc alone while
    calls are issued 1,000 at a time, then awaited (the proc's loop reads calls in bursts
    while its actor thread runs them)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    me = [sys.executable, "-m", "benchmarks.bench_dispatch"]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "REGENCY_ZYGOTE": "0"}  # the proc's own command, not a fork
        mode = (["--pipelined"] if pipelined else []) + ([] if recorder else ["--no-recorder"])
        if "proc" in sides or pipelined:
            subprocess.run(
                [*me, "--side", "proc", str(n), f"{tmp}/proc.out", str(procs_n), *mode],
                check=True, env=env,
            )
        if pipelined:
            proc = _per_thread(f"{tmp}/proc.out.1-*", n)
            bare = "" if recorder else ", no flight recorder"
            print(f"instructions per pipelined call_one in the proc ({n} calls{bare}), by thread")
            print(f"  proc (actor thread, then the proc's loop): {proc}, in all {sum(proc)}")
            return
        if "ctl" in sides:
            subprocess.run([
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/ctl.out",
                "--dump-instr=no", "--separate-threads=yes", "-q",
                *me, "--side", "ctl", str(n), f"{tmp}/none", str(procs_n),
            ], check=True)
        ctl, proc = _per_thread(f"{tmp}/ctl.out.1-*", n), _per_thread(f"{tmp}/proc.out.1-*", n)
    print(f"instructions per call_one round trip ({n} trips, {procs_n} procs), by thread, "
          "busiest first")
    if "ctl" in sides:
        print(f"  controller (user thread, then the runtime's loop): {ctl}, in all {sum(ctl)}")
    if "proc" in sides:
        print(f"  proc (actor thread, then the proc's loop): {proc}, in all {sum(proc)}")


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a in ("--pipelined", "--no-recorder")]
    argv = [a for a in sys.argv if a not in flags]
    if argv[1:2] == ["--side"]:
        _round_trips(
            argv[2], int(argv[3]), argv[4], int(argv[5]),
            pipelined="--pipelined" in flags, recorder="--no-recorder" not in flags,
        )
    elif argv[1:2] == ["--threads"]:
        # --threads [N [PROCS]]
        threads(int(argv[2]) if len(argv) > 2 else 20000, int(argv[3]) if len(argv) > 3 else 1)
    elif argv[1:2] == ["--steps"]:
        steps_callgrind(int(argv[2]) if len(argv) > 2 else 3000)
    elif argv[1:2] == ["--callgrind"]:
        # --callgrind [N [PROCS [ctl|proc]]] [--pipelined] [--no-recorder]
        rest = argv[2:]
        callgrind(
            int(rest[0]) if rest else 2000,
            int(rest[1]) if len(rest) > 1 else 1,
            (rest[2],) if len(rest) > 2 else ("proc", "ctl"),
            pipelined="--pipelined" in flags,
            recorder="--no-recorder" not in flags,
        )
    else:
        for figure, _target, value, unit in run():
            print(f"{figure}: {value:.2f} {unit}")
