"""A proc gives back the memory of a big message once it has handled it, whatever reads its
connection: an idle proc used to keep about twice its last big message
(the last call, held by the actor's mailbox loop and its driver, and the reader's big
receive buffer, never released while an idle actor thread led the connection) until its
next message. Measured on the receiving proc, from ``/proc/PID/status``; and on the
transport alone, with a thread leading the receiving connection as an idle actor thread
does."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

import pytest
import trio

from regency.transports import _shm, open_transport
from regency.transports._sockets import SocketConnection
from tests.conftest import SpawnProcs

from .big_message_actors import AsyncSink, MixedSink, SyncSink
from .lane_actors import lane_frames, placed_since
from .test_conformance import SECRET, address_for
from .test_memory import _rss, _Sizes

T = 60
MiB = 1 << 20
BIG = 200 * 1000 * 1000  # the report's 200 MB argument
#: Back near the baseline: what a proc may keep above it once idle.
SLACK = 60 * MiB
#: Within this long after the reply (2 s), plus a little on a loaded machine.
WITHIN = 2.0
LOADED = 1.5

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="reads RSS from /proc"
)


def _status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` field in bytes (``VmRSS``, ``RssShmem``, ...)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _settles(pid: int, field: str, target: int, within: float) -> tuple[bool, float, int]:
    """Poll ``field`` of ``pid`` until it is at most ``target`` or ``within`` seconds have
    passed: (whether it got there, seconds taken, the last value)."""
    start = time.monotonic()
    while True:
        value = _status(pid, field)
        took = time.monotonic() - start
        if value <= target:
            return True, took, value
        if took >= within:
            return False, took, value
        time.sleep(0.02)


def _allowance() -> float:
    """``WITHIN``, with ``LOADED`` more when the machine has more runnable work than CPUs
    (other test runs on this host): the release timers are trio's, and a starved proc's
    loop wakes late. Never enough to hide memory kept until the next message."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return WITHIN
    return WITHIN + (LOADED if running > (os.cpu_count() or 1) else 0.0)


async def test_the_big_buffer_goes_while_a_thread_leads(sockdir: str) -> None:
    async with open_transport(SECRET) as transport:
        server = _Sizes()
        listener = await transport.listen(address_for("unix", sockdir), server)
        conn = await transport.connect(listener.address, _Sizes())
        conn.send_nowait(b"warm up")
        await server.wait_for(lambda: len(server.sizes) == 1)
        receiving = server.conns[0]
        assert isinstance(receiving, SocketConnection)
        gc.collect()
        before = _rss()
        data = b"\x01" * (48 * MiB)  # (over the lane's ring: through the socket)
        conn.send_nowait(data)
        del data
        await server.wait_for(lambda: len(server.sizes) == 2)
        # A thread takes over reading as soon as the reader task waits (as an idle actor
        # thread does after its call), and keeps it: it never meets an empty socket for
        # the loop, nor hands the connection back, while it idles.
        with trio.fail_after(10):
            while not await trio.to_thread.run_sync(receiving.lead):
                await trio.sleep(0.001)
        start = trio.current_time()
        try:
            with trio.move_on_after(WITHIN + LOADED):
                while True:
                    gc.collect()
                    kept = _rss() - before
                    if kept < 24 * MiB:
                        break
                    await trio.sleep(0.05)
            took = trio.current_time() - start
            assert kept < 24 * MiB, f"{kept / MiB:.0f} MiB kept {took:.1f} s after a 48 MiB frame"
        finally:
            await trio.to_thread.run_sync(receiving.give_back)
        # The connection goes on (the reader task takes it back; a big frame again).
        conn.send_nowait(b"\x02" * (20 * MiB))
        conn.send_nowait(b"after")
        await server.wait_for(lambda: len(server.sizes) == 4)
        assert server.sizes[1:] == [48 * MiB, 20 * MiB, 5]


