"""A conformance check of the thread-read seam (``regency.transports.ThreadReadable``).

Every transport runs :func:`check_thread_reads` against one of its connections. A connection
that declares itself readable by threads (``readable_by_threads``) must keep the contract
below; one that does not must still deliver every frame, in order, once, through its loop
(whether its loop offers a frame to ``frame_on_thread`` first, as the simulator's does, is
its own affair).

The contract, for a readable connection (the accepting side of a fresh connection, its sink
a :class:`regency.transports.ThreadSink` that takes frames starting with ``T`` on a thread
and leaves the rest to the loop):

* ``thread_readable(conn)`` is the connection itself, ``fileno()`` an open descriptor;
* once the loop is idle on it, a thread's ``lead`` succeeds and a second ``lead`` fails (one
  reader at a time), as does ``reclaim`` of a connection a thread leads;
* the leading thread's ``read_led`` hands the thread's frames to ``frame_on_thread`` in order;
  at a frame left to the loop it gives the connection back, and that frame and every one after
  it reach ``frame_received`` on the loop, in order;
* given back with nothing unread, the loop reads what comes next by itself;
* held (``hold``), nothing reads it: the next ``lead`` reads what came meanwhile on its
  thread; ``reclaim`` gives what came to the loop, once (a second ``reclaim`` is refused);
* a frame bigger than anything a thread reads at once arrives whole and in order, by either
  reader;
* under random interleavings of a thread leading, reading, holding and giving back, the loop
  reclaiming, and the peer sending bursts, every frame is handled exactly once, in order;
* the end of the stream while a thread leads hands the connection back; the loop reports the
  loss once, after every frame sent before it; a closed connection is not led;
* (every connection) ``send_nowait(frame, answer=True)`` is accepted and keeps the order.

The world the check runs in is injected (:class:`ThreadWorld`): how one call of the seam
runs as a thread's (production: on a real thread; a simulation: in lockstep with its loop),
how the check waits until a connection has something for the thread that leads it
(production: ``poll`` on ``fileno()``, on a thread), and how it waits until the loop's tasks
are idle. Each thread-side call of the seam is one ``on_thread``, so a world may interleave
the loop between any two of them. Nothing here reaches for a socket or a clock itself.
"""

from __future__ import annotations

import random
import select
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import trio
import trio.testing

from ..transports import (
    Connection,
    ThreadReadable,
    Transport,
    thread_readable,
)

T = TypeVar("T")

#: Seconds (of the world's clock) any single wait of the check may take.
PATIENCE = 30.0
#: Frames the random interleaving sends.
STRESS_FRAMES = 400


class ThreadWorld(Protocol):
    """What the check needs from the world it runs in (all called on the loop)."""

    async def on_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one call of the seam) as a thread that waits for a reply would, and
        return its result."""
        ...

    async def readable(self, conn: ThreadReadable, timeout: float) -> bool:
        """Wait until ``conn``, led by the check's thread, has something to read (True), or
        ``timeout`` seconds passed (False)."""
        ...

    async def settle(self) -> None:
        """Return once the loop's tasks are idle (a reader task waits for data)."""
        ...


