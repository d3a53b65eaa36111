"""The controller's own CPU for one endpoint call, without sockets or other processes:
issuing it (arguments, reply handler, port, one CALL frame per rank encoded and handed to a
connected outbox) and taking its replies (decode, port, reply handler, future), for
``call_one`` and for ``call`` over a 4-rank mesh (the pipelined and mesh figures of docs/performance.md).

CPU time of this thread, best of several rounds (``benchmarks/bench_dispatch.py`` measures
the parts one by one). Run ``python -m benchmarks.bench_fanout``; ``--callgrind N [one|four]``
runs N calls of each kind (or of one) once, for ``valgrind --tool=callgrind``: instruction
counts do not move with the machine's load (docs/performance.md); ``send`` and ``reply`` are
the two halves of ``one`` (``send4``: the send half of ``four``; ``broadcast4``: a
``broadcast()`` to 4 ranks, the send path alone), the reply as a thread that read it takes it (the inbound session's
``frame_on_thread``). ``--callgrind-mesh [N]`` counts the controller's instructions per call
over a 4-proc mesh of real procs, its connections set aside between calls
(``Leader.holding``, the default) and given back. ``--mesh-cpu [N [BLOCKS]]`` runs blocks of
N calls over a 4-proc mesh and prints, per call, the CPU and the voluntary/involuntary
context switches of each thread of the controller and of the procs (from ``/proc``).
"""

from __future__ import annotations

import contextvars
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

from benchmarks.bench_dispatch import _callgrind_control, _per_thread
from regency.core import _codec
from regency.core._actor_mesh import ActorMesh
from regency.core._config import Config
from regency.core._current import _runtime_var
from regency.core._delivery import CONNECTED
from regency.core._endpoint import Actor, endpoint
from regency.core._inbound import InboundSink
from regency.core._messages import Session
from regency.core._outbox import Outbox
from regency.core._replies import OneReply
from regency.core._runtime import Runtime
from regency.core._shape import Shape

#: Where a compact reply frame carries its port id (``_codec``: u32 mark, then u64 port id).
_PORT_ID = struct.Struct("<Q")


class Echo(Actor):
    @endpoint
    def ping(self, x: object = None) -> object:
        return x


class _Connection:
    closed = False

    def send_nowait(self, frame: Any, answer: bool = False) -> None:
        pass


def _setup(ranks: int) -> tuple[Runtime, ActorMesh[Echo], list[Outbox]]:
    rt = Runtime("c1", secret=b"b" * 32, jobdir="/nowhere", config=Config(), address="inproc://c1")
    _runtime_var.set(rt)
    procs = tuple((f"c1.p{i}", f"unix:///tmp/p{i}.sock") for i in range(ranks))
    boxes = []
    for _, address in procs:
        box = Outbox(rt, address)
        box._machine.state, box._machine.link = CONNECTED, _Connection()
        rt.outboxes[address] = box
        boxes.append(box)
    mesh: ActorMesh[Echo] = ActorMesh(
        "c1.echo", "echo", Echo, procs, Shape.full(("gpus",), (ranks,))
    )
    return rt, mesh, boxes


def _replies(ranks: int) -> Callable[[int], list[memoryview]]:
    """The reply frames of one call to ``ranks`` ranks, for a given port (encoded once: the
    proc's work is not the controller's; only the port id is written in per call)."""
    frames = [bytearray(_codec.encode_reply(0, i, 0, None)) for i in range(ranks)]  # type: ignore[arg-type]
    views = [memoryview(f) for f in frames]

    def for_port(port_id: int) -> list[memoryview]:
        for frame in frames:
            _PORT_ID.pack_into(frame, 4, port_id)
        return views

    return for_port


def call_one_and_reply() -> Callable[[], None]:
    """One ``call_one``: issued, then its reply taken (as the thread in ``get()`` does)."""
    rt, mesh, boxes = _setup(1)
    ping = mesh.slice(gpus=0).ping
    replies = _replies(1)

    def once() -> None:
        fut = ping.call_one()
        for frame in replies(next(iter(rt.ports))):
            rt.on_frame(frame)
        assert fut.done()
        for box in boxes:
            box._unacked.clear()

    return once


def call_one_issued() -> Callable[[], None]:
    """The send half of :func:`call_one_and_reply`: ``call_one()`` up to the outbox's
    write (its port is then dropped unanswered)."""
    rt, mesh, boxes = _setup(1)
    ping = mesh.slice(gpus=0).ping
    ports, unacked = rt.ports, boxes[0]._unacked

    def once() -> None:
        ping.call_one()
        ports.clear()
        unacked.clear()

    return once


