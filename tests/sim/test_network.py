"""The sim transport: the transport contract inside a simulation, and every link fault.

Each test runs its own ``trio.run`` on a mock clock (``run_deterministic``), so virtual
durations can be asserted exactly and nothing waits on real time.
"""

from __future__ import annotations

import contextvars
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import trio

from regency.sim import (
    Faults,
    Latency,
    PartitionFault,
    SimNetwork,
    SimTransport,
    run_deterministic,
)
from regency.transports import Connection, ConnectionBroken, ConnectionClosed, Listener

from . import Recorder, Server

T = TypeVar("T")


def simulate(
    body: Callable[[SimNetwork, trio.Nursery], Awaitable[T]],
    seed: int = 0,
    **network_options: Any,
) -> T:
    """Run ``body(network, nursery)`` in a fresh simulation; cancel what it left running."""

    async def main(rng: random.Random) -> T:
        net = SimNetwork(rng, **network_options)
        async with trio.open_nursery() as nursery:
            result = await body(net, nursery)
            nursery.cancel_scope.cancel()
        return result

    return run_deterministic(main, seed)[0]


async def serve(
    net: SimNetwork, nursery: trio.Nursery, host: str = "h1", echo: bool = True
) -> tuple[SimTransport, Listener, Server]:
    transport = net.transport(host, nursery)
    server = Server(echo=echo)
    listener = await transport.listen(f"sim://{host}/", server)
    return transport, listener, server


async def round_trip(conn: Connection, sink: Recorder, payload: bytes = b"ping") -> float:
    """Send ``payload`` to an echoing peer; return the virtual time until it came back."""
    start = trio.current_time()
    count = len(sink.frames)
    conn.send_nowait(payload)
    await sink.wait_for(lambda: len(sink.frames) > count)
    return trio.current_time() - start


# -- the transport contract --------------------------------------------------------------


def test_frames_arrive_whole_and_in_order() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        _, listener, server = await serve(net, nursery)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        rng = random.Random(1)
        sizes = [0, 1, 5, 1000, 70_000, 3 << 20, *range(100)]
        sent = [rng.randbytes(n) for n in sizes]
        sent.append(b"")  # gathered frames arrive joined
        for frame in sent[:-1]:
            conn.send_nowait(frame)
        conn.send_nowait([b"gath", memoryview(b"ered")])
        sent[-1] = b"gathered"
        await client.wait_for(lambda: len(client.frames) == len(sent))
        assert server.sinks[0].frames == sent
        assert client.frames == sent

    simulate(body)


def test_close_is_reported_to_the_peer_after_the_frames_before_it() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        _, listener, server = await serve(net, nursery, echo=False)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        for frame in (b"one", b"two", b"three"):
            conn.send_nowait(frame)
        conn.close()
        conn.close()  # idempotent
        assert conn.closed
        assert client.lost == [None]
        peer = server.sinks[0]
        await peer.wait_for(lambda: peer.lost)
        assert peer.log[:3] == [("frame", b"one"), ("frame", b"two"), ("frame", b"three")]
        assert [type(e) for e in peer.lost] == [ConnectionBroken]
        closed_by_peer = (
            "connection to sim://h0 (connection 1) is broken: sim://h0 closed the connection"
        )
        assert str(peer.lost[0]) == closed_by_peer
        assert server.conns[0].closed
        with pytest.raises(ConnectionClosed, match=r"^connection to sim://h1/1 is closed$"):
            conn.send_nowait(b"after close")
        with pytest.raises(ConnectionBroken) as caught:
            server.conns[0].send_nowait(b"after the peer closed")
        assert str(caught.value) == closed_by_peer

    simulate(body)


