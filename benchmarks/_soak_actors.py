"""The actors of the soak (``python -m benchmarks.soak``), importable by reference in every
proc, local or on a namespace host.

Every message a sender stamps carries ``(sid, seqs)``: ``sid`` names the sender (the
controller's traffic thread, or one rank of a :class:`Sender` mesh of one generation), and
``seqs`` holds, for each flat rank of the addressed sink mesh, the next number of that sender's
sequence towards that rank (``None`` for ranks the message was not sent to). A receiver checks
that the numbers of each sender arrive exactly once and in order: 0, 1, 2, ... .
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from regency.actor import (
    Actor,
    ActorMesh,
    MeshFailure,
    Port,
    ProcMesh,
    current_rank,
    endpoint,
    send,
    this_host,
)

#: Seconds any wait inside an actor may take (the controller waits longer for the call).
INNER_TIMEOUT = 45.0
#: Examples of violations kept per checker.
EXAMPLES = 20


class SeqChecker:
    """Exactly-once, in-order delivery per sender: for each sid, the count of messages, the
    last number, and the gaps, duplicates and reorderings seen."""

    def __init__(self) -> None:
        #: sid -> [count, last, gaps, duplicates, reorders]
        self.state: dict[str, list[int]] = {}
        #: sid -> numbers skipped by a gap that have not arrived (bounded)
        self.missing: dict[str, set[int]] = {}
        self.misaddressed = 0
        self.examples: list[str] = []

    def _example(self, text: str) -> None:
        if len(self.examples) < EXAMPLES:
            self.examples.append(f"{time.strftime('%H:%M:%S')} {text}")

    def check(self, sid: str, seq: int | None) -> None:
        if seq is None:
            self.misaddressed += 1
            self._example(f"{sid}: a message not addressed to this rank arrived")
            return
        st = self.state.get(sid)
        if st is None:
            st = self.state[sid] = [0, -1, 0, 0, 0]
        st[0] += 1
        last = st[1]
        if seq == last + 1:
            st[1] = seq
        elif seq > last + 1:
            st[2] += 1
            self._example(f"{sid}: gap, got {seq} after {last} ({seq - last - 1} missing)")
            missing = self.missing.setdefault(sid, set())
            if len(missing) < 100_000:
                missing.update(range(last + 1, min(seq, last + 1 + 100_000)))
            st[1] = seq
        else:
            late = self.missing.get(sid)
            if late is not None and seq in late:
                late.discard(seq)
                st[4] += 1
                self._example(f"{sid}: reordered, got {seq} late (after {last})")
            else:
                st[3] += 1
                self._example(f"{sid}: duplicate {seq} (last {last})")

    def report(self) -> dict[str, Any]:
        return {
            "state": {sid: list(v) for sid, v in self.state.items()},
            "misaddressed": self.misaddressed,
            "examples": list(self.examples),
        }


class Echo(Actor):
    @endpoint
    def ping(self, x: int = 0) -> int:
        return x

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class SeqSink(Actor):
    """A receiver that checks each sender's sequence (a thread actor)."""

    def __init__(self) -> None:
        self.rank = current_rank().rank
        self.checker = SeqChecker()

    @endpoint
    def take(self, sid: str, seqs: tuple[int | None, ...]) -> None:
        self.checker.check(sid, seqs[self.rank])

    @endpoint
    def take_call(self, sid: str, seqs: tuple[int | None, ...]) -> int:
        self.checker.check(sid, seqs[self.rank])
        return self.rank

    @endpoint
    def report(self) -> dict[str, Any]:
        return self.checker.report()


class AsyncSeqSink(Actor):
    """The same, all async: it runs as a task on its proc's trio loop."""

    def __init__(self) -> None:
        self.rank = current_rank().rank
        self.checker = SeqChecker()

    @endpoint
    async def take(self, sid: str, seqs: tuple[int | None, ...]) -> None:
        self.checker.check(sid, seqs[self.rank])

    @endpoint
    async def take_call(self, sid: str, seqs: tuple[int | None, ...]) -> int:
        self.checker.check(sid, seqs[self.rank])
        return self.rank

    @endpoint
    async def report(self) -> dict[str, Any]:
        return self.checker.report()


#: How a stamped message is sent: every rank, one rank, a range of ranks.
MODES = ("bcast", "bcast1", "range", "call", "call1", "send", "send1")