def call_4_issued() -> Callable[[], None]:
    """The send half of :func:`call_4_and_replies`: ``call()`` over 4 ranks up to the
    outboxes' writes (its port is then dropped unanswered)."""
    rt, mesh, boxes = _setup(4)
    ping = mesh.ping
    ports, unacked = rt.ports, [box._machine.unacked for box in boxes]

    def once() -> None:
        ping.call()
        ports.clear()
        for frames in unacked:
            frames.clear()

    return once


def broadcast_4() -> Callable[[], None]:
    """``broadcast()`` over 4 ranks: the send path alone (no reply port, no future), from
    the endpoint to the outboxes' writes."""
    _, mesh, boxes = _setup(4)
    ping = mesh.ping
    unacked = [box._machine.unacked for box in boxes]

    def once() -> None:
        ping.broadcast()
        for frames in unacked:
            frames.clear()

    return once


def reply_read_on_thread() -> Callable[[], None]:
    """The receive half, as the thread in ``get()`` takes a reply it read: the inbound
    session's ``frame_on_thread``, decoding, the port, the future (here its own handler)."""
    rt, mesh, _ = _setup(1)
    rt.thread_id = threading.get_ident()  # the acknowledgement timer: started at once
    rt.nursery = _Nursery()  # type: ignore[assignment]
    sink, conn = InboundSink(rt), _Connection()
    sink.frame_received(conn, memoryview(_codec.encode(Session("s#1#1", 0))))  # type: ignore[arg-type]
    route = mesh.slice(gpus=0)._route()
    replies = _replies(1)

    def once() -> None:
        fut = OneReply("c1.echo.ping", route.one_rank[0], route.one_address[0], route.dest_sets[0])
        port_id = rt.open_port(fut)[1]
        sink.frame_on_thread(conn, replies(port_id)[0])  # type: ignore[arg-type]
        assert fut.done()

    return once


class _Nursery:
    def start_soon(self, *args: Any, **kwargs: Any) -> None:
        pass  # the batched acknowledgement's timer: not measured here


def call_4_and_replies() -> Callable[[], None]:
    """One ``call`` over 4 ranks: issued, then its 4 replies taken, folded into a ValueMesh."""
    rt, mesh, boxes = _setup(4)
    ping = mesh.ping
    replies = _replies(4)

    def once() -> None:
        fut = ping.call()
        for frame in replies(next(iter(rt.ports))):
            rt.on_frame(frame)
        assert fut.done()
        for box in boxes:
            box._unacked.clear()

    return once


def _best_us(fn: Callable[[], object], n: int = 5000, rounds: int = 7) -> float:
    fn()
    return min(timeit.repeat(fn, number=n, repeat=rounds, timer=time.thread_time)) / n * 1e6


def run() -> list[tuple[str, str, float, str]]:
    """The figures; the runtimes made here are current only inside (``make bench`` goes on
    with the real one)."""
    return contextvars.copy_context().run(
        lambda: [
            ("call_one issued and its reply taken", "", _best_us(call_one_and_reply()), "us cpu"),
            ("call_one issued (to the outbox's write)", "", _best_us(call_one_issued()), "us cpu"),
            (
                "a call_one's reply taken on the thread that read it",
                "",
                _best_us(reply_read_on_thread()),
                "us cpu",
            ),
            (
                "call over 4 ranks issued and its 4 replies taken",
                "",
                _best_us(call_4_and_replies()),
                "us cpu",
            ),
        ]
    )


class _Pinger(Actor):
    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _mesh_calls(n: int, holding: bool) -> None:
    """Under callgrind (:func:`callgrind_mesh`): ``n`` calls over a 4-proc mesh of real
    procs, the controller's connections set aside between them (``Leader.holding``) or
    given back; the counters cover the calls only."""
    import regency
    from regency.actor import this_host
    from regency.core._controller import current_runtime

    # Under valgrind the controller runs some 50x slower: nothing may time out meanwhile.
    regency.configure(heartbeat_timeout=600.0, spawn_timeout=600.0, delivery_timeout=600.0)
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    pinger = procs.spawn("pinger", _Pinger)
    leader = current_runtime().leader
    assert leader is not None
    leader.holding = holding
    for _ in range(200):
        pinger.ping.call().get()
    _callgrind_control("-z", str(os.getpid()))
    for _ in range(n):
        pinger.ping.call().get()
    _callgrind_control("-d", str(os.getpid()))
    procs.stop().get(60)