def test_sink_error_closes_only_that_connection() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        _, listener, server = await serve(net, nursery)
        bad, good = Recorder(), Recorder()
        bad_conn = await a.connect(listener.address, bad)
        good_conn = await a.connect(listener.address, good)
        bad_conn.send_nowait(b"explode")
        await bad.wait_for(lambda: bad.lost)
        assert str(bad.lost[0]) == (
            "connection to sim://h1/1 is broken: sim://h1 closed the connection: "
            "ValueError('sink refuses this frame')"
        )
        with pytest.raises(ConnectionBroken) as caught:
            server.conns[0].send_nowait(b"after my sink failed")
        assert str(caught.value) == (
            "connection to sim://h0 (connection 1) is broken: ValueError('sink refuses this frame')"
        )
        assert [repr(e) for e in server.sinks[0].lost] == ["ValueError('sink refuses this frame')"]
        good_conn.send_nowait(b"still here")
        await good.wait_for(lambda: good.frames == [b"still here"])
        assert not good_conn.closed

    simulate(body)


def test_connect_to_nothing_fails_after_a_round_trip() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        net.set_latency(0.3)
        a = net.transport("h0", nursery)
        net.transport("h1", nursery)
        start = trio.current_time()
        with pytest.raises(
            ConnectionBroken, match=r"^cannot connect to sim://h1/nope: nothing listens there$"
        ):
            await a.connect("sim://h1/nope", Recorder())
        assert trio.current_time() - start == pytest.approx(0.6)
        with pytest.raises(ConnectionBroken, match="cannot connect to sim://nowhere/x"):
            await a.connect("sim://nowhere/x", Recorder())

    simulate(body)


def test_addresses_are_checked() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        for bad in ("tcp://h0/x", "sim://h0", "sim:///x", "h0/x"):
            with pytest.raises(
                ValueError,
                match=re.escape(f"sim address must look like sim://HOST/NAME (got {bad!r})"),
            ):
                await a.connect(bad, Recorder())
        with pytest.raises(
            ValueError,
            match=re.escape(
                "a sim transport on host 'h0' can only listen on sim://h0/NAME (got 'sim://h1/x')"
            ),
        ):
            await a.listen("sim://h1/x", Server())
        await a.listen("sim://h0/svc", Server())
        with pytest.raises(OSError, match=r"^sim address already in use: sim://h0/svc$"):
            await a.listen("sim://h0/svc", Server())
        # Fresh names skip the ones taken explicitly.
        await a.listen("sim://h0/1", Server())
        fresh = [(await a.listen("sim://h0/", Server())).address for _ in range(2)]
        assert fresh == ["sim://h0/2", "sim://h0/3"]
        with pytest.raises(ValueError, match="sim host names must be non-empty"):
            net.transport("h0/x", nursery)

    simulate(body)


def test_closed_listener_refuses_new_connections_and_keeps_old_ones() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        _, listener, _ = await serve(net, nursery)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        listener.close()
        listener.close()
        with pytest.raises(ConnectionBroken, match="nothing listens there"):
            await a.connect(listener.address, Recorder())
        await round_trip(conn, client)

    simulate(body)


def test_many_connections() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        _, listener, server = await serve(net, nursery, host="h0")
        clients = [net.transport(f"h{i}", nursery) for i in range(1, 6)]
        rng = random.Random(2)
        pairs: list[tuple[Connection, Recorder, list[bytes]]] = []
        for transport in clients:
            for _ in range(10):
                sink = Recorder()
                conn = await transport.connect(listener.address, sink)
                pairs.append((conn, sink, [rng.randbytes(rng.randrange(64)) for _ in range(20)]))
        for conn, _, frames in pairs:
            for frame in frames:
                conn.send_nowait(frame)
        for _, sink, frames in pairs:
            await sink.wait_for(lambda s=sink, f=frames: len(s.frames) == len(f))  # type: ignore[misc]
            assert sink.frames == frames
        assert len(server.sinks) == 50

    simulate(body)


def test_oversized_frame_breaks_the_connection_at_the_receiver() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        b = net.transport("h1", nursery, secret=b"ignored", max_frame_bytes=100)
        server = Server()
        listener = await b.listen("sim://h1/", server)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        conn.send_nowait(b"x" * 100)
        conn.send_nowait(b"x" * 101)
        await client.wait_for(lambda: client.lost)
        assert server.sinks[0].frames == [b"x" * 100]
        assert str(server.sinks[0].lost[0]) == (
            "connection to sim://h0 (connection 1) is broken: "
            "frame of 101 bytes exceeds max_frame_bytes=100"
        )
        assert "exceeds max_frame_bytes=100" in str(client.lost[0])

    simulate(body)


