"""Exact replay: the same seed gives the same trace; faults never break the frame contract.

These tests are the tripwire for the trio internals the simulator relies on (see
``regency/sim/_clock.py``): a trio upgrade that changes its scheduler shows up here first.
"""

from __future__ import annotations

import itertools
import random
import re
import time

import pytest
import trio
from hypothesis import find, given, settings
from hypothesis import strategies as st
from trio._core import _run as trio_run

from regency.sim import (
    ClogFault,
    CrashHostFault,
    DelayFault,
    DisconnectFault,
    Faults,
    FaultSchedule,
    PartitionFault,
    SimConnection,
    SimNetwork,
    check_determinism,
    fault_schedules,
    run_deterministic,
)
from regency.transports import Connection, ConnectionBroken, ConnectionClosed, TransportError

from . import Recorder, Server

HOSTS = ("h0", "h1", "h2", "h3")
NOISY = Faults(delay=0.5, disconnect=0.5, partition=0.5, clog=0.5, mean_duration=0.5)


async def chatter(rng: random.Random, faults: Faults = NOISY, duration: float = 3.0) -> int:
    """Several tasks on four hosts dial each other, send and close at random, under faults.

    Every task draws from the one generator, so the draws interleave in scheduling order:
    the run is only reproducible if the schedule is.
    """
    net = SimNetwork(rng, faults)
    net.set_latency(0.01, 0.05)
    async with trio.open_nursery() as nursery:
        transports = {host: net.transport(host, nursery) for host in HOSTS}
        for host, transport in transports.items():
            await transport.listen(f"sim://{host}/svc", Server())
        nursery.start_soon(net.run_faults, name="faults")

        async def talker(me: str) -> None:
            while trio.current_time() < duration:
                peer = rng.choice(HOSTS)
                try:
                    conn = await transports[me].connect(f"sim://{peer}/svc", Recorder())
                except ConnectionBroken:
                    await trio.sleep(rng.random())
                    continue
                for _ in range(rng.randrange(1, 10)):
                    try:
                        conn.send_nowait(rng.randbytes(rng.randrange(100)))
                    except TransportError:
                        break
                    await trio.sleep(rng.expovariate(10))
                if rng.random() < 0.5:
                    conn.close()

        async with trio.open_nursery() as talkers:
            for host in HOSTS:
                for k in range(2):
                    talkers.start_soon(talker, host, name=f"talker {host}/{k}")
        nursery.cancel_scope.cancel()
    return len(net.events)


@pytest.mark.slow
def test_same_seed_same_trace_over_many_seeds() -> None:
    hashes = []
    kinds: set[str] = set()
    for seed in range(20):
        result, digest, events = check_determinism(chatter, seed)
        assert result == len(events) > 100
        hashes.append(digest)
        kinds |= {e.kind for e in events}
    # The workload exercised the faults it was meant to.
    assert {"partition", "disconnect", "clog", "delay", "break", "drop", "fin"} <= kinds
    # Different seeds give different runs.
    assert len(set(hashes)) >= 18


def test_different_seeds_give_different_event_logs() -> None:
    logs = [run_deterministic(chatter, seed)[2] for seed in (100, 101, 102)]
    assert logs[0] != logs[1] != logs[2] != logs[0]


def test_the_scheduler_is_seeded_from_the_seed() -> None:
    """Ready tasks run in an order drawn from the seed: the same for one seed, not fixed."""

    async def race(rng: random.Random) -> list[int]:
        order: list[int] = []

        async def runner(i: int) -> None:
            await trio.lowlevel.checkpoint()
            order.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(runner, i)
        return order

    orders = [tuple(run_deterministic(race, seed)[0]) for seed in range(10)]
    assert orders == [tuple(run_deterministic(race, seed)[0]) for seed in range(10)]
    assert len(set(orders)) > 1