def callgrind_mesh(n: int = 1000) -> None:
    """Instructions per 4-proc mesh call of the controller's threads (the user thread, the
    loop), with its connections set aside between calls and without. The controller runs
    under callgrind (so slowly that every reply is in before it polls: this counts the
    work of a call, not its waits); the procs run as usual."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--callgrind-mesh needs valgrind (apt-get install valgrind)")
    me = [sys.executable, "-m", "benchmarks.bench_fanout"]
    for mode in ("give_back", "hold"):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/ctl.out",
                "--dump-instr=no", "--separate-threads=yes", "-q",
                *me, "--mesh-side", mode, str(n),
            ], check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            threads = _per_thread(f"{tmp}/ctl.out.1-*", n)
        print(f"{mode:9s}: instructions per mesh call by controller thread {threads[:2]}, in all {sum(threads)}")


def _thread_stats(pid: int) -> dict[str, tuple[int, int, int]]:
    """CPU nanoseconds and voluntary/involuntary context switches of each thread of ``pid``
    (by thread name; same-named threads summed), from ``/proc``."""
    out: dict[str, tuple[int, int, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        vol = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        key = "main" if tid == str(pid) else name
        c, v, i = out.get(key, (0, 0, 0))
        out[key] = (c + cpu, v + vol, i + invol)
    return out


def mesh_cpu(n: int = 2000, blocks: int = 5) -> None:
    """Where a 4-proc mesh call's CPU goes: ``blocks`` blocks of ``n`` calls over a mesh of 4
    real procs; per call, the CPU and the voluntary/involuntary context switches of the
    controller's threads and of the 4 procs' threads (summed over the procs), from
    ``/proc/<pid>/task/*``; the median block. Measures under whatever load the machine has:
    say it with the figures."""
    import statistics

    from regency.actor import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    pinger = procs.spawn("pinger", _Pinger)
    pids = list(pinger.pid.call().get(30).values())
    for _ in range(500):
        pinger.ping.call().get()
    rows: dict[str, list[tuple[float, float, float]]] = {}
    walls = []
    for _ in range(blocks):
        before = {("ctl", k): v for k, v in _thread_stats(os.getpid()).items()}
        for pid in pids:
            for k, v in _thread_stats(pid).items():
                c0, v0, i0 = before.get(("procs", k), (0, 0, 0))
                before["procs", k] = (c0 + v[0], v0 + v[1], i0 + v[2])
        t0 = time.perf_counter()
        for _ in range(n):
            pinger.ping.call().get()
        walls.append((time.perf_counter() - t0) / n * 1e6)
        after = {("ctl", k): v for k, v in _thread_stats(os.getpid()).items()}
        for pid in pids:
            for k, v in _thread_stats(pid).items():
                c0, v0, i0 = after.get(("procs", k), (0, 0, 0))
                after["procs", k] = (c0 + v[0], v0 + v[1], i0 + v[2])
        for key, (c1, v1, i1) in after.items():
            c0, v0, i0 = before.get(key, (0, 0, 0))
            rows.setdefault(f"{key[0]} {key[1]}", []).append(
                ((c1 - c0) / n / 1000, (v1 - v0) / n, (i1 - i0) / n)
            )
    procs.stop().get(60)
    print(f"load {os.getloadavg()[0]:.2f}; wall per call: median {statistics.median(walls):.0f} us "
          f"({min(walls):.0f}-{max(walls):.0f}) over {blocks} blocks of {n}")
    print(f"{'thread (per call, median block)':32s} {'CPU us':>8s} {'vol':>7s} {'invol':>7s}")
    for name, values in sorted(rows.items()):
        cpu = statistics.median(v[0] for v in values)
        if cpu < 0.05:
            continue
        vol = statistics.median(v[1] for v in values)
        invol = statistics.median(v[2] for v in values)
        print(f"{name:32s} {cpu:8.1f} {vol:7.3f} {invol:7.3f}")


if __name__ == "__main__":
    if "--mesh-cpu" in sys.argv:
        tail = sys.argv[sys.argv.index("--mesh-cpu") + 1 :]
        mesh_cpu(*(int(t) for t in tail[:2]))
    elif "--mesh-side" in sys.argv:
        tail = sys.argv[sys.argv.index("--mesh-side") + 1 :]
        _mesh_calls(int(tail[1]), tail[0] == "hold")
    elif "--callgrind-mesh" in sys.argv:
        tail = sys.argv[sys.argv.index("--callgrind-mesh") + 1 :]
        callgrind_mesh(int(tail[0]) if tail else 1000)
    elif "--callgrind" in sys.argv:
        tail = sys.argv[sys.argv.index("--callgrind") + 1 :]
        n, kinds = int(tail[0]), tail[1:] or ["one", "four"]
        for kind in kinds:
            once = {
                "one": call_one_and_reply,
                "send": call_one_issued,
                "send4": call_4_issued,
                "broadcast4": broadcast_4,
                "reply": reply_read_on_thread,
                "four": call_4_and_replies,
            }[kind]()
            for _ in range(n):  # (the runtime ``once`` made is the current one)
                once()
    else:
        for figure, _target, value, unit in run():
            print(f"{figure}: {value:.2f} {unit}")