def test_sinks_run_in_the_context_of_the_process_that_made_the_transport() -> None:
    whose: contextvars.ContextVar[str] = contextvars.ContextVar("whose", default="nobody")
    seen: list[str] = []

    class Tagging(Server):
        def __call__(self, conn: Connection) -> Recorder:
            seen.append(f"accept:{whose.get()}")
            return super().__call__(conn)

    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        whose.set("server process")
        b = net.transport("h1", nursery)
        whose.set("client process")
        a = net.transport("h0", nursery)
        server = Tagging()
        listener = await b.listen("sim://h1/", server)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        await round_trip(conn, client)

    simulate(body)
    assert seen == ["accept:server process"]


def test_a_process_that_ends_breaks_its_connections_and_drops_its_listeners() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        async with trio.open_nursery() as process:
            b = net.transport("h1", process)
            listener = await b.listen("sim://h1/", Server())
            client = Recorder()
            conn = await a.connect(listener.address, client)
            await round_trip(conn, client)
            process.cancel_scope.cancel()
        await client.wait_for(lambda: client.lost)
        assert str(client.lost[0]) == (
            "connection to sim://h1/1 is broken: the process at sim://h1 exited"
        )
        with pytest.raises(ConnectionBroken, match="nothing listens there"):
            await a.connect(listener.address, Recorder())

    simulate(body)


# -- faults ------------------------------------------------------------------------------


def test_partition_breaks_connections_across_it_blocks_dials_and_heals() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a, c = net.transport("h0", nursery), net.transport("h2", nursery)
        _, listener, server = await serve(net, nursery)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        await round_trip(conn, client)
        cut = net.partition(["h0"], ["h1"])
        assert cut == 1
        assert conn.closed
        await client.wait_for(lambda: client.lost)
        await server.sinks[0].wait_for(lambda: server.sinks[0].lost)
        assert str(client.lost[0]) == (
            "connection to sim://h1/1 is broken: hosts h0 were partitioned from h1"
        )
        with pytest.raises(ConnectionBroken) as caught:
            conn.send_nowait(b"into the void")
        assert str(caught.value) == str(client.lost[0])
        start = trio.current_time()
        with pytest.raises(
            ConnectionBroken,
            match=re.escape(
                "cannot connect to sim://h1/1: timed out after 1.0 virtual seconds "
                "(host 'h1' is partitioned from 'h0' or crashed)"
            ),
        ):
            await a.connect(listener.address, Recorder())
        assert trio.current_time() - start == pytest.approx(1.0)
        # A host outside the cut is not affected.
        other = Recorder()
        await round_trip(await c.connect(listener.address, other), other)
        net.heal(cut)
        again = Recorder()
        await round_trip(await a.connect(listener.address, again), again)
        assert client.lost == [client.lost[0]]  # a broken connection stays broken, told once

    simulate(body)


def test_partition_with_a_duration_heals_by_itself() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a = net.transport("h0", nursery)
        _, listener, _ = await serve(net, nursery)
        net.partition(["h1"], ["h0"], duration=5.0)
        with pytest.raises(ConnectionBroken, match="timed out"):
            await a.connect(listener.address, Recorder())
        await trio.sleep_until(5.0)
        client = Recorder()
        await round_trip(await a.connect(listener.address, client), client)

    simulate(body)


def test_one_way_partition() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a, b = net.transport("h0", nursery), net.transport("h1", nursery)
        server = Server(echo=False)
        listener = await a.listen("sim://h0/svc", server)
        target = await b.listen("sim://h1/svc", Server())
        net.partition(["h0"], ["h1"], one_way=True)
        # h0 -> h1 is cut: h0 cannot dial h1.
        with pytest.raises(ConnectionBroken, match="timed out"):
            await a.connect(target.address, Recorder())
        # h1 -> h0 still flows: h1 dials h0 and is heard.
        client = Recorder()
        conn = await b.connect(listener.address, client)
        conn.send_nowait(b"heard")
        heard = server.sinks[0]
        await heard.wait_for(lambda: heard.frames == [b"heard"])
        # The first frame back from h0 is lost, and the connection breaks on both sides.
        server.conns[0].send_nowait(b"lost")
        await client.wait_for(lambda: client.lost)
        await heard.wait_for(lambda: heard.lost)
        assert client.frames == []
        reason = "a frame from 'h0' to 'h1' was lost to a partition"
        assert reason in str(client.lost[0])
        assert reason in str(heard.lost[0])

    simulate(body)


