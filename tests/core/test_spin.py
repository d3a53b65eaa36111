"""A thread that reads its own messages polls a while before it sleeps (core/_spin.py):
the policy alone, then real processes."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from regency.actor import ProcMesh
from regency.core import _spin
from regency.core._config import Config
from regency.core._controller import current_runtime
from regency.core._leader import Leader, LeadingMailbox
from regency.core._spin import MISSES_TO_STOP, PROBE_EVERY, CpuGauge, SpinPolicy, spin_limit

from ..conftest import SpawnProcs
from .leader_actors import AsyncSeq, Seq

T = 30
LIMIT = 200e-6


def test_a_thread_spins_while_spinning_catches() -> None:
    policy = SpinPolicy()
    for _ in range(100):
        assert policy.budget(LIMIT) == LIMIT
        policy.caught()


def test_a_thread_stops_spinning_after_misses_and_probes_now_and_then() -> None:
    policy = SpinPolicy()
    budgets = []
    for _ in range(MISSES_TO_STOP + 3 * PROBE_EVERY):
        budget = policy.budget(LIMIT)
        budgets.append(budget)
        if budget:
            policy.missed()
    assert budgets[:MISSES_TO_STOP] == [LIMIT] * MISSES_TO_STOP
    probes = [i for i, b in enumerate(budgets) if b and i >= MISSES_TO_STOP]
    assert probes == [MISSES_TO_STOP + k * PROBE_EVERY - 1 for k in (1, 2, 3)]


def test_a_probe_that_catches_brings_spinning_back() -> None:
    policy = SpinPolicy()
    for _ in range(MISSES_TO_STOP):
        policy.budget(LIMIT)
        policy.missed()
    while not policy.budget(LIMIT):
        pass
    policy.caught()
    assert [policy.budget(LIMIT) for _ in range(3)] == [LIMIT] * 3


def test_no_limit_no_spin() -> None:
    policy = SpinPolicy()
    assert policy.budget(0.0) == 0.0


def test_one_usable_cpu_never_spins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_spin.os, "sched_getaffinity", lambda _pid: {0})
    assert spin_limit(200.0) == 0.0
    monkeypatch.setattr(_spin.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert spin_limit(200.0) == pytest.approx(200e-6)
    assert spin_limit(0.0) == 0.0


def test_the_gauge_reads_the_runnable_count(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("3.55 2.92 2.40 2/109 24334\n")
    assert CpuGauge(str(loadavg), cpus=2).runnable() == 2
    assert not CpuGauge(str(loadavg), cpus=2).crowded()
    loadavg.write_text("3.55 2.92 2.40 3/109 24334\n")
    gauge = CpuGauge(str(loadavg), cpus=2)
    assert gauge.crowded()
    gauge.close()


def test_one_reading_of_the_gauge_answers_for_a_while(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("3.55 2.92 2.40 3/109 24334\n")
    now = [10.0]
    gauge = CpuGauge(str(loadavg), cpus=2, reread=0.001, clock=lambda: now[0])
    assert gauge.crowded()
    loadavg.write_text("3.55 2.92 2.40 1/109 24334\n")
    now[0] += 0.0009
    assert gauge.crowded()  # the reading of 3 runnable still answers
    now[0] += 0.0002
    assert not gauge.crowded()  # read again: 1 runnable
    loadavg.write_text("3.55 2.92 2.40 5/109 24334\n")
    assert not gauge.crowded()
    now[0] += 0.001
    assert gauge.crowded()
    gauge.close()


def test_an_unreadable_gauge_is_never_crowded(tmp_path: Path) -> None:
    assert CpuGauge(str(tmp_path / "missing"), cpus=2).runnable() is None
    assert not CpuGauge(str(tmp_path / "missing"), cpus=2).crowded()
    garbled = tmp_path / "garbled"
    garbled.write_text("not a loadavg line")
    assert not CpuGauge(str(garbled), cpus=2).crowded()


def test_this_machine_has_a_gauge() -> None:
    runnable = CpuGauge().runnable()
    assert runnable is not None and runnable >= 1  # at least this test


def test_spin_us_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match=r"spin_us must be zero or more \(got -1\)"):
        Config(spin_us=-1)


def test_spin_us_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from regency.core._config import _from_env

    monkeypatch.setenv("REGENCY_SPIN_US", "50")
    assert _from_env()["spin_us"] == 50.0


@pytest.fixture
def leader() -> Iterator[Leader]:
    rt = current_runtime()
    assert rt.leader is not None
    spin = rt.leader.spin
    yield rt.leader
    rt.leader.spin = spin


@pytest.fixture
def pm(spawn_procs: SpawnProcs) -> ProcMesh:
    return spawn_procs(per_host={"gpus": 1})


@pytest.mark.slow
@pytest.mark.parametrize("crowded_proc", [False, True], ids=["idle", "crowded"])
def test_threads_that_wait_on_slow_work_stop_spinning(
    pm: ProcMesh, leader: Leader, tmp_path: Path, crowded_proc: bool
) -> None:
    """A caller waiting on a 20 ms endpoint, and the actor thread waiting 20 ms for its next
    call (the caller pauses between calls), spin a few times, then sleep at once (each probe,
    and any heartbeat that happens to land while a thread spins, allows a few more). Also
    where the proc's gauge says every CPU is taken: the actor thread spins there too, and
    backs off the same way."""
    leader.spin = LIMIT
    seq = pm.spawn("spin_slow", Seq)
    if crowded_proc:
        loadavg = tmp_path / "loadavg"
        loadavg.write_text("5.10 4.80 4.00 6/109 24334\n")
        seq.crowd.call_one(str(loadavg), LIMIT).get(T)
    seq.take.call_one(0).get(T)
    before, in_proc = leader.spun, seq.spun.call_one().get(T)
    calls = 40
    for i in range(calls):
        assert seq.take_slowly.call_one(i).get(T) == i
        time.sleep(0.02)
    allowance = 3 * MISSES_TO_STOP + calls // PROBE_EVERY + 2
    assert leader.spun - before <= allowance
    assert seq.spun.call_one().get(T) - in_proc <= allowance + 2


@pytest.mark.slow
def test_with_spinning_off_no_thread_spins_and_calls_keep_their_order(
    spawn_procs: SpawnProcs, configured: Callable[..., None], leader: Leader
) -> None:
    configured(spin_us=0)  # procs read it when they start
    leader.spin = 0.0
    seq = spawn_procs(per_host={"gpus": 1}).spawn("spin_off", Seq)
    before = leader.spun
    futures = [seq.take.call_one(i) for i in range(500)]
    assert [f.get(T) for f in futures] == list(range(500))
    assert seq.taken.call_one().get(T) == list(range(500))
    assert leader.spun == before
    assert seq.spun.call_one().get(T) == 0


class _CountingGauge(CpuGauge):
    """A real gauge over a file, counting its reads."""

    def __init__(self, path: str) -> None:
        super().__init__(path, cpus=2)
        self.reads = 0

    def runnable(self) -> int | None:
        self.reads += 1
        return super().runnable()


@pytest.mark.slow
def test_on_a_crowded_machine_a_thread_reads_the_gauge_now_and_then(
    pm: ProcMesh, leader: Leader, tmp_path: Path
) -> None:
    """Every CPU taken (a 4-proc mesh call on 2 CPUs): a wait that cannot spin counts as a
    miss, so a thread stops reading ``/proc/loadavg`` (2 us) on every wait and only probes
    one wait in ``PROBE_EVERY``; it never spins meanwhile."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("5.10 4.80 4.00 6/109 24334\n")  # 6 runnable on 2 CPUs
    gauge = _CountingGauge(str(loadavg))
    seq = pm.spawn("spin_crowded", Seq)
    seq.take.call_one(0).get(T)
    leader.spin, real = LIMIT, leader._gauge
    leader._gauge = gauge
    try:
        before = leader.spun
        calls = 4 * PROBE_EVERY
        for i in range(1, calls + 1):
            seq.take.call_one(i).get(T)
        assert leader.spun == before
        assert 1 <= gauge.reads <= MISSES_TO_STOP + calls // PROBE_EVERY + 1, gauge.reads
    finally:
        leader._gauge = real
        gauge.close()


