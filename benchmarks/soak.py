"""A soak, as trusted systems run one. Not in CI.

    python -m benchmarks.soak --minutes 30 [--hosts 2] [--seed N]

A controller drives meshes on several local procs (and, as root where
``regency.testing.virtual_hosts_available()`` is None, on two network-namespace hosts with
``regency worker`` daemons over tcp) with mixed traffic for the given time, while a fault loop
kills procs (SIGKILL), pauses them (SIGSTOP, SIGCONT a moment later; now and then for longer
than ``heartbeat_timeout``), respawns the meshes that failed and, for the namespace hosts, cuts
links for a few seconds: the host's link down, a black-hole route between the two hosts, a lossy
link (tbf: a slow link that drops what queues past 50 ms), connection resets (``ss -K``),
the worker paused (SIGSTOP) for up to 12 s, and a relay in front of one worker that cuts the
controller's links through it (FIN or RST) and holds new ones for a few seconds.
The relay is also killed and started again (connections are refused for up to 4 s
meanwhile): on a network address a refused reconnect is retried for ``reconnect_refused_s``,
as a relay or proxy in between may be restarting (``Outbox._reconnect``); the soak sets it to
15 s (the default, 2 s, notices a dead worker sooner).

Traffic, each slot (a proc mesh with an echo, a sink, a sender and a pinger actor on every
proc):

- calls: pipelined ``call_one``, ``call`` and ``choose`` to the echo actors; every reply checked;
- casts to a sequence-checking actor (thread and all-async ones): every sender stamps
  ``(sender id, seq)`` per receiving rank; broadcasts, slices, ``call``, ``call_one`` and
  ``send`` mixed; the senders are the controller's traffic threads and sender actors on other
  slots' procs (proc-to-proc casts, across hosts too); each receiver checks exactly-once
  in-order delivery per sender;
- port sends: pinger actors send stamped values to one port whose receiver is in the
  controller, which checks them the same way.

It checks that:

- every receiver that stayed alive got each sender's messages exactly once and in order (no
  gap, no duplicate, no reordering), and at checkpoints and at the end exactly as many as the
  sender sent (a sender reads the receivers' state after its own messages: FIFO per sender);
- every failure reached its owner: for each proc killed (or paused past the heartbeat timeout),
  each actor mesh on it is reported with that rank to its owner (the root's
  ``unhandled_fault_hook`` or an ``Owner`` actor's ``__supervise__``), and nothing else fails;
- the controller's and the workers' (and their zygotes') RSS, open descriptors, threads and
  child processes are flat after warm-up: the average of the first 10% after warm-up against
  the last 10%, with the least-squares slope; growth over a threshold is flagged.

No wait is unbounded: a get that times out is a finding, reported with what was going on.
A watchdog dumps the stacks of a thread that made no progress for three minutes and ends the
run (table printed, namespaces removed) if it overruns by 20 minutes. The exit status is 1
when anything was lost, duplicated, reordered or not reported, a call timed out or failed
unexpectedly, or a resource grew past its threshold. ``--canary`` sends one duplicate and
skips one number on purpose before the final check (the table must show them);
``--samples CSV`` writes every resource sample; ``--kinds`` limits the fault kinds.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import random
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

SECRET = "regency-soak-job-secret-0123456789"
#: Seconds the controller waits for any reply before it counts a timeout.
T_CALL = 60.0
#: Seconds a killed proc's failures may take to reach their owner.
T_FAILURE = 30.0
#: Seconds a spawn (procs and actors) may take.
T_SPAWN = 90.0
#: Seconds between samples of memory, descriptors and threads.
SAMPLE_S = 5.0
#: Seconds between checkpoints (sequence tails read back from every live receiver).
CHECKPOINT_S = 60.0
#: A thread that made no progress this long is a stall: stacks are dumped.
STALL_S = 180.0
#: The run is ended (table printed, namespaces removed) this long after its planned end.
OVERRUN_S = 1200.0


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _log(text: str) -> None:
    print(f"[soak {_now()}] {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the relay


def relay_main(listen_ip: str, listen_port: int, target_ip: str, target_port: int) -> None:
    """A plain TCP relay, run as its own process. SIGUSR1 cuts every connection through it
    with a FIN, SIGHUP with a reset (RST), and both make it hold new connections (accepted,
    nothing forwarded) until SIGUSR2: a proxy whose far side is briefly unreachable. Killing
    it and starting it again on the same port (``RelayProcess.restart``) also refuses
    connections meanwhile."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((listen_ip, listen_port))
    server.listen(64)
    lock = threading.Lock()
    #: every socket being pumped -> its pair's state: pumps finished, reset asked for
    live: dict[socket.socket, dict[str, Any]] = {}
    flowing = threading.Event()
    flowing.set()

    def pump(src: socket.socket, dst: socket.socket, pair: dict[str, Any]) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        with lock:
            live.pop(src, None)
            live.pop(dst, None)
            pair["done"] += 1
            last, reset = pair["done"] == 2, pair["reset"]
        if not reset:  # FIN to both ends
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if last:  # with linger 0 (a reset), close() sends RST
            src.close()
            dst.close()

    def serve(client: socket.socket) -> None:
        flowing.wait()
        try:
            upstream = socket.create_connection((target_ip, target_port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        pair = {"done": 0, "reset": False}
        with lock:
            live[client] = live[upstream] = pair
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b, pair), daemon=True).start()

    def cut(reset: bool) -> None:
        """Wake every pump: SHUT_RD makes a blocked recv return at once without sending
        anything; the pumps then shut both ends down (FIN) or close them with linger 0
        (RST). A close() from here would not do: a socket that another thread is blocked on
        in recv() stays open until that recv returns."""
        flowing.clear()
        with lock:
            doomed = list(live.items())
            live.clear()
            for _, pair in doomed:
                pair["reset"] = reset
        for sock, _ in doomed:
            with contextlib.suppress(OSError):
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)

    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=cut, args=(False,)).start())
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=cut, args=(True,)).start())
    signal.signal(signal.SIGUSR2, lambda *_: flowing.set())
    print("listening", flush=True)
    while True:
        try:
            client, _ = server.accept()
        except InterruptedError:
            continue
        threading.Thread(target=serve, args=(client,), daemon=True).start()


class RelayProcess:
    """The relay in front of one worker: the controller's link to that worker runs through
    it."""

    def __init__(self, listen_ip: str, target_ip: str, target_port: int) -> None:
        with socket.socket() as probe:
            probe.bind((listen_ip, 0))
            self.port = probe.getsockname()[1]
        self.listen_ip, self.target = listen_ip, (target_ip, target_port)
        self.proc: subprocess.Popen[str] | None = None
        self.address = f"tcp://{listen_ip}:{self.port}"

    def start(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.soak", "--relay", self.listen_ip,
             str(self.port), self.target[0], str(self.target[1])],
            stdout=subprocess.PIPE, text=True, cwd=root,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        if "listening" not in line:
            self.stop()
            raise RuntimeError(f"the relay did not start: {line!r}")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