def test_disconnect_breaks_both_sides_of_every_connection_between_two_hosts() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a, c = net.transport("h0", nursery), net.transport("h2", nursery)
        _, listener, server = await serve(net, nursery)
        sinks = [Recorder(), Recorder()]
        for sink in sinks:
            await a.connect(listener.address, sink)
        bystander = Recorder()
        kept = await c.connect(listener.address, bystander)
        assert net.disconnect("h1", "h0") == 2
        for sink in [*sinks, *server.sinks[:2]]:
            await sink.wait_for(lambda s=sink: s.lost)  # type: ignore[misc]
            assert "hosts 'h1' and 'h0' were disconnected" in str(sink.lost[0])
        await round_trip(kept, bystander)
        assert server.sinks[2].lost == []
        assert net.disconnect("h1", "h0") == 0

    simulate(body)


def test_clog_holds_frames_then_delivers_them_in_order() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        net.set_latency(0.01)
        a, c = net.transport("h0", nursery), net.transport("h2", nursery)
        _, listener, server = await serve(net, nursery, echo=False)
        conn = await a.connect(listener.address, Recorder())
        bystander = Recorder()
        other = await c.connect(listener.address, bystander)
        conn.send_nowait(b"0")  # in flight when the clog starts: held too
        start = trio.current_time()
        net.clog("h0", 5.0)
        for i in range(1, 10):
            conn.send_nowait(str(i).encode())
            await trio.sleep(0.1)
        # Frames between other hosts go on: only frames from and to h0 are held.
        other.send_nowait(b"unclogged")
        sink = server.sinks[1]
        await sink.wait_for(lambda: sink.frames == [b"unclogged"])
        held = server.sinks[0]
        assert held.frames == []
        await held.wait_for(lambda: len(held.frames) == 10)
        assert held.frames == [str(i).encode() for i in range(10)]
        assert held.times == [pytest.approx(start + 5.0)] * 10
        assert round(trio.current_time() - start, 9) == 5.0
        conn.send_nowait(b"after")
        await held.wait_for(lambda: len(held.frames) == 11)
        assert held.times[-1] == pytest.approx(start + 5.01)

    simulate(body)


def test_frames_held_by_two_clogs_keep_their_order() -> None:
    """Frames held once, then again by a longer clog, stay ahead of frames held only once."""

    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        net.set_latency(0.01)
        a = net.transport("h0", nursery)
        _, listener, server = await serve(net, nursery, echo=False)
        conn = await a.connect(listener.address, Recorder())
        start = trio.current_time()
        net.clog("h0", 2.0)
        for i in range(5):
            conn.send_nowait(bytes([i]))
            await trio.sleep(0.1)
        await trio.sleep_until(start + 1.5)
        net.clog("h1", 2.5)  # the first five are held again at start + 2
        for i in range(5, 10):
            conn.send_nowait(bytes([i]))
            await trio.sleep(0.1)
        sink = server.sinks[0]
        await sink.wait_for(lambda: len(sink.frames) == 10)
        assert sink.frames == [bytes([i]) for i in range(10)]
        assert sink.times == [pytest.approx(start + 4.0)] * 10

    simulate(body)


