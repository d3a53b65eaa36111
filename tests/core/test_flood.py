"""Back-pressure: a port flooded by a fast producer never grows a sender's memory without
bound and never loses a message.

A session keeps at most ``send_window`` frames in flight (``core/_delivery.py``); what is
queued beyond waits in the sender, at most ``send_buffer_bytes`` of it. Past that a thread
that sends waits for acknowledgements to make room; a sender on the runtime's loop, which
cannot wait (it would wait for itself), gets ``SendBufferFull`` naming the peer and the
bound. Either way what was sent arrives, in order, once."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from regency.actor import ProcMesh
from regency.core import _config
from regency.core._config import overridden
from regency.core._delivery import (
    CONNECTED,
    FAILED,
    SEND_NOW,
    Outbound,
    Transmit,
)

from ..conftest import SpawnProcs, stop_and_wait
from .flood_actors import Flooder, Sink

T = 30
WINDOW = 1100  # (the least is above the receivers' 1,024 frames between acknowledgements)
BUFFER = 64 * 1024
SIZE = 1024


# -- the machine (fast tier) ---------------------------------------------------------------


def _connected(**kwargs: Any) -> Outbound:
    sender = Outbound("s", **kwargs)
    dial = sender.queued(b"")
    assert dial is not None and not isinstance(dial, type(SEND_NOW))
    assert sender.begin_dial(dial)  # type: ignore[arg-type]
    sender.connected("link")
    sender.acknowledged(1)
    assert sender.state == CONNECTED and not sender.unacked
    return sender


def test_frames_past_the_window_wait_and_go_as_acknowledgements_come() -> None:
    sender = _connected(window=3, size_of=len)
    frames = [bytes([i]) * 4 for i in range(5)]
    actions = [sender.queued(f, 4) for f in frames]
    assert actions == [SEND_NOW, SEND_NOW, SEND_NOW, None, None]
    assert list(sender.pending) == frames[3:] and sender.pending_bytes == 8
    assert sender.queued_count == 6  # numbered as queued (after the first, b""): in order
    assert sender.acknowledged(3) == [Transmit("link", tuple(frames[3:]))]
    assert not sender.pending and sender.pending_bytes == 0
    assert list(sender.unacked) == frames[2:] and sender.unacked_bytes == 12


def test_the_byte_window_lets_one_big_frame_go_alone() -> None:
    sender = _connected(window=100, window_bytes=10, size_of=len)
    assert sender.queued(b"a" * 6, 6) is SEND_NOW
    assert sender.queued(b"b" * 6, 6) is None  # 12 bytes would be in flight
    assert sender.acknowledged(2) == [Transmit("link", (b"b" * 6,))]
    assert sender.queued(b"c" * 50, 50) is None  # behind what is in flight
    assert sender.acknowledged(3) == [Transmit("link", (b"c" * 50,))]  # alone: bigger
    assert sender.unacked_bytes == 50


def test_room_is_bounded_by_the_buffer_and_a_failed_session_has_room_to_raise() -> None:
    sender = _connected(window=1, buffer_bytes=10, size_of=len)
    assert sender.queued(b"x", 1) is SEND_NOW
    assert sender.has_room(100)  # nothing waits: even a frame bigger than the buffer
    assert sender.queued(b"y" * 8, 8) is None
    assert sender.has_room(2) and not sender.has_room(3)
    sender.give_up(ConnectionError("gone"))
    assert sender.state == FAILED and sender.has_room(3)
    assert sender.pending_bytes == sender.unacked_bytes == 0


def test_the_window_is_above_what_receivers_acknowledge_at_and_configurable() -> None:
    from regency.core import _inbound

    assert _config.ACK_EVERY == _inbound._ACK_EVERY
    with pytest.raises(ValueError, match="send_window must be an int above 1024"):
        _config.configure(send_window=1024)
    with overridden(send_window=5000, send_buffer_bytes=1 << 20) as config:
        assert (config.send_window, config.send_buffer_bytes) == (5000, 1 << 20)


def test_a_reconnect_resends_what_is_unacknowledged_and_admits_within_the_window() -> None:
    sender = _connected(window=2, size_of=len)
    for f in (b"a", b"b", b"c", b"d"):
        sender.queued(f, 1)
    (dial,) = sender.lost("link", ConnectionError("cut"))
    assert sender.begin_dial(dial)  # type: ignore[arg-type]
    (transmit,) = sender.connected("link2")
    assert isinstance(transmit, Transmit) and transmit.frames == (b"a", b"b")
    assert transmit.resume_at == 1 and list(sender.pending) == [b"c", b"d"]
    assert sender.acknowledged(2) == [Transmit("link2", (b"c",))]
    assert sender.acknowledged(3) == [Transmit("link2", (b"d",))]
    assert sender.acknowledged(5) == [] and not sender.unacked


# -- real procs --------------------------------------------------------------------------


@pytest.fixture
def meshes(spawn_procs: SpawnProcs) -> tuple[ProcMesh, Any, Any]:
    # Procs (and this controller's outboxes to them) take the small bounds.
    with overridden(send_window=WINDOW, send_buffer_bytes=BUFFER):
        procs = spawn_procs({"gpus": 2})
        sink = procs.slice(gpus=0).spawn("sink", Sink)
        flooder = procs.slice(gpus=1).spawn("flooder", Flooder)
        sink.pid.call_one().get(T)  # (the controller's link to it is up, with the bounds)
    return procs, sink, flooder


@pytest.mark.slow
def test_a_thread_that_floods_a_stopped_proc_waits_and_loses_nothing(
    meshes: tuple[ProcMesh, Any, Any],
) -> None:
    _, sink, _ = meshes
    port = sink.open.call_one().get(T)
    pid = sink.pid.call_one().get(T)
    n = 3000
    sent = [0]
    blob = b"x" * SIZE

    def flood() -> None:
        for seq in range(n):
            port.send((seq, blob))
            sent[0] = seq + 1

    stop_and_wait(pid)
    try:
        thread = threading.Thread(target=flood, daemon=True)
        thread.start()
        time.sleep(0.5)
        held = sent[0]
        # It waits for room: what it queued is bounded by the window and the buffer.
        assert thread.is_alive() and WINDOW < held <= WINDOW + BUFFER // SIZE + 1, held
    finally:
        os.kill(pid, signal.SIGCONT)
    thread.join(T)
    assert not thread.is_alive() and sent[0] == n
    assert sink.drain.call_one(n).get(T) == (n, [])


@pytest.mark.slow
def test_a_loop_sender_past_the_buffer_gets_a_clear_error_and_loses_nothing(
    meshes: tuple[ProcMesh, Any, Any],
) -> None:
    _, sink, flooder = meshes
    port = sink.open.call_one().get(T)
    # The flooder never yields, so its loop never reads an acknowledgement: past the
    # window and the buffer it must be told, not buffer on.
    sent, error = flooder.flood.call_one(port, 100_000, SIZE).get(T)
    # (The window too if the link was up; else it is dialed by the loop, after the flood.)
    assert BUFFER // (2 * SIZE) < sent <= WINDOW + BUFFER // SIZE + 1, sent
    assert f"send_buffer_bytes={BUFFER}" in error and "wait for it to acknowledge" in error
    assert "regency.configure" in error
    assert sink.drain.call_one(sent).get(T) == (sent, [])  # all of it, in order, once
    # The link is fine afterwards: the next values go through.
    sent2, error2 = flooder.flood.call_one(port, 10, SIZE).get(T)
    assert (sent2, error2) == (10, "")


# -- the simulator -------------------------------------------------------------------------


def test_a_simulated_thread_past_the_buffer_waits_for_room_and_loses_nothing() -> None:
    """The same wait for room in a simulation: the program's lockstep thread sends far
    faster than acknowledgements come (virtual time stands still while it runs), so past
    the window and the buffer it waits through its waiter, in lockstep, and nothing is lost
    or reordered."""
    from regency.sim import simulate

    n = 3000
    blob = b"x" * SIZE

    def program(hosts: Any) -> tuple[int, list[str]]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        sink = procs.slice(hosts=0).spawn("sink", Sink)
        port = sink.open.call_one().get()
        for seq in range(n):  # (3 MiB: past the 64 KiB buffer many times over)
            port.send((seq, blob))
        result: tuple[int, list[str]] = sink.drain.call_one(n).get()
        return result

    with overridden(send_window=WINDOW, send_buffer_bytes=BUFFER):
        assert simulate(program, seed=5, hosts=1).value == (n, [])