@pytest.mark.slow
@pytest.mark.parametrize(
    "actor, thread_reads",
    [
        (SyncSink, True),  # the idle actor thread leads the connection (the default)
        (SyncSink, False),  # the loop reads everything
        (AsyncSink, True),  # an all-async actor: a trio task drives its mailbox
        (MixedSink, True),  # an actor thread that awaits an async endpoint on the loop
    ],
    ids=["sync", "sync-loop-reads", "async", "thread-async-endpoint"],
)
def test_an_idle_proc_gives_back_a_big_message(
    actor: type, thread_reads: bool, spawn_procs: SpawnProcs,
    configured: Callable[..., None],
) -> None:
    configured(thread_reads=thread_reads)
    sink = spawn_procs({"gpus": 1}).spawn("sink", actor).slice(gpus=0)
    pid = sink.pid.call_one().get(T)
    # Warm: the endpoint has run once (imports, caches), with a small argument.
    assert sink.length.call_one(b"x" * 1000).get(T) == 1000
    time.sleep(0.2)
    baseline = _status(pid, "VmRSS")
    data = b"\x01" * BIG
    placed = lane_frames()
    assert sink.length.call_one(data).get(T) == BIG
    del data
    # Bigger than the shared-memory lane's ring (16 MiB): it went through the socket, into
    # the receiving reader's big buffer (the loop's: a thread hands such a frame back).
    assert placed_since(placed, lane_frames()) == 0
    after = _status(pid, "VmRSS")
    # The message was there (else the test would pass for nothing): the proc's peak.
    peak = _status(pid, "VmHWM")
    assert peak - baseline > BIG // 2, f"peak {peak / MiB:.0f} MiB, baseline {baseline / MiB:.0f}"
    within = _allowance()
    back, took, rss = _settles(pid, "VmRSS", baseline + SLACK, within)
    print(
        f"\n{actor.__name__} thread_reads={thread_reads}: baseline {baseline / MiB:.0f} MiB, "
        f"peak {peak / MiB:.0f} MiB, after the call {after / MiB:.0f} MiB, {rss / MiB:.0f} MiB "
        f"{took:.2f} s later"
    )
    assert back, (
        f"the proc kept {(rss - baseline) / MiB:.0f} MiB above its baseline of "
        f"{baseline / MiB:.0f} MiB {took:.1f} s after a {BIG // 1000000} MB message"
    )
    # Still serving, and it takes the next big message as well.
    assert sink.length.call_one(b"\x02" * (BIG // 4)).get(T) == BIG // 4
    back, took, rss = _settles(pid, "VmRSS", baseline + SLACK, within)
    assert back, f"{(rss - baseline) / MiB:.0f} MiB kept {took:.1f} s after the second message"


@pytest.mark.slow
@pytest.mark.skipif(not _shm.available(), reason="no memfd seals on this platform")
def test_the_shared_memory_lane_gives_its_pages_back(
    spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    # Frames of 64 KiB up to the 16 MiB ring go through shared memory: 12 MiB arguments
    # and replies touch the rings of both directions, both mapped by the proc (its own,
    # which its writer task gives back, and this process's, which ours does).
    configured(shm_lane=True)
    sink = spawn_procs({"gpus": 1}).spawn("sink", SyncSink).slice(gpus=0)
    pid = sink.pid.call_one().get(T)
    assert sink.length.call_one(b"x" * 1000).get(T) == 1000
    time.sleep(0.2)
    shared, rss = _status(pid, "RssShmem"), _status(pid, "VmRSS")
    size = 12 * MiB
    placed = lane_frames()
    for i in range(3):
        data = bytes([i]) * size
        assert sink.length.call_one(data).get(T) == size
        assert sink.echo.call_one(data).get(T) == data
    del data
    assert placed_since(placed, lane_frames()) == 6  # (the lane took them)
    touched = _status(pid, "RssShmem") - shared
    assert touched >= size, f"the proc mapped the rings: {touched / MiB:.1f} MiB shared"
    within = _allowance()
    back, took, now = _settles(pid, "RssShmem", shared + 2 * MiB, within)
    assert back, f"ring pages kept: {(now - shared) / MiB:.1f} MiB {took:.1f} s after the calls"
    back, took, now = _settles(pid, "VmRSS", rss + SLACK, within)
    assert back, f"{(now - rss) / MiB:.0f} MiB kept {took:.1f} s after the calls"