# --------------------------------------------------------------------------- /proc


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def proc_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), to tell it from a reused pid."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def proc_state(pid: int) -> str | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def proc_usage(pid: int) -> tuple[float, int, int] | None:
    """(RSS MiB, open descriptors, threads) of ``pid``, or None if it is gone."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    rss = threads = 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return rss / 1024.0, fds, threads


def process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, cmdline) of every process."""
    table: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if stat is None:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cmd = (_read(f"/proc/{entry}/cmdline") or "").replace("\0", " ")
        table[int(entry)] = (int(fields[1]), fields[0], cmd)
    return table


def descendants(table: dict[int, tuple[int, str, str]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# --------------------------------------------------------------------------- bookkeeping


class Findings:
    """Everything that went wrong, by kind, with the moment and the context."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.lock = threading.Lock()
        self.items: list[tuple[float, str, str]] = []
        self.kinds: Counter[str] = Counter()

    def add(self, kind: str, text: str) -> None:
        with self.lock:
            t = time.monotonic() - self.t0
            self.kinds[kind] += 1
            n = self.kinds[kind]
            if n <= 25:  # the first few of each kind in full
                self.items.append((t, kind, text))
        if n <= 25:
            _log(f"FINDING {kind}: {text}")
        elif n % 100 == 0:
            _log(f"FINDING {kind}: {n} so far (only the first 25 are shown)")


class Gen:
    """One generation of a slot: its proc mesh, actor meshes and pids."""

    def __init__(self, slot: Slot, number: int) -> None:
        self.slot, self.number = slot, number
        self.key = f"{slot.name}g{number}"
        self.pm: Any = None  # the proc mesh, when the controller owns it
        self.meshes: dict[str, Any] = {}
        self.flat: dict[str, Any] = {}
        self.pids: list[int] = []
        self.starts: list[int | None] = []
        #: why this generation is expected to fail (a fault aimed at it), or None
        self.doomed: str | None = None
        self.stopped = False
        self.report: dict[str, int] = {}  # the latest violation totals of its receivers
        self.ranks_report: dict[int, Counter[str]] = {}
        self.up_since = time.monotonic()

    @property
    def size(self) -> int:
        return len(self.pids)

    def mesh_names(self) -> list[str]:
        return [f"{self.key}-{role}" for role in ("echo", "sinks", "senders", "pingers")]


class Slot:
    def __init__(self, name: str, place: str, owner: str, nprocs: int, async_sinks: bool) -> None:
        self.name, self.place, self.owner = name, place, owner
        self.nprocs, self.async_sinks = nprocs, async_sinks
        self.gen: Gen | None = None
        self.generations = 0


class Expectation:
    """A proc the soak killed (or stopped for good): each actor mesh on it must be reported
    failed, with its rank, to the mesh's owner."""

    def __init__(self, gen: Gen, rank: int, kind: str) -> None:
        self.gen, self.rank, self.kind = gen, rank, kind
        self.t0 = time.monotonic()
        self.pending = set(gen.mesh_names())
        self.seen: dict[str, float] = {}


# --------------------------------------------------------------------------- the soak


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.duration = args.minutes * 60.0
        self.t0 = time.monotonic()
        self.end = self.t0 + self.duration
        self.findings = Findings(self.t0)
        self.lock = threading.RLock()
        self.stopping = threading.Event()  # faults and traffic stop
        self.slots: list[Slot] = []
        self.gens: dict[str, Gen] = {}
        self.expectations: list[Expectation] = []
        self.root_failures: list[dict[str, Any]] = []
        self.owner_failures: list[dict[str, Any]] = []
        self.faults: Counter[str] = Counter()
        self.active: dict[int, str] = {}
        self.recent: deque[tuple[float, str]] = deque(maxlen=8)
        self.calls_per_minute: Counter[int] = Counter()
        self.counts: Counter[str] = Counter()
        self.beats: dict[str, float] = {}
        self.stalled: set[str] = set()
        self.samples: list[tuple[float, dict[str, tuple[float, float, float, float]]]] = []
        self.blast_pairs: set[tuple[str, str]] = set()
        self.pinger_sent: dict[str, int] = {}
        self.pinger_gen: dict[str, str] = {}
        self.tail = Counter[str]()
        self.respawn_s: list[float] = []
        self.failure_latency: list[tuple[str, float]] = []
        self.worker_addresses: list[str] = []
        self.hosts: list[Any] = []
        self.relay: RelayProcess | None = None
        self.hostmesh: Any = None
        self.owner: Any = None
        self.stampers: list[Any] = []
        self.finished = False
        self.cleaned = False

    # ------------------------------------------------------------------ helpers

    def beat(self, name: str) -> None:
        self.beats[name] = time.monotonic()
        if name in self.stalled:
            self.stalled.discard(name)
            _log(f"thread {name} made progress again")

    def context(self) -> str:
        now = time.monotonic()
        with self.lock:
            active = ", ".join(self.active.values()) or "none"
            recent = "; ".join(f"{what} ended {now - t:.1f} s ago" for t, what in self.recent)
        return f"active faults: {active}; recent: {recent or 'none'}"

    def up_gens(self) -> list[Gen]:
        with self.lock:
            return [s.gen for s in self.slots
                    if s.gen is not None and s.gen.doomed is None and not s.gen.stopped]

    def add_calls(self, n: int) -> None:
        minute = int((time.monotonic() - self.t0) // 60)
        with self.lock:
            self.calls_per_minute[minute] += n
            self.counts["calls"] += n

    # ------------------------------------------------------------------ setup

    def setup(self, stack: contextlib.ExitStack) -> None:
        import regency.actor
        from regency.actor import Channel, this_proc
        from regency.testing import virtual_hosts, virtual_hosts_available

        from ._soak_actors import Owner, Stamper

        regency.actor.unhandled_fault_hook = self._root_hook
        self.port, self.receiver = Channel[tuple[str, int]].open()
        self.owner = this_proc().spawn("soak-owner", Owner)
        self.owner.initialized.get(T_SPAWN)
        self.stampers = [Stamper(f"ctl{i}") for i in range(self.args.threads)]
        names = ("L0", "L1", "L2", "L3", "L4", "L5", "L6", "L7")
        for i in range(self.args.local_slots):
            self.slots.append(Slot(names[i], "local", "owner" if i % 4 in (1, 2) else "root",
                                   3 if i % 2 else 2, i % 4 in (2, 3)))
        why = virtual_hosts_available() if self.args.hosts else "--hosts 0"
        if why is None:
            self.hosts = stack.enter_context(virtual_hosts(self.args.hosts))
            for host in self.hosts:
                host.start_worker(SECRET)
            subnet = self.hosts[0].ip.rsplit(".", 1)[0]
            addresses = [h.worker_address for h in self.hosts]
            if len(self.hosts) > 1:
                # The controller's link to the last worker goes through a relay that the
                # fault loop stops and starts.
                last = self.hosts[-1]
                self.relay = RelayProcess(f"{subnet}.1", last.ip, 7700)
                self.relay.start()
                stack.callback(self.relay.stop)
                addresses[-1] = self.relay.address
            from regency.actor import attach_to_workers

            self.worker_addresses = addresses
            self.hostmesh = attach_to_workers(addresses, lease=30.0)
            for i in range(len(self.hosts)):
                self.slots.append(Slot(f"H{i}", f"h{i}", "root", 2, i % 2 == 0))
            if len(self.hosts) > 1:
                self.slots.append(Slot("HX", "hx", "root", len(self.hosts), False))
            _log(f"namespace hosts: {[h.ip for h in self.hosts]}, workers "
                 f"{[h.worker.pid for h in self.hosts]}, relay {self.relay and self.relay.address}")
        else:
            _log(f"no namespace hosts: {why}")
        for slot in self.slots:
            self.respawn(slot, first=True)
        _log("slots: " + ", ".join(
            f"{s.name} ({s.place}, {s.nprocs} procs, owner {s.owner}, "
            f"{'async' if s.async_sinks else 'thread'} sinks)" for s in self.slots))

    def _root_hook(self, failure: Any) -> None:
        entry = {"mesh": failure.mesh_name, "ranks": tuple(failure.ranks),
                 "cause": failure.cause.summary, "t": time.time(), "owner": "root"}
        with self.lock:
            self.root_failures.append(entry)

    def spawn_gen(self, slot: Slot) -> Gen:
        from ._soak_actors import spawn_slot_actors

        slot.generations += 1
        gen = Gen(slot, slot.generations)
        if slot.owner == "owner":
            meshes = self.owner.spawn_slot.call_one(
                gen.key, slot.nprocs, slot.async_sinks, self.port, T_SPAWN
            ).get(T_SPAWN + 30)
        else:
            if slot.place == "local":
                from regency.actor import this_host

                pm = this_host().spawn_procs(per_host={"gpus": slot.nprocs})
            elif slot.place == "hx":
                pm = self.hostmesh.spawn_procs(per_host={"gpus": 1})
            else:
                pm = self.hostmesh.slice(hosts=int(slot.place[1:])).spawn_procs(
                    per_host={"gpus": slot.nprocs})
            gen.pm = pm
            try:
                pm.initialized.get(T_SPAWN)
                meshes = spawn_slot_actors(pm, gen.key, slot.async_sinks, self.port, T_SPAWN)
            except BaseException:
                with contextlib.suppress(Exception):
                    pm.stop().get(T_CALL)
                raise
        gen.meshes = meshes
        gen.flat = {role: mesh.flatten("r") for role, mesh in meshes.items()}
        gen.pids = list(gen.flat["echo"].pid.call().get(T_CALL).values())
        gen.starts = [proc_start_time(p) for p in gen.pids]
        return gen

    def reattach(self) -> None:
        """A host whose worker dropped us (or that we cannot reach): attach again, as
        docs/multihost.md says."""
        from regency.actor import attach_to_workers

        try:
            self.hostmesh = attach_to_workers(self.worker_addresses, lease=30.0)
        except Exception as exc:
            self.findings.add("re-attach failed", f"{type(exc).__name__}: {str(exc)[:300]}")
        else:
            self.findings.add("re-attached", "attach_to_workers again after a failed spawn "
                              f"on a worker host; {self.context()}")

    def stop_gen(self, gen: Gen) -> None:
        gen.stopped = True
        try:
            if gen.slot.owner == "owner":
                self.owner.stop_slot.call_one(gen.key, T_CALL).get(T_CALL + 15)
            elif gen.pm is not None:
                gen.pm.stop().get(T_CALL)
        except Exception as exc:
            self.findings.add("stop failed", f"stopping {gen.key} (doomed: {gen.doomed}): "
                              f"{type(exc).__name__}: {str(exc)[:300]}")
        # The soak keeps no handle on a stopped generation (its memory must be Regency's to
        # give back); an operation still holding one fails, and counts as expected.
        gen.pm, gen.meshes, gen.flat = None, {}, {}

    def respawn(self, slot: Slot, first: bool = False) -> bool:
        old = slot.gen
        t = time.monotonic()
        if old is not None and not old.stopped:
            self.stop_gen(old)
        for attempt in range(3):
            self.beat("faults")
            try:
                gen = self.spawn_gen(slot)
            except Exception as exc:
                self.findings.add("spawn failed", f"{slot.name} attempt {attempt + 1}: "
                                  f"{type(exc).__name__}: {str(exc)[:400]}; {self.context()}")
                if first:
                    raise
                if slot.place != "local":
                    self.reattach()
                time.sleep(2)
                continue
            with self.lock:
                slot.gen = gen
                self.gens[gen.key] = gen
            if not first:
                self.respawn_s.append(time.monotonic() - t)
            return True
        with self.lock:
            slot.gen = None
        return False

    # ------------------------------------------------------------------ traffic

    def classify(self, what: str, gens: list[Gen], exc: BaseException) -> None:
        """An error of a traffic operation: expected when a generation it touched is doomed
        (a fault killed its proc); a timeout or any other error is a finding."""
        text = f"{type(exc).__name__}: {str(exc)[:300]}"
        if isinstance(exc, TimeoutError):
            self.findings.add("timeout", f"{what} on {[g.key for g in gens]} "
                              f"(doomed: {[g.doomed for g in gens]}): {text}; {self.context()}")
            return
        if any(g.doomed is not None or g.stopped for g in gens):
            self.counts["expected errors"] += 1
            return
        time.sleep(0.5)  # a kill's doom is set before the signal; give its failure a moment
        self.process_failures()
        if any(g.doomed is not None or g.stopped for g in gens):
            self.counts["expected errors"] += 1
            return
        self.findings.add("unexpected error", f"{what} on {[g.key for g in gens]}: {text}; "
                          f"{self.context()}")

    def traffic(self, index: int) -> None:
        name = f"traffic{index}"
        rng = random.Random(f"{self.args.seed}/{index}")
        stamper = self.stampers[index]
        next_checkpoint = time.monotonic() + CHECKPOINT_S
        ops: list[tuple[str, float]] = [("echo", 3), ("echo_all", 1), ("choose", 1),
                                       ("seq", 3), ("blast", 2), ("pump", 1.5)]
        names, weights = [o for o, _ in ops], [w for _, w in ops]
        while not self.stopping.is_set() and time.monotonic() < self.end:
            self.beat(name)
            gens = self.up_gens()
            if not gens:
                time.sleep(0.2)
                continue
            gen = rng.choice(gens)
            op = rng.choices(names, weights)[0]
            involved = [gen]
            try:
                if op == "echo":
                    echo = gen.flat["echo"]
                    futs = [(i, echo.slice(r=rng.randrange(gen.size)).ping.call_one(i))
                            for i in range(rng.randint(10, 60))]
                    deadline = time.monotonic() + T_CALL
                    for i, fut in futs:
                        got = fut.get(max(0.1, deadline - time.monotonic()))
                        if got != i:
                            self.findings.add("wrong reply", f"{gen.key} ping({i}) -> {got!r}")
                    self.add_calls(len(futs))
                elif op == "echo_all":
                    values = gen.flat["echo"].ping.call(7).get(T_CALL).values()
                    if values != [7] * gen.size:
                        self.findings.add("wrong reply", f"{gen.key} ping.call(7) -> {values}")
                    self.add_calls(gen.size)
                elif op == "choose":
                    got = gen.flat["echo"].ping.choose(5).get(T_CALL)
                    if got != 5:
                        self.findings.add("wrong reply", f"{gen.key} choose -> {got!r}")
                    self.add_calls(1)
                elif op == "seq":
                    out = stamper.burst(gen.flat["sinks"], gen.key, rng.randint(10, 50), rng,
                                        T_CALL)
                    self.counts["stamped by controller"] += out["sent"]
                    self.add_calls(out["replies"])
                    if out["errors"]:
                        self._inner_errors(f"seq burst by {stamper.sid}", [gen], out)
                elif op == "blast":
                    others = [g for g in self.up_gens() if g is not gen] or [gen]
                    target = rng.choice(others)
                    involved = [gen, target]
                    with self.lock:
                        self.blast_pairs.add((gen.key, target.key))
                    outs = gen.meshes["senders"].blast.call(
                        target.flat["sinks"], target.key, rng.randint(5, 30)
                    ).get(T_CALL + 30).values()
                    self.add_calls(gen.size)
                    for out in outs:
                        self.counts["stamped by actors"] += out["sent"]
                        if out["errors"]:
                            self._inner_errors(f"blast {gen.key}->{target.key}", [target], out)
                elif op == "pump":
                    outs = gen.flat["pingers"].pump.call(rng.randint(10, 80)).get(T_CALL).values()
                    self.add_calls(gen.size)
                    with self.lock:
                        for sid, sent in outs:
                            self.pinger_sent[sid] = max(sent, self.pinger_sent.get(sid, 0))
                            self.pinger_gen[sid] = gen.key
            except Exception as exc:
                self.classify(op, involved, exc)
            if index == 0 and time.monotonic() >= next_checkpoint:
                self.checkpoint(final=False)
                next_checkpoint = time.monotonic() + CHECKPOINT_S
        self.beat(name)

    def _inner_errors(self, what: str, targets: list[Gen], out: dict[str, Any]) -> None:
        if out.get("timeouts"):
            self.findings.add("timeout", f"{what} (inside the sender): {out['error_texts']}; "
                              f"{self.context()}")
        elif any(g.doomed is not None or g.stopped for g in targets):
            self.counts["expected errors"] += out["errors"]
        else:
            time.sleep(0.5)
            self.process_failures()
            if any(g.doomed is not None or g.stopped for g in targets):
                self.counts["expected errors"] += out["errors"]
            else:
                self.findings.add("unexpected error", f"{what}: {out['errors']} error(s): "
                                  f"{out['error_texts']}; {self.context()}")

    def drain(self) -> None:
        """The port's receiver: every pinger's values exactly once, in order."""
        from ._soak_actors import SeqChecker

        self.port_checker = SeqChecker()
        pending = None
        while not self.finished:
            self.beat("drain")
            if pending is None:
                pending = self.receiver.recv()
            try:
                sid, seq = pending.get(1.0)
            except TimeoutError:
                continue
            except Exception as exc:
                if not self.finished:
                    self.findings.add("port error", f"{type(exc).__name__}: {exc}")
                pending = None
                continue
            pending = None
            with self.lock:
                self.port_checker.check(sid, seq)
                self.counts["port values"] += 1

    # ------------------------------------------------------------------ checks

    def checkpoint(self, final: bool, beat: str = "traffic0") -> None:
        """Read every live receiver's state after our own messages: each controller stamper's
        tail must be complete; each sender actor checks its own tail the same way."""
        for gen in self.up_gens():
            expected = {s.sid: s.expected(gen.key) for s in self.stampers}
            try:
                reports = gen.flat["sinks"].report.call().get(T_CALL).values()
                self.add_calls(gen.size)
            except Exception as exc:
                self.classify("checkpoint report", [gen], exc)
                continue
            if gen.doomed is not None:
                continue
            totals = Counter[str]()
            for rank, rep in enumerate(reports):
                mine = Counter[str]()
                mine["misaddressed"] += rep["misaddressed"]
                for st in rep["state"].values():
                    mine["gaps"] += st[2]
                    mine["duplicates"] += st[3]
                    mine["reorders"] += st[4]
                for sid, exp in expected.items():
                    if exp:
                        self._tail(f"{sid}->{gen.key}[{rank}]", exp[rank],
                                   rep["state"].get(sid), exact=final)
                before = gen.ranks_report.get(rank, Counter[str]())
                new = {k: v for k, v in mine.items() if v > before.get(k, 0)}
                if new:
                    self.findings.add("sequence violation", f"{gen.key} rank {rank}: {new}; "
                                      f"examples: {rep['examples'][:5]}; {self.context()}")
                gen.ranks_report[rank] = mine
                totals.update(mine)
            gen.report = dict(totals)
            self.beat(beat)
        with self.lock:
            pairs = sorted(self.blast_pairs)
        for skey, tkey in pairs:
            sender, target = self.gens.get(skey), self.gens.get(tkey)
            if sender is None or target is None:
                continue
            if any(g.doomed is not None or g.stopped for g in (sender, target)):
                with self.lock:
                    self.blast_pairs.discard((skey, tkey))
                continue
            try:
                results = sender.meshes["senders"].verify.call(
                    target.flat["sinks"], target.key).get(T_CALL + 30).values()
                self.add_calls(sender.size)
            except Exception as exc:
                self.classify("checkpoint verify", [sender, target], exc)
                continue
            if sender.doomed is not None or target.doomed is not None:
                continue
            self.beat(beat)
            for res in results:
                for rank, (exp, st) in enumerate(zip(res["expected"], res["got"], strict=True)):
                    self._tail(f"{res['sid']}->{tkey}[{rank}]", exp, st, exact=True)
        self.counts["checkpoints"] += 1

    def _tail(self, what: str, expected: int, state: list[int] | None, exact: bool) -> None:
        """``state`` is the receiver's [count, last, gaps, dups, reorders] for one sender that
        sent it ``expected`` messages before the receiver was read."""
        count, last = (state[0], state[1]) if state is not None else (0, -1)
        key = what
        if last < expected - 1:
            lost = expected - 1 - last
            if self.tail[key] < lost:
                self.findings.add("lost (tail)", f"{what}: sent {expected}, the receiver's "
                                  f"last is {last} (count {count}); {self.context()}")
                self.tail[key] = lost
        elif exact and last > expected - 1:
            self.findings.add("extra (tail)", f"{what}: sent {expected}, the receiver's last "
                              f"is {last} (count {count})")
        if exact and count != last + 1 and state is not None and state[2:] == [0, 0, 0]:
            self.findings.add("count mismatch", f"{what}: count {count}, last {last}")

    def process_failures(self) -> None:
        """A failure of a generation no fault was aimed at: a finding; the generation is
        taken out of the traffic and respawned."""
        with self.lock:
            fresh = [f for f in self.root_failures + self.owner_failures if "done" not in f]
            for f in fresh:
                f["done"] = True
        for f in fresh:
            gen = self.gens.get(f["mesh"].rsplit("-", 1)[0])
            if gen is None or gen.doomed is not None or gen.stopped:
                continue
            with self.lock:
                gen.doomed = f"unexpected failure of {f['mesh']} {f['ranks']}: {f['cause']}"
            self.findings.add("unexpected failure", f"{f['mesh']} ranks {f['ranks']} at the "
                              f"{f['owner']}: {f['cause']}; {self.context()}")

    def failures_seen(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.root_failures) + list(self.owner_failures)

    def poll_owner(self) -> None:
        try:
            new = self.owner.failures_from.call_one(len(self.owner_failures)).get(T_CALL)
        except Exception as exc:
            self.findings.add("owner unreachable", f"{type(exc).__name__}: {exc}")
            return
        with self.lock:
            for entry in new:
                entry["owner"] = "owner"
                self.owner_failures.append(entry)

    def match(self, exp: Expectation) -> None:
        want = "owner" if exp.gen.slot.owner == "owner" else "root"
        for f in self.failures_seen():
            if f["mesh"] in exp.pending and exp.rank in f["ranks"]:
                if f["owner"] != want:
                    self.findings.add("failure reached the wrong owner",
                                      f"{f['mesh']}: {f['owner']}, expected {want}")
                exp.pending.discard(f["mesh"])
                exp.seen[f["mesh"]] = time.monotonic() - exp.t0

    def wait_failures(self, exp: Expectation, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while exp.pending and time.monotonic() < deadline:
            self.beat("faults")
            if exp.gen.slot.owner == "owner":
                self.poll_owner()
            self.match(exp)
            if exp.pending:
                time.sleep(0.1)
        if exp.pending:
            self.findings.add(
                "failure not reported",
                f"{exp.kind} of {exp.gen.key} rank {exp.rank} (pid {exp.gen.pids[exp.rank]}): "
                f"no failure of {sorted(exp.pending)} reached the "
                f"{exp.gen.slot.owner} within {timeout:.0f} s; seen: {exp.seen}; "
                f"{self.context()}")
        else:
            self.failure_latency.append((exp.kind, max(exp.seen.values())))

    # ------------------------------------------------------------------ faults

    def _signal(self, gen: Gen, rank: int, sig: signal.Signals) -> bool:
        pid = gen.pids[rank]
        if proc_start_time(pid) != gen.starts[rank]:
            return False  # gone (or its pid reused)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    @contextlib.contextmanager
    def fault(self, what: str) -> Iterator[None]:
        key = id(what) ^ int(time.monotonic() * 1e6)
        with self.lock:
            self.active[key] = what
        try:
            yield
        finally:
            with self.lock:
                del self.active[key]
                self.recent.append((time.monotonic(), what))

    def fault_kinds(self) -> list[tuple[str, float]]:
        kinds = [("kill", 3.0), ("pause", 3.0), ("pause_long", 0.6)]
        if self.hosts:
            kinds += [("cut", 1.2), ("throttle", 0.8), ("reset", 1.0), ("pause_worker", 0.6)]
            if len(self.hosts) > 1:
                kinds += [("partition", 1.0), ("relay", 1.0), ("relay_restart", 1.0)]
        return kinds

    def fault_loop(self) -> None:
        rng = random.Random(f"{self.args.seed}/faults")
        kinds = self.fault_kinds()
        if self.args.kinds:
            kinds = [(k, w) for k, w in kinds if k in self.args.kinds.split(",")]
        if not kinds:
            return
        names, weights = [k for k, _ in kinds], [w for _, w in kinds]
        while not self.stopping.is_set():
            self.beat("faults")
            if self.stopping.wait(rng.uniform(self.args.fault_gap[0], self.args.fault_gap[1])):
                break
            if time.monotonic() > self.end - 20:  # the last seconds run clean
                break
            kind = rng.choices(names, weights)[0]
            try:
                self.inject(kind, rng)
            except Exception:
                self.findings.add("fault loop error", traceback.format_exc()[-1500:])
            self.poll_owner()
            self.process_failures()
            for slot in self.slots:  # a generation lost some other way, or never respawned
                if slot.gen is None or slot.gen.doomed is not None:
                    self.respawn(slot)
        self.beat("faults")

    def inject(self, kind: str, rng: random.Random) -> None:
        gens = self.up_gens()
        if kind in ("kill", "pause", "pause_long"):
            if not gens:
                return
            gen = rng.choice(gens)
            rank = rng.randrange(gen.size)
            what = f"{kind} {gen.key} rank {rank} (pid {gen.pids[rank]})"
            if kind == "pause":
                seconds = rng.uniform(0.3, 3.0)
                with self.fault(f"{what} for {seconds:.1f} s"):
                    if self._signal(gen, rank, signal.SIGSTOP):
                        self.faults[kind] += 1
                        try:
                            time.sleep(seconds)
                        finally:
                            self._signal(gen, rank, signal.SIGCONT)
                return
            exp = Expectation(gen, rank, kind)
            with self.lock:
                gen.doomed = what
            with self.fault(what):
                sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
                if not self._signal(gen, rank, sig):
                    self.findings.add("proc gone before a fault",
                                      f"{what}: the proc had already exited; {self.context()}")
                    gen.doomed = f"{what} (already gone)"
                    self.respawn(gen.slot)
                    return
                self.faults[kind] += 1
                with self.lock:
                    self.expectations.append(exp)
                try:
                    # A stopped proc is killed as stuck after heartbeat_timeout (10 s).
                    self.wait_failures(exp, T_FAILURE if kind == "kill" else T_FAILURE + 20)
                finally:
                    if kind == "pause_long":
                        self._signal(gen, rank, signal.SIGCONT)
            self.respawn(gen.slot)
            return
        host = rng.randrange(len(self.hosts))
        h = self.hosts[host]
        seconds = rng.uniform(1.0, 3.5)
        if kind == "cut":
            with self.fault(f"cut h{host} ({h.ip}) for {seconds:.1f} s"):
                h.cut()
                self.faults[kind] += 1
                try:
                    time.sleep(seconds)
                finally:
                    h.restore()
        elif kind == "throttle":
            seconds = rng.uniform(3.0, 8.0)
            rate = rng.choice(["256kbit", "1mbit", "4mbit"])
            with self.fault(f"throttle h{host} to {rate} (tbf, drops past 50 ms of queue) "
                            f"for {seconds:.1f} s"):
                run(["tc", "qdisc", "add", "dev", h.veth, "root", "tbf", "rate", rate,
                     "burst", "16kb", "latency", "50ms"])
                self.faults[kind] += 1
                try:
                    time.sleep(seconds)
                finally:
                    run(["tc", "qdisc", "del", "dev", h.veth, "root"])
        elif kind == "reset":
            with self.fault(f"reset the controller's connections to h{host} ({h.ip})"):
                run(["ss", "-K", "dst", h.ip], check=False)
                self.faults[kind] += 1
                time.sleep(0.5)
        elif kind == "partition":
            a, b = self.hosts[0], self.hosts[1]
            with self.fault(f"partition h0-h1 (black-hole routes) for {seconds:.1f} s"):
                run(["ip", "-n", a.name, "route", "add", "blackhole", f"{b.ip}/32"])
                try:
                    run(["ip", "-n", b.name, "route", "add", "blackhole", f"{a.ip}/32"])
                    self.faults[kind] += 1
                    try:
                        time.sleep(seconds)
                    finally:
                        run(["ip", "-n", b.name, "route", "del", "blackhole", f"{a.ip}/32"])
                finally:
                    run(["ip", "-n", a.name, "route", "del", "blackhole", f"{b.ip}/32"])
        elif kind == "pause_worker":
            seconds = rng.uniform(1.0, 12.0)
            worker = h.worker
            assert worker is not None
            with self.fault(f"pause the worker of h{host} (pid {worker.pid}) for {seconds:.1f} s"):
                worker.send_signal(signal.SIGSTOP)
                self.faults[kind] += 1
                try:
                    time.sleep(seconds)
                finally:
                    worker.send_signal(signal.SIGCONT)
        elif kind == "relay":
            assert self.relay is not None
            seconds = rng.uniform(0.5, 4.0)
            how = rng.choice(["FIN", "RST"])
            with self.fault(f"relay to h{len(self.hosts) - 1}: links cut ({how}), new ones held "
                            f"for {seconds:.1f} s"):
                self.relay.signal(signal.SIGUSR1 if how == "FIN" else signal.SIGHUP)
                self.faults[kind] += 1
                try:
                    time.sleep(seconds)
                finally:
                    self.relay.signal(signal.SIGUSR2)
        elif kind == "relay_restart":
            assert self.relay is not None
            seconds = rng.uniform(0.5, 4.0)
            with self.fault(f"relay to h{len(self.hosts) - 1} killed and restarted after "
                            f"{seconds:.1f} s (connections refused meanwhile)"):
                self.relay.stop()
                self.faults[kind] += 1
                try:
                    time.sleep(seconds)
                finally:
                    for attempt in range(5):
                        try:
                            self.relay.start()
                            break
                        except Exception as exc:
                            if attempt == 4:
                                self.findings.add("relay restart failed", str(exc))
                            time.sleep(1)

    # ------------------------------------------------------------------ resources

    def sample_once(self) -> None:
        table = process_table()
        me = os.getpid()
        watched: dict[str, int] = {"controller": me}
        for pid in descendants(table, me):
            ppid, _, cmd = table[pid]
            if ppid == me and "regency.core._zygote" in cmd:
                watched.setdefault("zygote (local)", pid)
        for i, h in enumerate(self.hosts):
            if h.worker is not None and h.worker.poll() is None:
                watched[f"worker h{i}"] = h.worker.pid
                for pid in descendants(table, h.worker.pid):
                    if table[pid][0] == h.worker.pid and "regency.core._zygote" in table[pid][2]:
                        watched.setdefault(f"zygote h{i}", pid)
        row: dict[str, tuple[float, float, float, float]] = {}
        for name, pid in watched.items():
            usage = proc_usage(pid)
            if usage is None:
                continue
            kids = [k for k in descendants(table, pid) if "regency" in table[k][2]]
            zombies = sum(1 for k in kids if table[k][1] == "Z")
            if zombies:
                self.counts[f"zombie samples {name}"] += 1
            row[name] = (usage[0], float(usage[1]), float(usage[2]), float(len(kids)))
        self.samples.append((time.monotonic() - self.t0, row))

    def sampler(self) -> None:
        while not self.finished:
            self.beat("sampler")
            try:
                self.sample_once()
            except Exception:
                self.findings.add("sampler error", traceback.format_exc()[-800:])
            minute = int((time.monotonic() - self.t0) // 60)
            if minute > self.counts["progress minute"] and minute >= 1:
                self.counts["progress minute"] = minute
                _log(f"minute {minute}: {self.calls_per_minute[minute - 1] / 60:.0f} calls/s, "
                     f"faults {dict(self.faults)}, failures seen {len(self.failures_seen())}, "
                     f"findings {dict(self.findings.kinds)}")
            time.sleep(SAMPLE_S)

    def watchdog(self) -> None:
        while not self.cleaned:
            time.sleep(5)
            now = time.monotonic()
            for name, t in list(self.beats.items()):
                if self.finished or name in self.stalled:
                    continue
                if now - t > STALL_S and not (name.startswith("traffic")
                                              and self.stopping.is_set()):
                    self.stalled.add(name)
                    self.findings.add("stall", f"thread {name} made no progress for "
                                      f"{now - t:.0f} s; {self.context()}; stacks on stderr")
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            if now > self.end + OVERRUN_S and not self.cleaned:
                self.findings.add("overrun", f"the soak overran its end by {OVERRUN_S:.0f} s; "
                                  "stacks on stderr; ending it")
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                with contextlib.suppress(Exception):
                    print(self.table())
                sys.stdout.flush()
                self.emergency_cleanup()
                os._exit(3)

    def emergency_cleanup(self) -> None:
        if self.relay is not None:
            with contextlib.suppress(Exception):
                self.relay.stop()
        bridges = set()
        for i, h in enumerate(self.hosts):
            with contextlib.suppress(Exception):
                if h.worker is not None:
                    h.worker.kill()
            subprocess.run(["ip", "netns", "del", h.name], capture_output=True)
            bridges.add("rgb" + h.veth[3 : -len(str(i))])
        for bridge in bridges:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)

    # ------------------------------------------------------------------ the end

    def quiesce(self) -> None:
        """After the traffic and the faults stopped: every pending failure is waited for,
        receivers are read one last time (exact tails), and the port is drained."""
        for exp in list(self.expectations):
            if exp.pending:
                self.wait_failures(exp, 5)
        time.sleep(3)
        if self.args.canary:
            self.canary()
        self.checkpoint(final=True, beat="final")
        # Every live pinger's values must all have arrived.
        deadline = time.monotonic() + T_CALL
        while True:
            with self.lock:
                missing = self._port_missing()
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for sid, (sent, got) in missing.items():
            self.findings.add("lost (port)", f"{sid}: sent {sent}, received up to {got}")

    def canary(self) -> None:
        """``--canary``: prove the checks fire. To rank 0 of one live receiver, the controller
        sends one number twice and skips the next: the table must show 1 duplicated and 1
        lost."""
        gens = self.up_gens()
        if not gens:
            return
        gen, stamper = gens[0], self.stampers[0]
        with stamper.lock:
            counters = stamper.sent.setdefault(gen.key, [0] * gen.size)
            if counters[0] == 0:
                seqs = tuple(0 if r == 0 else None for r in range(gen.size))
                gen.flat["sinks"].slice(r=0).take.broadcast(stamper.sid, seqs)
                counters[0] = 1
            seqs = tuple(counters[0] - 1 if r == 0 else None for r in range(gen.size))
            gen.flat["sinks"].slice(r=0).take.broadcast(stamper.sid, seqs)  # a duplicate
            counters[0] += 1  # a number never sent: a gap
            seqs = tuple(counters[0] if r == 0 else None for r in range(gen.size))
            gen.flat["sinks"].slice(r=0).take.broadcast(stamper.sid, seqs)
            counters[0] += 1
        _log(f"canary: a duplicate and a gap sent by {stamper.sid} to {gen.key} rank 0")

    def _port_missing(self) -> dict[str, tuple[int, int]]:
        out = {}
        for sid, sent in self.pinger_sent.items():
            gen = self.gens.get(self.pinger_gen[sid])
            if gen is None or gen.doomed is not None:
                continue
            st = self.port_checker.state.get(sid)
            last = st[1] if st else -1
            if last < sent - 1:
                out[sid] = (sent, last)
        return out

    def shutdown(self) -> None:
        for slot in self.slots:
            if slot.gen is not None and not slot.gen.stopped:
                self.stop_gen(slot.gen)
        if self.hostmesh is not None:
            try:
                self.hostmesh.shutdown().get(T_CALL)
            except Exception as exc:
                self.findings.add("shutdown failed", f"{type(exc).__name__}: {exc}")

    def run(self) -> int:
        threads = [threading.Thread(target=self.sampler, name="soak-sampler", daemon=True),
                   threading.Thread(target=self.watchdog, name="soak-watchdog", daemon=True)]
        for t in threads:
            t.start()
        with contextlib.ExitStack() as stack:
            try:
                self.setup(stack)
                _log(f"set up in {time.monotonic() - self.t0:.1f} s; running until "
                     f"{time.strftime('%H:%M:%S', time.localtime(time.time() + self.end - time.monotonic()))}")
                self.t0 = self.findings.t0 = time.monotonic()
                self.end = self.t0 + self.duration
                self.samples.clear()
                self.calls_per_minute.clear()
                self.counts["progress minute"] = 0
                background = [
                    threading.Thread(target=self.drain, name="soak-drain", daemon=True),
                    threading.Thread(target=self.fault_loop, name="soak-faults", daemon=True),
                ] + [threading.Thread(target=self.traffic, args=(i,), name=f"soak-traffic{i}",
                                      daemon=True) for i in range(1, self.args.threads)]
                for t in background:
                    t.start()
                try:
                    self.traffic(0)
                finally:
                    self.stopping.set()
                    self.elapsed = time.monotonic() - self.t0
                    for t in background[1:]:
                        t.join(T_SPAWN * 2)
                        if t.is_alive():
                            self.findings.add("stall", f"{t.name} did not end; {self.context()}")
                    _log("traffic and faults stopped; final checks")
                    self.quiesce()
            except KeyboardInterrupt:
                _log("interrupted: final table of what ran")
                self.elapsed = time.monotonic() - self.t0
            finally:
                self.finished = True
                try:
                    self.shutdown()
                except BaseException:
                    traceback.print_exc()
                print(self.table(), flush=True)
                if self.args.samples:
                    self.write_samples(self.args.samples)
        self.cleaned = True
        bad = {"lost (tail)", "lost (port)", "extra (tail)", "sequence violation",
               "failure not reported", "timeout", "unexpected error", "stall", "overrun",
               "count mismatch"}
        return 1 if bad & set(self.findings.kinds) or self.resource_flags else 0

    # ------------------------------------------------------------------ the table

    resource_flags: list[str] = []

    def table(self) -> str:
        elapsed = getattr(self, "elapsed", time.monotonic() - self.t0)
        out: list[str] = []
        minutes = [self.calls_per_minute[m] / 60.0 for m in range(int(elapsed // 60))]
        overall = self.counts["calls"] / max(elapsed, 1e-9)
        expected = list(self.expectations)
        seen_ok = sum(1 for e in expected if not e.pending)
        failures = self.failures_seen()
        doomed_keys = {e.gen.key for e in expected}
        unexpected = [f for f in failures
                      if f["mesh"].rsplit("-", 1)[0] not in doomed_keys]
        extra_ranks = [f for f in failures if f["mesh"].rsplit("-", 1)[0] in doomed_keys
                       and not any(e.gen.key == f["mesh"].rsplit("-", 1)[0]
                                   and e.rank in f["ranks"] for e in expected)]
        totals = Counter[str]()
        for gen in self.gens.values():
            totals.update(gen.report)
        pc = getattr(self, "port_checker", None)
        if pc is not None:
            for st in pc.state.values():
                totals["port gaps"] += st[2]
                totals["port duplicates"] += st[3]
                totals["port reorders"] += st[4]
        lost_tail = sum(self.tail.values()) + self.findings.kinds["lost (port)"]
        warm = self.warmup(elapsed)
        out.append("\n## Soak\n")
        out.append("| figure | value |")
        out.append("|---|---|")
        out.append(f"| duration | {elapsed / 60:.1f} min (seed {self.args.seed}; warm-up "
                   f"{warm / 60:.1f} min; {len(self.slots)} slots: "
                   + ", ".join(f"{s.name} {s.place}x{s.nprocs}" for s in self.slots) + ") |")
        if minutes:
            out.append(f"| calls/s held | {overall:,.0f} overall; per minute min "
                       f"{min(minutes):,.0f} / median {statistics.median(minutes):,.0f} / max "
                       f"{max(minutes):,.0f} ({len(minutes)} full minute{'s' if len(minutes) > 1 else ''}) |")
        else:
            out.append(f"| calls/s held | {overall:,.0f} overall (no full minute) |")
        out.append(f"| messages checked | {self.counts['stamped by controller']:,} stamped by the "
                   f"controller, {self.counts['stamped by actors']:,} by sender actors, "
                   f"{self.counts['port values']:,} port values; "
                   f"{self.counts['checkpoints']} checkpoints |")
        out.append("| faults injected | " + (", ".join(
            f"{k} {v}" for k, v in sorted(self.faults.items())) or "none") +
            f" ({sum(self.faults.values())} in all) |")
        lat = ""
        for kind in ("kill", "pause_long"):
            xs = [x for k, x in self.failure_latency if k == kind]
            if xs:
                lat += (f"; {kind} to every owner told: median {statistics.median(xs) * 1e3:,.0f} "
                        f"ms, max {max(xs) * 1e3:,.0f} ms")
        out.append(f"| failures observed | {len(failures)} reports ({sum(1 for f in failures if f['owner'] == 'root')} "
                   f"at the root hook, {sum(1 for f in failures if f['owner'] == 'owner')} at an "
                   f"owner's `__supervise__`); procs killed or stuck: {len(expected)}, every "
                   f"mesh on them reported: {seen_ok}/{len(expected)}{lat} |")
        out.append(f"| failures not reported / unexpected / extra ranks | "
                   f"{len(expected) - seen_ok} / {len(unexpected)} / {len(extra_ranks)} |")
        if self.respawn_s:
            out.append(f"| respawns | {len(self.respawn_s)}, median "
                       f"{statistics.median(self.respawn_s):.2f} s, max {max(self.respawn_s):.2f} s |")
        out.append(f"| lost or duplicated messages (must be 0) | lost {lost_tail + totals['gaps'] + totals['port gaps']}, "
                   f"duplicated {totals['duplicates'] + totals['port duplicates']}, "
                   f"reordered {totals['reorders'] + totals['port reorders']}, "
                   f"misaddressed {totals['misaddressed']} |")
        out.append(f"| timeouts / unexpected errors / stalls | {self.findings.kinds['timeout']} / "
                   f"{self.findings.kinds['unexpected error']} / {self.findings.kinds['stall']} "
                   f"({self.counts['expected errors']:,} errors from calls to killed procs, expected) |")
        out.append("")
        out.extend(self.resource_table(elapsed))
        if self.findings.items or unexpected or extra_ranks:
            out.append("\n### Findings\n")
            for t, kind, text in self.findings.items:
                out.append(f"- {t / 60:5.1f} min **{kind}**: {text}")
            for f in unexpected[:20]:
                out.append(f"- unexpected failure: {f}")
            for f in extra_ranks[:20]:
                out.append(f"- failure of other ranks of a killed generation: {f}")
            more = {k: v - 25 for k, v in self.findings.kinds.items() if v > 25}
            if more:
                out.append(f"- (not listed: {more})")
        return "\n".join(out)

    def write_samples(self, path: str) -> None:
        """Every sample as CSV: seconds, process, RSS MiB, fds, threads, descendants."""
        with open(path, "w") as f:
            f.write("t,process,rss_mib,fds,threads,descendants\n")
            for t, row in self.samples:
                for name, (rss, fds, threads, kids) in row.items():
                    f.write(f"{t:.1f},{name},{rss:.2f},{fds:.0f},{threads:.0f},{kids:.0f}\n")

    def warmup(self, elapsed: float) -> float:
        return max(30.0, min(300.0, 0.1 * elapsed))

    def resource_table(self, elapsed: float) -> list[str]:
        warm = self.warmup(elapsed)
        after = [(t, row) for t, row in self.samples if t >= warm]
        out = ["| process | RSS MiB start -> end (slope /h) | fds | threads | descendants | flag |",
               "|---|---|---|---|---|---|"]
        if len(after) < 4:
            out.append("| (too few samples after warm-up) | | | | | |")
            return out
        names = sorted({n for _, row in after for n in row},
                       key=lambda n: (n != "controller", n))
        k = max(1, len(after) // 10)
        flags: list[str] = []
        for name in names:
            series = [(t, row[name]) for t, row in after if name in row]
            if len(series) < 4:
                continue
            cells = []
            flagged = []
            for i, (label, limit) in enumerate((("RSS", (0.10, 20.0)), ("fds", (0.10, 8.0)),
                                               ("threads", (0.10, 3.0)),
                                               ("descendants", (0.0, 3.0)))):
                first = statistics.fmean(v[i] for _, v in series[:k])
                last = statistics.fmean(v[i] for _, v in series[-k:])
                slope = _slope([t for t, _ in series], [v[i] for _, v in series]) * 3600
                cells.append(f"{first:,.1f} -> {last:,.1f} ({slope:+,.1f})")
                if last - first > max(limit[0] * first, limit[1]):
                    flagged.append(f"{label} +{last - first:,.1f}")
            if flagged:
                flags.append(f"{name}: {', '.join(flagged)}")
            out.append(f"| {name} | " + " | ".join(cells) + f" | {', '.join(flagged) or 'flat'} |")
        zombies = {k: v for k, v in self.counts.items() if k.startswith("zombie samples")}
        if zombies:
            out.append(f"\nSamples with zombie children: {zombies}")
        self.resource_flags = flags
        out.append(f"\n(start: mean of the first 10% of samples after warm-up; end: the last 10%; "
                   f"{len(after)} samples every {SAMPLE_S:.0f} s; flagged: growth over 10% and "
                   f"20 MiB, 10% and 8 fds, 10% and 3 threads, 3 processes)")
        return out


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def run(cmd: list[str], check: bool = True) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--relay"]:
        relay_main(argv[1], int(argv[2]), argv[3], int(argv[4]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--hosts", type=int, default=2, help="namespace hosts (0: none)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--local-slots", type=int, default=4, choices=range(1, 9))
    parser.add_argument("--threads", type=int, default=2, help="controller traffic threads")
    parser.add_argument("--fault-gap", type=float, nargs=2, default=(2.0, 8.0),
                        metavar=("MIN", "MAX"), help="seconds between faults")
    parser.add_argument("--samples", default="", metavar="CSV",
                        help="write every resource sample to this file")
    parser.add_argument("--canary", action="store_true", help="before the final check, send "
                        "one duplicate and skip one number on purpose: the table must show them")
    parser.add_argument("--kinds", default="", help="only these fault kinds (comma-separated): "
                        "kill, pause, pause_long, cut, throttle, reset, pause_worker, partition, relay, "
                        "relay_restart")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    os.environ["REGENCY_SECRET"] = SECRET
    # Relay restarts refuse connections for seconds (the default ride-out is 2 s).
    os.environ.setdefault("REGENCY_RECONNECT_REFUSED_S", "15")
    _log(f"seed {args.seed}; {args.minutes} min")
    soak = Soak(args)
    signal.signal(signal.SIGTERM, _interrupt)
    code = soak.run()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