def test_a_dial_that_breaks_on_its_way_back_tells_the_sink_nothing() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        net.set_latency(1.0)
        a = net.transport("h0", nursery)
        _, listener, server = await serve(net, nursery)
        client = Recorder()

        async def break_it() -> None:
            await server.accepted.wait()  # at 1.0; the answer reaches h0 at 2.0
            await trio.sleep(0.5)
            net.disconnect("h0", "h1")

        nursery.start_soon(break_it)
        with pytest.raises(
            ConnectionBroken,
            match=re.escape(
                "cannot connect to sim://h1/1: connection to sim://h1/1 is broken: "
                "hosts 'h0' and 'h1' were disconnected"
            ),
        ):
            await a.connect(listener.address, client)
        await trio.sleep(10)
        assert client.log == []
        assert [str(e) for e in server.sinks[0].lost] == [
            "connection to sim://h0 (connection 1) is broken: hosts 'h0' and 'h1' were disconnected"
        ]

    simulate(body)


def test_what_the_acceptor_sends_at_once_arrives_after_connect_returns() -> None:
    returned: list[float] = []

    class Greeter(Server):
        def __call__(self, conn: Connection) -> Recorder:
            conn.send_nowait(b"hello")
            return super().__call__(conn)

    class Checking(Recorder):
        def frame_received(self, conn: Connection, frame: memoryview) -> None:
            assert returned, "a frame reached the dialer's sink before connect() returned"
            super().frame_received(conn, frame)

    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        net.set_latency(0.001, 1.0)  # the greeting may be drawn faster than the answer
        a = net.transport("h0", nursery)
        b = net.transport("h1", nursery)
        listener = await b.listen("sim://h1/", Greeter())
        for _ in range(20):
            returned.clear()
            client = Checking()
            await a.connect(listener.address, client)
            returned.append(trio.current_time())
            await client.wait_for(lambda c=client: c.frames)  # type: ignore[misc]
            assert client.times[0] >= returned[0]

    simulate(body)


def test_crash_host_breaks_everything_to_it() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        a, b = net.transport("h0", nursery), net.transport("h1", nursery)
        c = net.transport("h2", nursery)
        server = Server()
        listener = await b.listen("sim://h1/svc", server)
        far = Server()
        far_listener = await c.listen("sim://h2/svc", far)
        into = Recorder()
        await a.connect(listener.address, into)
        out_of = Recorder()
        await b.connect(far_listener.address, out_of)
        net.crash_host("h1")
        for sink in (into, out_of, server.sinks[0], far.sinks[0]):
            await sink.wait_for(lambda s=sink: s.lost)  # type: ignore[misc]
            assert "host 'h1' crashed" in str(sink.lost[0])
        with pytest.raises(ConnectionBroken, match=r"timed out after 1.0 virtual seconds"):
            await a.connect(listener.address, Recorder())
        with pytest.raises(OSError, match=r"^cannot listen on sim://h1/x: host 'h1' has crashed$"):
            await b.listen("sim://h1/x", Server())
        with pytest.raises(ConnectionBroken, match="host 'h1' has crashed"):
            await b.connect(far_listener.address, Recorder())
        with pytest.raises(RuntimeError, match=re.escape("call restart_host('h1')")):
            net.transport("h1", nursery)
        net.restart_host("h1")
        reborn = net.transport("h1", nursery)
        await reborn.listen("sim://h1/svc", Server())  # the old listener vanished
        client = Recorder()
        await round_trip(await a.connect(listener.address, client), client)

    simulate(body)


def test_latency_sets_the_virtual_round_trip() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> tuple[float, float]:
        net.set_latency(0.25, between=("h1", "h0"))
        a = net.transport("h0", nursery)
        _, listener, _ = await serve(net, nursery)
        client = Recorder()
        start = trio.current_time()
        conn = await a.connect(listener.address, client)
        dial = trio.current_time() - start
        return dial, await round_trip(conn, client)

    assert simulate(body) == (0.5, 0.5)


def test_jittered_latency_is_drawn_per_frame_and_logged() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> list[float]:
        net.set_latency(0.1, 0.05)
        a = net.transport("h0", nursery)
        _, listener, _ = await serve(net, nursery)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        return [await round_trip(conn, client) for _ in range(20)]

    trips = simulate(body)
    assert all(0.2 <= t < 0.3 for t in trips)
    assert len(set(trips)) > 10
    # Each "send ... at T" in the log is the time the frame was delivered.
    _, _, events = run_deterministic(lambda rng: _one_frame(rng), 5)
    (send,) = [e for e in events if e.kind == "send"]
    (deliver,) = [e for e in events if e.kind == "deliver"]
    assert send.detail.endswith(f"at {deliver.time:.9f}")
    assert 0.1 <= deliver.time - send.time < 0.15