def test_check_determinism_names_the_first_diverging_event() -> None:
    runs = itertools.count()

    async def leaky(rng: random.Random) -> None:
        size = 10 + next(runs)  # state that survives between runs: a determinism bug
        net = SimNetwork(rng)
        async with trio.open_nursery() as nursery:
            a = net.transport("h0", nursery)
            server = Server(echo=False)
            listener = await net.transport("h1", nursery).listen("sim://h1/", server)
            conn = await a.connect(listener.address, Recorder())
            for n in (3, 4, size):
                conn.send_nowait(b"x" * n)
            await server.accepted.wait()
            await server.sinks[0].wait_for(lambda: len(server.sinks[0].frames) == 3)
            nursery.cancel_scope.cancel()

    with pytest.raises(AssertionError) as caught:
        check_determinism(leaky, 7)
    message = str(caught.value)
    assert re.fullmatch(
        r"seed 7 is not deterministic: run 2 diverged from run 1 at event 7: "
        r"run 1 had '\S+ send c1 h0->h1 #2 10B at \S+', "
        r"run 2 had '\S+ send c1 h0->h1 #2 11B at \S+'",
        message,
    ), message


def test_check_determinism_names_the_first_diverging_schedule_step() -> None:
    runs = itertools.count()

    async def extra_task(rng: random.Random) -> None:
        async with trio.open_nursery() as nursery:
            if next(runs) % 2:
                nursery.start_soon(trio.sleep, 1, name="only in odd runs")
            await trio.sleep(2)

    with pytest.raises(AssertionError, match=r"the schedule differs at step \d+: run 1 stepped"):
        check_determinism(extra_task, 1)


def test_run_deterministic_restores_trio_and_reports_hangs() -> None:
    flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    state = trio_run._r.getstate()

    async def stuck(rng: random.Random) -> None:
        await trio.Event().wait()

    start = time.perf_counter()
    with pytest.raises(
        TimeoutError,
        match=r"^simulation with seed 3 did not finish within 100 virtual seconds: a deadlock",
    ):
        run_deterministic(stuck, 3, timeout=100)
    assert time.perf_counter() - start < 1

    async def broken(rng: random.Random) -> None:
        raise KeyError("workload bug")

    with pytest.raises(KeyError, match="workload bug"):
        run_deterministic(broken, 3)
    assert flag == trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    assert trio_run._r.getstate() == state
    with pytest.raises(ValueError, match="runs must be at least 2"):
        check_determinism(stuck, 1, runs=1)


# -- Hypothesis ------------------------------------------------------------------------------


def test_fault_schedules_shrink_toward_no_faults() -> None:
    quiet = find(fault_schedules(HOSTS), lambda s: True)
    assert quiet.faults == ()
    assert quiet.rates.total_rate == 0
    # Asked for a partition, the smallest one Hypothesis finds is a partition that does nothing.
    smallest = find(
        fault_schedules(HOSTS), lambda s: any(isinstance(f, PartitionFault) for f in s.faults)
    )
    assert smallest == FaultSchedule(
        smallest.rates, (PartitionFault(0.0, 0.0, (), (), one_way=False),)
    )
    assert smallest.rates.total_rate == 0


HORIZON = 4.0
FRAMES = 25