class RealThreads:
    """Production's world: a worker thread per call, ``poll`` on the connection's
    descriptor (on a worker thread), and ``trio.testing.wait_all_tasks_blocked``."""

    async def on_thread(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(fn)

    async def readable(self, conn: ThreadReadable, timeout: float) -> bool:
        def poll() -> bool:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            return bool(poller.poll(max(0, int(timeout * 1000))))

        return await trio.to_thread.run_sync(poll)

    async def settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()


class _Recorder:
    """The accepting side's sink: takes ``T`` frames on a thread, leaves the rest to the loop;
    records who handled what, and the losses."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.lost: list[BaseException | None] = []
        self.conn: Connection | None = None
        self.thread_calls = 0
        self.changed = trio.Event()
        self.accepted = trio.Event()
        self._loop_thread = threading.get_ident()

    def __call__(self, conn: Connection) -> _Recorder:
        assert self.conn is None, "one connection per check"
        self.conn = conn
        self.accepted.set()
        return self

    def frame_on_thread(self, conn: Connection, frame: memoryview) -> bool:
        self.thread_calls += 1
        if bytes(frame[:1]) != b"T":
            return False
        self.seen.append(("thread", bytes(frame)))
        if threading.get_ident() == self._loop_thread:  # (a loop that offers frames)
            self._poke()
        return True

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        self.seen.append(("loop", bytes(frame)))
        self._poke()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        self.lost.append(exc)
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, pred: Callable[[], bool], what: str) -> None:
        with trio.move_on_after(PATIENCE):
            while not pred():
                await self.changed.wait()
            return
        raise AssertionError(f"{what} (after {PATIENCE} s; seen: {self.seen[-8:]})")

    def frames(self) -> list[bytes]:
        return [frame for _, frame in self.seen]


class _Quiet:
    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        pass

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


async def check_thread_reads(
    transport: Transport,
    address: str,
    *,
    world: ThreadWorld | None = None,
    seed: int = 0,
) -> bool:
    """Open a connection to a listener at ``address`` on ``transport`` and check the seam's
    contract on its accepting side (AssertionError naming the rule broken). Returns whether
    that connection is readable by threads. Runs on the transport's trio loop; ``world``
    defaults to :class:`RealThreads`, ``seed`` drives the random interleaving."""
    world = RealThreads() if world is None else world
    sink = _Recorder()
    listener = await transport.listen(address, sink)
    try:
        client = await transport.connect(listener.address, _Quiet())
        with trio.fail_after(PATIENCE):
            await sink.accepted.wait()
        conn = sink.conn
        assert conn is not None
        readable = thread_readable(conn)
        assert isinstance(conn.readable_by_threads, bool), (
            f"{type(conn).__name__}.readable_by_threads must be a bool "
            f"(got {conn.readable_by_threads!r})"
        )
        if readable is None:
            assert not conn.readable_by_threads
            await _check_loop_only(client, sink)
            return False
        assert id(readable) == id(conn) and conn.readable_by_threads
        await _check_readable(client, readable, sink, world, random.Random(seed))
        return True
    finally:
        listener.close()


async def _check_loop_only(client: Connection, sink: _Recorder) -> None:
    sent = [b"%s%d" % (b"TN"[i % 2 : i % 2 + 1], i) for i in range(200)]
    for i, frame in enumerate(sent):
        client.send_nowait(frame, answer=i % 7 == 0)  # (an answer goes in order too)
    await sink.wait_for(
        lambda: len(sink.seen) >= len(sent), "a connection no thread reads lost frames"
    )
    assert sink.frames() == sent, "a connection no thread reads reordered or duplicated frames"
    client.close()
    await sink.wait_for(lambda: bool(sink.lost), "the end of the stream went unreported")
    assert len(sink.lost) == 1


async def _lead(world: ThreadWorld, conn: ThreadReadable) -> bool:
    """Lead ``conn`` from a thread once the loop is idle on it."""
    await world.settle()
    return await world.on_thread(conn.lead)


async def _read_until_handed_back(world: ThreadWorld, conn: ThreadReadable) -> int:
    """Read on the leading thread until ``read_led`` gives the connection back; the reads."""
    reads = 0
    while reads < 10_000 and await world.readable(conn, PATIENCE):
        reads += 1
        if not await world.on_thread(conn.read_led):
            return reads
    raise AssertionError("the leading thread was never handed a frame for the loop")


async def _read_until(
    world: ThreadWorld, conn: ThreadReadable, sink: _Recorder, count: int
) -> bool:
    """Read on the leading thread until ``sink`` saw ``count`` frames; False if the
    connection went back to the loop first."""
    while len(sink.seen) < count:
        if not await world.readable(conn, PATIENCE):
            raise AssertionError(f"nothing to read for frame {count} on the leading thread")
        if not await world.on_thread(conn.read_led):
            return False
    return True


async def _check_readable(
    client: Connection,
    conn: ThreadReadable,
    sink: _Recorder,
    world: ThreadWorld,
    rng: random.Random,
) -> None:
    fd = conn.fileno()
    assert isinstance(fd, int) and fd >= 0, f"fileno() must be a descriptor (got {fd!r})"

    client.send_nowait(b"L0", answer=True)
    await sink.wait_for(lambda: len(sink.seen) == 1, "the first frame never reached the loop")

    # One reader at a time.
    assert await _lead(world, conn), "lead() failed on a connection whose loop is idle"
    assert not await world.on_thread(conn.lead), "a second lead() succeeded: two readers"
    assert not conn.reclaim(), "reclaim() took a connection a thread leads"

    # The thread's frames on the thread, in order; at the loop's frame, back to the loop.
    for frame in (b"T1", b"T2", b"N3", b"T4"):
        client.send_nowait(frame)
    await _read_until_handed_back(world, conn)
    # (before anything more comes: what the thread left unread wakes the loop by itself)
    await sink.wait_for(lambda: len(sink.seen) == 5, "frames left to the loop never came")
    client.send_nowait(b"T5")
    await sink.wait_for(lambda: len(sink.seen) == 6, "the loop stopped reading")
    expected = [
        ("loop", b"L0"), ("thread", b"T1"), ("thread", b"T2"), ("loop", b"N3"),
        ("loop", b"T4"), ("loop", b"T5"),
    ]
    assert sink.seen == expected, f"expected {expected}, got {sink.seen}"

    # Given back idle: the loop reads on by itself.
    for i in range(5):
        assert await _lead(world, conn), "lead() failed after a give_back"
        await world.on_thread(conn.give_back)
        client.send_nowait(b"L%d" % i)
        await sink.wait_for(
            _count_is(sink, len(expected) + i + 1),
            "the loop did not read after the connection was given back",
        )
        assert sink.seen[-1] == ("loop", b"L%d" % i)
    count = len(sink.seen)

    # Held: no one reads; the next lead reads what came; reclaim gives it to the loop once.
    assert await _lead(world, conn)
    await world.on_thread(conn.hold)
    client.send_nowait(b"T6")
    await world.settle()
    assert len(sink.seen) == count, f"a held connection was read by the loop: {sink.seen[-1]}"
    assert await world.on_thread(conn.lead), "lead() failed on a held connection"
    assert await _read_until(world, conn, sink, count + 1), (
        "the thread that led a held connection could not read its frame"
    )
    assert sink.seen[-1] == ("thread", b"T6"), f"got {sink.seen[-1]} for T6"
    await world.on_thread(conn.hold)
    client.send_nowait(b"T7")
    assert conn.reclaim(), "reclaim() refused a held connection"
    assert not conn.reclaim(), "a second reclaim() took it again"
    await sink.wait_for(lambda: len(sink.seen) == count + 2, "a reclaimed connection went unread")
    assert sink.seen[-1] == ("loop", b"T7"), f"got {sink.seen[-1]} for T7"

    # A frame bigger than a read: whole, in order, by either reader.
    assert await _lead(world, conn)
    big = b"T" + bytes(rng.getrandbits(8) for _ in range(64)) * (3 << 14)  # 3 MiB
    client.send_nowait(big)
    client.send_nowait(b"T8")
    count = len(sink.seen)
    kept = await _read_until(world, conn, sink, count + 2)
    if kept:
        await world.on_thread(conn.give_back)
    await sink.wait_for(lambda: len(sink.seen) == count + 2, "a big frame was lost")
    assert sink.frames()[-2:] == [big, b"T8"], "a big frame came broken or out of order"

    await _stress(client, conn, sink, world, rng)

    # The end of the stream while a thread leads: back to the loop, which reports it.
    assert await _lead(world, conn)
    client.send_nowait(b"T9")
    client.close()
    count = len(sink.seen)
    await _read_until_handed_back(world, conn)
    await sink.wait_for(lambda: bool(sink.lost), "the end of the stream went unreported")
    assert sink.frames()[count:] == [b"T9"], f"frames around the end: {sink.seen[count:]}"
    assert len(sink.lost) == 1, f"the loss was reported {len(sink.lost)} times"
    assert conn.closed and not conn.lead(), "a closed connection was led"


async def _stress(
    client: Connection,
    conn: ThreadReadable,
    sink: _Recorder,
    world: ThreadWorld,
    rng: random.Random,
) -> None:
    """Random interleavings of the thread's moves, the loop's reclaims and the peer's
    bursts; every frame once, in order."""
    first = len(sink.seen)
    sent: list[bytes] = []

    def send(n: int) -> None:
        for _ in range(n):
            kind = b"N" if rng.random() < 0.15 else b"T"
            frame = b"%s%d" % (kind, len(sent))
            sent.append(frame)
            client.send_nowait(frame)

    async def thread_turn(moves: list[str]) -> None:
        """The leading thread reads a few times, then holds or gives back."""
        for move in moves:
            if (
                move == "read"
                and await world.readable(conn, 0.005)
                and not await world.on_thread(conn.read_led)
            ):
                return  # handed back
        await world.on_thread(conn.hold if moves[-1] == "hold" else conn.give_back)

    while len(sent) < STRESS_FRAMES:
        send(rng.randrange(1, 12))
        if rng.random() < 0.2:
            conn.reclaim()
        if rng.random() < 0.3:
            await world.settle()
        if await world.on_thread(conn.lead):
            moves = ["read"] * rng.randrange(0, 4) + [rng.choice(["hold", "give_back"])]
            send(rng.randrange(0, 4))
            await thread_turn(moves)
        if rng.random() < 0.1:
            await world.settle()
    conn.reclaim()
    await sink.wait_for(
        lambda: len(sink.seen) - first >= len(sent),
        f"frames were lost in the interleaving ({len(sink.seen) - first} of {len(sent)})",
    )
    got = sink.frames()[first:]
    assert got == sent, "frames were reordered or duplicated in the interleaving: " + _diff(
        sent, got
    )
    for who, frame in sink.seen[first:]:
        assert who == "loop" or frame.startswith(b"T"), f"{frame!r} handled by the {who}"


def _count_is(sink: _Recorder, n: int) -> Callable[[], bool]:
    return lambda: len(sink.seen) == n


def _diff(sent: list[bytes], got: list[bytes]) -> str:
    for i, (a, b) in enumerate(zip(sent, got, strict=False)):
        if a != b:
            return f"at {i}: sent {a!r}, handled {b!r}"
    return f"sent {len(sent)}, handled {len(got)}"