@pytest.mark.slow
def test_on_a_crowded_machine_an_idle_actor_thread_still_spins(
    pm: ProcMesh, leader: Leader, tmp_path: Path
) -> None:
    """Every CPU taken: a caller's ``get()`` sleeps at once, but the callee's actor thread,
    waiting for its next call, spins first (core/_spin.py, "callees": on a VM an idle vCPU
    halts, and waking it costs more than the spin)."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("5.10 4.80 4.00 6/109 24334\n")  # 6 runnable on 2 CPUs
    gauge = _CountingGauge(str(loadavg))
    seq = pm.spawn("spin_callee", Seq)
    seq.crowd.call_one(str(loadavg), LIMIT).get(T)
    leader.spin, real = LIMIT, leader._gauge
    leader._gauge = gauge
    try:
        before, in_proc = leader.spun, seq.spun.call_one().get(T)
        calls = 4 * PROBE_EVERY
        for i in range(calls):
            seq.take.call_one(i).get(T)
        assert leader.spun == before  # the caller never spun
        # The callee spun on every wait while its spins caught the next call, and on one
        # wait in PROBE_EVERY where they did not (a loaded machine); before, never.
        assert seq.spun.call_one().get(T) - in_proc > 0
    finally:
        leader._gauge = real
        gauge.close()


class _Crowded:
    """A gauge that says every CPU is taken."""

    def crowded(self) -> bool:
        return True


class _PipeConnection:
    """What ``Leader._lead`` uses of a connection, over one end of a socketpair: each read
    puts what came into an actor thread's mailbox, as a call read on that thread does."""

    closed = False

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.mailbox: LeadingMailbox | None = None

    def lead(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_led(self) -> bool:
        assert self.mailbox is not None
        self.mailbox.put(self.sock.recv(64))
        return True

    def give_back(self) -> None:
        pass


def test_an_endpoints_own_waits_do_not_stop_its_thread_spinning_for_the_next_call() -> None:
    """On a crowded machine an endpoint's own calls (three per message here) sleep at once,
    each a spin that missed; the actor thread's wait for its next call keeps a back-off of
    its own, so it still spins (before, the misses of those waits stopped it: it spun on
    about one wait in PROBE_EVERY). Each call is in before the thread waits, so every spin
    catches at its first poll: nothing here depends on timing."""
    ours, peers = socket.socketpair()
    with ours, peers:
        conn = _PipeConnection(ours)
        runtime: Any = SimpleNamespace(
            config=SimpleNamespace(spin_us=200), inbound=SimpleNamespace(leadable={0: conn}),
            thread_id=None,
            env=SimpleNamespace(clock=time.monotonic),
        )
        leader = Leader(runtime)
        leader.spin, leader._gauge = LIMIT, _Crowded()  # type: ignore[assignment]
        mailbox = conn.mailbox = leader.mailbox()
        calls = 4 * PROBE_EVERY
        for i in range(calls):
            peers.send(b"%d," % i)
            assert mailbox.get() == b"%d," % i  # the wait for the next call
            for _ in range(3):  # the endpoint's own calls, whose replies are in already
                leader._lead(lambda: True, lambda _bell: True, None, lambda _left: None)
        assert leader.spun == calls


@pytest.mark.slow
def test_an_all_async_actor_keeps_its_loop_polling_before_it_waits_for_its_next_call(
    pm: ProcMesh,
) -> None:
    """An all-async actor runs on its proc's loop; about to wait for its next call, it
    checkpoints without sleeping for a while first (``ActorCell._spin_for_next``), as an
    actor thread spins, with the same back-off: before, its waits never spun."""
    if not spin_limit(200.0):
        pytest.skip("one usable CPU: nothing spins")
    seq = pm.spawn("spin_async", AsyncSeq)
    seq.take.call_one(0).get(T)
    before = seq.spun.call_one().get(T)
    calls = 4 * PROBE_EVERY
    assert [seq.take.call_one(i).get(T) for i in range(calls)] == list(range(calls))
    # Every wait while its spins catch the next call, one in PROBE_EVERY where they miss
    # (a wait that finds the next call queued already does not spin at all).
    assert seq.spun.call_one().get(T) - before > 0