async def _one_frame(rng: random.Random) -> None:
    net = SimNetwork(rng, latency=Latency(0.1, 0.05))
    async with trio.open_nursery() as nursery:
        a = net.transport("h0", nursery)
        _, listener, server = await serve(net, nursery, echo=False)
        (await a.connect(listener.address, Recorder())).send_nowait(b"x")
        await server.accepted.wait()
        await server.sinks[0].wait_for(lambda: server.sinks[0].frames)
        nursery.cancel_scope.cancel()


def test_an_hour_of_virtual_time_takes_well_under_a_second() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> float:
        net.set_latency(0.05, 0.01)
        a = net.transport("h0", nursery)
        _, listener, _ = await serve(net, nursery)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        for _ in range(60):
            await trio.sleep(60)
            await round_trip(conn, client)
        return trio.current_time()

    real = time.perf_counter()
    virtual = simulate(body)
    real = time.perf_counter() - real
    assert virtual > 3600
    assert real < 1.0


def test_delay_fault_adds_latency_for_a_while() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> list[float]:
        net.set_latency(0.1)
        a = net.transport("h0", nursery)
        _, listener, _ = await serve(net, nursery)
        client = Recorder()
        conn = await a.connect(listener.address, client)
        net.delay("h1", "h0", 2.0, duration=10)
        slow = await round_trip(conn, client)
        await trio.sleep(10)
        return [slow, await round_trip(conn, client)]

    assert simulate(body) == [pytest.approx(4.2), pytest.approx(0.2)]


def test_zero_faults_are_no_faults() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> list[str]:
        net.transport("h0", nursery)
        net.transport("h1", nursery)
        before = len(net.events)
        assert net.partition(["h0"], ["h1"], duration=0) == 0
        assert net.partition([], ["h1"]) == 0
        net.clog("h0", 0)
        net.delay("h0", "h1", 0, 10)
        net.delay("h0", "h1", 1, 0)
        await net.run_faults([PartitionFault(0, 0, ("h0",), ("h1",))])
        await net.run_faults()  # zero rates: returns at once, draws nothing
        return [str(e) for e in net.events[before:]]

    assert simulate(body) == []
    assert Faults().total_rate == 0


def test_random_faults_happen_at_their_rates() -> None:
    async def body(net: SimNetwork, nursery: trio.Nursery) -> set[str]:
        for host in ("h0", "h1", "h2"):
            await serve(net, nursery, host)
        with trio.move_on_after(200):
            await net.run_faults()
        return {e.kind for e in net.events}

    kinds = simulate(body, faults=Faults(delay=0.1, disconnect=0.1, partition=0.1, clog=0.1))
    assert {"delay", "disconnect", "partition", "clog"} <= kinds


def test_bad_fault_values_are_refused() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Faults.partition must be a finite rate per simulated second >= 0 (got -1)"
        ),
    ):
        Faults(partition=-1)
    with pytest.raises(ValueError, match=r"Latency.base must be a finite latency in seconds"):
        Latency(base=float("nan"))
    with pytest.raises(ValueError, match=r"PartitionFault.duration must be a duration >= 0"):
        PartitionFault(0, -1, ("h0",), ("h1",))
    with pytest.raises(TypeError, match=r"rng must be a seeded random.Random"):
        SimNetwork(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="connect_timeout must be a positive number"):
        SimNetwork(random.Random(), connect_timeout=0)

    async def body(net: SimNetwork, nursery: trio.Nursery) -> None:
        with pytest.raises(
            ValueError, match=re.escape("partition sides must not share hosts (both have ['h1'])")
        ):
            net.partition(["h0", "h1"], ["h1"])
        with pytest.raises(LookupError, match="no partition with id 7"):
            net.heal(7)
        net.heal(0)  # what a partition that was no fault returns: heals nothing

    simulate(body)