class Stamper:
    """One sender's sequences towards sink meshes (by target key), and the sending itself.

    ``sinks`` is a sink mesh flattened to one dim ``r``. A message's numbers are committed only
    when the send did not raise at once; a send that raised was not sent.
    """

    def __init__(self, sid: str) -> None:
        self.sid = sid
        #: target key -> next number per flat rank
        self.sent: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def burst(
        self, sinks: Any, tkey: str, n: int, rng: random.Random, timeout: float
    ) -> dict[str, Any]:
        """Send ``n`` stamped messages in random modes; wait for the replies of the calls
        among them. Returns counts: sent, replies, errors (with the first few texts)."""
        size = len(sinks)
        out: dict[str, Any] = {"sent": 0, "replies": 0, "errors": 0, "error_texts": []}
        futures: list[tuple[Any, int]] = []
        with self.lock:
            counters = self.sent.setdefault(tkey, [0] * size)
            for _ in range(n):
                mode = rng.choice(MODES)
                if mode in ("bcast", "call", "send"):
                    ranks = list(range(size))
                    target = sinks
                elif mode == "range" and size > 2:
                    a = rng.randrange(size - 1)
                    b = rng.randrange(a + 1, size + 1)
                    ranks = list(range(a, b))
                    target = sinks.slice(r=slice(a, b))
                else:
                    r = rng.randrange(size)
                    ranks = [r]
                    target = sinks.slice(r=r)
                    if mode == "range":
                        mode = "bcast1"
                seqs = tuple(counters[r] if r in ranks else None for r in range(size))
                try:
                    if mode in ("bcast", "bcast1", "range"):
                        target.take.broadcast(self.sid, seqs)
                    elif mode == "call":
                        futures.append((target.take_call.call(self.sid, seqs), len(ranks)))
                    elif mode == "call1":
                        futures.append((target.take_call.call_one(self.sid, seqs), 1))
                    else:
                        send(target.take, (self.sid, seqs), {})
                except Exception as exc:  # not sent: the numbers stay free
                    out["errors"] += 1
                    if len(out["error_texts"]) < 3:
                        out["error_texts"].append(f"{mode}: {type(exc).__name__}: {exc}"[:400])
                    continue
                for r in ranks:
                    counters[r] += 1
                out["sent"] += 1
        deadline = time.monotonic() + timeout
        for fut, k in futures:
            try:
                fut.get(max(0.1, deadline - time.monotonic()))
                out["replies"] += k
            except TimeoutError:
                out["errors"] += 1
                out.setdefault("timeouts", 0)
                out["timeouts"] += 1
                if len(out["error_texts"]) < 3:
                    out["error_texts"].append("timeout waiting for a take_call reply")
            except Exception as exc:
                out["errors"] += 1
                if len(out["error_texts"]) < 3:
                    out["error_texts"].append(f"reply: {type(exc).__name__}: {exc}"[:400])
        return out

    def expected(self, tkey: str) -> list[int]:
        with self.lock:
            return list(self.sent.get(tkey, []))


class Sender(Actor):
    """Sends stamped messages from its own proc to another slot's sinks."""

    def __init__(self, key: str) -> None:
        rank = current_rank().rank
        self.stamper = Stamper(f"{key}.r{rank}")
        self.rng = random.Random(f"{key}/{rank}/{os.getpid()}")

    @endpoint
    def blast(self, sinks: ActorMesh[SeqSink], tkey: str, n: int) -> dict[str, Any]:
        return self.stamper.burst(sinks, tkey, n, self.rng, INNER_TIMEOUT)

    @endpoint
    def verify(self, sinks: ActorMesh[SeqSink], tkey: str) -> dict[str, Any]:
        """Read the sinks after everything this sender sent them (FIFO per sender): the tail
        of this sender's sequence towards each rank must be exactly what it sent."""
        expected = self.stamper.expected(tkey)
        reports = sinks.report.call().get(INNER_TIMEOUT).values()
        return {"sid": self.stamper.sid, "expected": expected,
                "got": [rep["state"].get(self.stamper.sid) for rep in reports]}


class Pinger(Actor):
    """Sends stamped values to a port whose receiver is in the controller."""

    def __init__(self, key: str, port: Port[tuple[str, int]]) -> None:
        self.sid = f"{key}.r{current_rank().rank}"
        self.port = port
        self.seq = 0

    @endpoint
    def pump(self, n: int) -> tuple[str, int]:
        for _ in range(n):
            self.port.send((self.sid, self.seq))
            self.seq += 1
        return self.sid, self.seq


#: The actor meshes of one slot generation, by role.
ROLES = ("echo", "sinks", "senders", "pingers")


def spawn_slot_actors(
    pm: ProcMesh, key: str, async_sinks: bool, port: Port[tuple[str, int]], timeout: float
) -> dict[str, Any]:
    """Spawn the four actor meshes of a slot generation on ``pm``; wait until they run."""
    meshes = {
        "echo": pm.spawn(f"{key}-echo", Echo),
        "sinks": pm.spawn(f"{key}-sinks", AsyncSeqSink if async_sinks else SeqSink),
        "senders": pm.spawn(f"{key}-senders", Sender, key),
        "pingers": pm.spawn(f"{key}-pingers", Pinger, key, port),
    }
    deadline = time.monotonic() + timeout
    for mesh in meshes.values():
        mesh.initialized.get(max(0.1, deadline - time.monotonic()))
    return meshes


class Owner(Actor):
    """Owns the proc and actor meshes of some local slots: each failure reaches its
    ``__supervise__``, which records it and handles it (the soak respawns the slot)."""

    def __init__(self) -> None:
        self.failures: list[dict[str, Any]] = []
        self.procs: dict[str, ProcMesh] = {}

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append({"mesh": failure.mesh_name, "ranks": tuple(failure.ranks),
                              "cause": failure.cause.summary, "t": time.time()})
        return True

    @endpoint
    def spawn_slot(
        self, key: str, nprocs: int, async_sinks: bool, port: Port[tuple[str, int]],
        timeout: float,
    ) -> dict[str, Any]:
        pm = this_host().spawn_procs(per_host={"gpus": nprocs})
        self.procs[key] = pm
        pm.initialized.get(timeout)
        return spawn_slot_actors(pm, key, async_sinks, port, timeout)

    @endpoint
    def stop_slot(self, key: str, timeout: float) -> None:
        pm = self.procs.pop(key, None)
        if pm is not None:
            pm.stop().get(timeout)

    @endpoint
    def failures_from(self, index: int) -> list[dict[str, Any]]:
        return self.failures[index:]
