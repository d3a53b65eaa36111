"""Casting trees. ``python -m benchmarks.bench_casting [--sim] [--real]``.

* frames the controller sends per ``broadcast`` to 1,024 simulated procs, and receives per
  ``call()`` over them, with the tree (the default) and with the direct path
  (``cast_tree_min`` above the mesh's size);
* real time of 10 ``call()``s over 4,096 simulated procs (512 hosts x 8), both ways;
* real time of one ``call()`` over N simulated procs, both ways (where the tree starts to
  pay: what ``cast_tree_min`` is set from);
* ``call()`` over 16 real procs on 4 network-namespace hosts x 4, both ways;
* (``--big``) 4,096 and 16,384 simulated procs, a forwarder crashing mid-broadcast.

Frames are counted by wrapping ``Outbox.send`` for the duration of one operation: every frame
a runtime hands to its outbox towards (or from) the controller, replies, tree
acknowledgements and heartbeats included; the delivery layer's own ACK frames are not.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SECRET = "regency-benchmark-job-secret"
os.environ.setdefault("REGENCY_SECRET", SECRET)

import regency  # noqa: E402
import regency.actor  # noqa: E402
from regency.actor import Actor, endpoint  # noqa: E402
from regency.core import _outbox  # noqa: E402
from regency.core._config import overridden  # noqa: E402
from regency.core._controller import current_runtime  # noqa: E402
from regency.sim._cluster import simulate  # noqa: E402

Row = tuple[str, str, float, str]
DIRECT = 1 << 30  # a cast_tree_min no mesh reaches


class Node(Actor):
    @endpoint
    def rank(self) -> int:
        return 1

    @endpoint
    def poke(self, value: int) -> None:
        return None


class Quick(Actor):
    """All-async endpoints: driven by trio tasks, no thread per actor (big simulations)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    async def rank(self) -> int:
        return 1

    @endpoint
    async def add(self, value: int) -> None:
        self.seen.append(value)

    @endpoint
    async def seen_count(self) -> int:
        return len(self.seen)