async def senders_under(schedule: FaultSchedule, rng: random.Random) -> list[Exchange]:
    """Six connections between four hosts carry numbered frames (echoed back) under faults."""
    net = SimNetwork(rng, schedule.rates, connect_timeout=0.5)
    net.set_latency(0.01, 0.1)
    exchanges: list[Exchange] = []
    async with trio.open_nursery() as nursery:
        transports = {host: net.transport(host, nursery) for host in HOSTS}
        servers = {host: Server() for host in HOSTS}
        for host, transport in transports.items():
            await transport.listen(f"sim://{host}/svc", servers[host])

        async def sender(src: str, dst: str) -> None:
            client = Recorder()
            while True:
                if trio.current_time() > HORIZON:
                    return
                try:
                    conn = await transports[src].connect(f"sim://{dst}/svc", client)
                    break
                except ConnectionBroken:
                    await trio.sleep(0.3)
            exchange = Exchange(conn, client, servers[dst])
            exchanges.append(exchange)
            for seq in range(FRAMES):
                try:
                    conn.send_nowait(seq.to_bytes(2, "little"))
                except (ConnectionBroken, ConnectionClosed):
                    break
                exchange.sent += 1
                await trio.sleep(rng.uniform(0, 0.2))

        async with trio.open_nursery() as injecting:
            injecting.start_soon(net.run_faults, schedule.faults)
            async with trio.open_nursery() as sending:
                for i in range(6):
                    src, dst = HOSTS[i % 4], HOSTS[(i + 1 + i // 4) % 4]
                    sending.start_soon(sender, src, dst)
            await trio.sleep_until(2 * HORIZON)
            injecting.cancel_scope.cancel()
        net.heal()
        await trio.sleep(3 * HORIZON)  # long enough for any clog to end and frames to drain
        for exchange in exchanges:
            exchange.snapshot()  # before the teardown closes every connection
        nursery.cancel_scope.cancel()
    return exchanges


class Exchange:
    """One connection of the property test: both ends and what was sent."""

    def __init__(self, conn: Connection, client: Recorder, server: Server) -> None:
        self.conn = conn
        self.client = client
        self.server = server
        self.sent = 0
        #: Whether each end was closed once the network went quiet: (client, server).
        self.closed = (False, False)

    def server_end(self) -> tuple[Connection, Recorder]:
        assert isinstance(self.conn, SimConnection)
        for conn, sink in zip(self.server.conns, self.server.sinks, strict=True):
            if isinstance(conn, SimConnection) and conn.id == self.conn.id:
                return conn, sink
        raise LookupError(f"no server end for connection c{self.conn.id}")

    def snapshot(self) -> None:
        self.closed = (self.conn.closed, self.server_end()[0].closed)


def check_sink(sink: Recorder, closed: bool) -> None:
    kinds = [kind for kind, _ in sink.log]
    assert kinds.count("lost") <= 1, sink.log
    if "lost" in kinds:
        assert kinds[-1] == "lost", f"a frame arrived after the loss was reported: {sink.log}"
    assert sink.late == [], "a frame arrived on a closed connection"
    # Once the network is quiet, every closed end has heard of it, and only those.
    assert closed == ("lost" in kinds)


def check_delivery(schedule: FaultSchedule, seed: int) -> list[Exchange]:
    """Run the senders under ``schedule`` and check every connection's frames."""
    exchanges, _, _ = run_deterministic(lambda rng: senders_under(schedule, rng), seed)
    for exchange in exchanges:
        sent = [seq.to_bytes(2, "little") for seq in range(exchange.sent)]
        _, server_sink = exchange.server_end()
        check_sink(exchange.client, exchange.closed[0])
        check_sink(server_sink, exchange.closed[1])
        # Whatever arrived is a prefix of what was sent, echoes a prefix of what arrived:
        # never a duplicate, a gap or a reordering.
        assert server_sink.frames == sent[: len(server_sink.frames)]
        assert exchange.client.frames == server_sink.frames[: len(exchange.client.frames)]
        if not exchange.client.lost and not server_sink.lost:
            assert server_sink.frames == sent
            assert exchange.client.frames == sent
    return exchanges


@given(schedule=fault_schedules(HOSTS, horizon=HORIZON, crashes=True), seed=st.integers(0, 999))
@settings(max_examples=25, deadline=None)
def test_frames_are_delivered_once_in_order_under_any_fault_schedule(
    schedule: FaultSchedule, seed: int
) -> None:
    check_delivery(schedule, seed)


def test_the_property_holds_for_a_schedule_with_every_kind_of_fault() -> None:
    """One busy, explicit schedule, so the property is never checked on quiet runs alone."""
    schedule = FaultSchedule(
        Faults(),
        (
            ClogFault(0.2, "h1", 1.0),
            DelayFault(0.3, "h0", "h1", 0.5, 2.0),
            PartitionFault(0.5, 1.0, ("h2",), ("h3",), one_way=True),
            DisconnectFault(1.0, "h0", "h1"),
            PartitionFault(1.5, 0.5, ("h0",), ("h3",)),
            CrashHostFault(3.0, "h3"),
        ),
    )
    for seed in range(5):
        exchanges = check_delivery(schedule, seed)
        assert len(exchanges) >= 4
        assert any(e.client.lost for e in exchanges)
        assert any(not e.client.lost and e.sent == FRAMES for e in exchanges)