class Threaded(Actor):
    """Sync endpoints: a (lockstep) thread per actor, no asyncio loop, so no descriptors per
    simulated proc (16,384 procs with async endpoints exceed this machine's 20,000)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def rank(self) -> int:
        return 1

    @endpoint
    def add(self, value: int) -> None:
        self.seen.append(value)

    @endpoint
    def seen_count(self) -> int:
        return len(self.seen)


@contextmanager
def counting(address: Callable[[], str]) -> Iterator[dict[str, int]]:
    """Count frames handed to outboxes by the controller (``sent``) and to the controller
    (``received``) while the block runs."""
    counts = {"sent": 0, "received": 0}
    original = _outbox.Outbox.send
    me = address()

    def send(self: _outbox.Outbox, frame: Any, *rest: Any) -> None:
        if self._rt.address == me:
            counts["sent"] += 1
        elif self.address == me:
            counts["received"] += 1
        original(self, frame, *rest)

    _outbox.Outbox.send = send  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        _outbox.Outbox.send = original  # type: ignore[method-assign]


def _frames(tree_min: int) -> tuple[int, int]:
    def program(hosts: Any) -> tuple[int, int]:
        regency.configure(cast_tree_min=tree_min)
        nodes = hosts.spawn_procs(per_host={"gpus": 8}).spawn("nodes", Node)
        nodes.rank.call().get()  # connections up
        with counting(lambda: current_runtime().address) as b:
            nodes.poke.broadcast(1)
            nodes.rank.call().get()  # the broadcast has surely landed
        with counting(lambda: current_runtime().address) as c:
            total = sum(nodes.rank.call().get().values())
        assert total == 1024, total
        # The broadcast's own frames: what the controller sent minus the call's.
        return b["sent"] - c["sent"], c["received"]

    # simulate() restores the configuration the program changed.
    return simulate(program, seed=1, hosts=128).value  # type: ignore[no-any-return]


def _ten_calls(tree_min: int, hosts: int = 512) -> float:
    def program(mesh: Any) -> float:
        regency.configure(cast_tree_min=tree_min)
        nodes = mesh.spawn_procs(per_host={"gpus": 8}).spawn("nodes", Quick)
        nodes.rank.call().get()
        start = time.perf_counter()
        for _ in range(10):
            assert sum(nodes.rank.call().get().values()) == hosts * 8
        return time.perf_counter() - start

    return simulate(program, seed=1, hosts=hosts).value  # type: ignore[no-any-return]


def _one_call(procs: int, tree_min: int) -> float:
    def program(mesh: Any) -> float:
        regency.configure(cast_tree_min=tree_min)
        nodes = mesh.spawn_procs(per_host={"gpus": 8}).spawn("nodes", Node)
        nodes.rank.call().get()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            nodes.rank.call().get()
            times.append(time.perf_counter() - start)
        return min(times)

    return simulate(program, seed=1, hosts=procs // 8).value  # type: ignore[no-any-return]


def _crash_mid_broadcast(hosts: int, cls: type[Actor]) -> tuple[int, int, float]:
    """``hosts`` x 8 simulated procs: a broadcast, and the forwarder at position 1 (it
    forwards to 63 procs below it with fan-out 16) crashes as it leaves. Returns (procs
    that got it, procs alive, real seconds of the whole run)."""
    from regency.sim._cluster import current

    def program(mesh: Any) -> tuple[int, int]:
        procs = mesh.spawn_procs(per_host={"gpus": 8})
        nodes = procs.spawn("nodes", cls)
        nodes.rank.call().get()
        nodes.add.broadcast(1)
        current().crash_proc(procs.slice(hosts=0, gpus=1))
        got = sum(nodes.slice(hosts=slice(1, None)).seen_count.call().get().values())
        got += nodes.slice(hosts=0, gpus=0).seen_count.call_one().get()
        got += sum(nodes.slice(hosts=0, gpus=slice(2, None)).seen_count.call().get().values())
        return got, len(nodes) - 1

    start = time.perf_counter()
    got, alive = simulate(program, seed=1, hosts=hosts).value
    return got, alive, time.perf_counter() - start


def big_rows() -> list[Row]:
    """4,096 and 16,384 simulated procs with a forwarder crashing mid-broadcast."""
    regency.actor.unhandled_fault_hook = lambda failure: None
    rows: list[Row] = []
    sizes = [int(a) for a in sys.argv[2:]] if len(sys.argv) > 2 else [512, 2048]
    for hosts in sizes:
        got, alive, took = _crash_mid_broadcast(hosts, Quick if hosts * 8 <= 4096 else Threaded)
        rows.append((f"{hosts * 8} procs, forwarder crashes mid-broadcast: procs that got it",
                     f"= {alive}", got, "procs"))
        rows.append(("  real time of the whole run (spawn, call, broadcast, crash, 3 calls)",
                     "", took, "s real"))
        _show(rows[-2:])
    return rows


def sim_rows() -> list[Row]:
    regency.actor.unhandled_fault_hook = lambda failure: None
    rows: list[Row] = []
    for name, tree_min in (("tree", 64), ("direct", DIRECT)):
        sent, received = _frames(tree_min)
        rows.append((f"frames the controller sends per broadcast, 1,024 procs, {name}",
                     "<= 64", sent, "frames"))
        rows.append((f"frames the controller receives per call(), 1,024 procs, {name}",
                     "<= 64", received, "frames"))
        _show(rows[-2:])
    for name, tree_min in (("tree", 64), ("direct", DIRECT)):
        rows.append((f"10 call()s over 4,096 simulated procs, {name}", "", _ten_calls(tree_min),
                     "s real"))
        _show(rows[-1:])
    for procs in (16, 32, 64, 128, 256):
        tree = _one_call(procs, 2)
        direct = _one_call(procs, DIRECT)
        rows.append((f"one call() over {procs} simulated procs: tree / direct", "",
                     tree / direct, "x"))
        _show(rows[-1:])
    return rows


def real_rows() -> list[Row]:
    from regency.actor import attach_to_workers
    from regency.testing import virtual_hosts, virtual_hosts_available

    why = virtual_hosts_available()
    if why is not None:
        return [(f"real figures skipped: {why}", "", float("nan"), "")]
    rows: list[Row] = []
    with virtual_hosts(4) as hosts:
        for host in hosts:
            host.start_worker(SECRET)
        mesh = attach_to_workers([h.worker_address for h in hosts], lease=5.0)
        modes = {"direct": (DIRECT, 16), "tree, fan-out 4": (2, 4), "tree, fan-out 16": (2, 16)}
        for per_host in (4, 8):
            nodes = mesh.spawn_procs(per_host={"gpus": per_host}).spawn("nodes", Node)
            nodes.rank.call().get(30)
            n = 4 * per_host
            names = [m for m in modes if m != "tree, fan-out 16" or n >= 32]
            wall: dict[str, list[float]] = {name: [] for name in names}
            cpu: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(5):
                for name in names:
                    tree_min, fanout = modes[name]
                    with overridden(cast_tree_min=tree_min, cast_fanout=fanout):
                        nodes.rank.call().get(30)
                        start, start_cpu = time.perf_counter(), time.process_time()
                        for _ in range(200):
                            nodes.rank.call().get(30)
                        wall[name].append((time.perf_counter() - start) / 200 * 1e6)
                        cpu[name].append((time.process_time() - start_cpu) / 200 * 1e6)
            for name in names:
                rows.append((f"call() over {n} real procs (4 netns hosts x {per_host}), {name}",
                             "", statistics.median(wall[name]), "us"))
                rows.append(("  the controller's CPU per call()", "",
                             statistics.median(cpu[name]), "us CPU"))
            _show(rows[-2 * len(names):])
        mesh.shutdown().get(30)
    return rows


def run() -> list[Row]:
    return sim_rows() + big_rows() + real_rows()


def _show(rows: list[Row]) -> None:
    if __name__ == "__main__":
        for figure, target, value, unit in rows:
            print(f"{figure:72s} {value:14,.3f} {unit} {target}", flush=True)


if __name__ == "__main__":
    if "--sim" in sys.argv:
        sim_rows()
    elif "--real" in sys.argv:
        real_rows()
    elif "--big" in sys.argv:
        big_rows()
    else:
        run()
