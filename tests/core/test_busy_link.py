"""A busy proc keeps its links.

A proc whose Python code holds the GIL in one long C call answers nothing: no heartbeat, no
acknowledgement, no handshake for a new connection. Its spawner's watchdog already tells
"busy" (silent, CPU time advancing, not stopped) from "stuck"; its senders now take that
verdict too (``Runtime.peer_busy``): one that sees no acknowledgement for the delivery
timeout keeps the connection and waits while the peer is busy, so the call completes when
the C call returns; a stopped (or dead) peer is still given up. Timeouts here are a
twentieth of the defaults, so the GIL is held for several delivery timeouts."""

from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
import time
from typing import Any

import pytest

from regency.actor import ActorError, ProcMesh
from regency.core._children import _listener_pid
from regency.core._config import overridden
from regency.core._delivery import CONNECTED, Close, Dial, Outbound

from ..conftest import SpawnProcs, stop_and_wait
from .flood_actors import Caller, Hog

T = 60
DELIVERY_TIMEOUT = 0.5
HOLD_S = 3.0  # how long the hog holds its GIL (about: measured in its proc)


# -- the machine and the look at a sibling (fast tier) -----------------------------------


def test_a_stalled_session_with_a_busy_peer_keeps_its_link_and_waits_again() -> None:
    sender = Outbound("s")
    dial = sender.queued(b"f0")
    assert isinstance(dial, Dial) and sender.begin_dial(dial)
    sender.connected("link")
    assert sender.tick(0.0, 1.0) == []  # the stall starts
    assert sender.stalled_for(0.6) == 0.6
    assert sender.tick(1.5, 1.0, peer_busy=True) == []  # busy: kept, and the wait restarts
    assert sender.state == CONNECTED and sender.stalled_for(2.0) == 0.5
    assert sender.tick(2.0, 1.0, peer_busy=False) == []  # (not a timeout since the restart)
    actions = sender.tick(2.6, 1.0, peer_busy=False)  # no longer busy: dropped, dialed again
    assert isinstance(actions[0], Close) and isinstance(actions[1], Dial)


def test_the_process_listening_at_a_unix_socket_is_found() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "p.sock")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
            assert _listener_pid(f"unix://{path}") is None  # bound, not listening
            s.listen()
            assert _listener_pid(f"unix://{path}") == os.getpid()
            assert _listener_pid(f"unix://{path}") == os.getpid()  # (kept)
        assert _listener_pid(f"unix://{d}/none.sock") is None
    assert _listener_pid("tcp://127.0.0.1:1") is None


# -- real procs --------------------------------------------------------------------------


@pytest.fixture
def meshes(spawn_procs: SpawnProcs) -> tuple[Any, Any]:
    # A link unacknowledged for half a second is dropped unless its peer is busy; a silent
    # proc counts as stuck after 2 s unless its CPU time advances. (The fixture stops the
    # procs whatever became of them.)
    with overridden(
        delivery_timeout=DELIVERY_TIMEOUT, heartbeat_interval=0.1, heartbeat_timeout=2.0
    ):
        procs: ProcMesh = spawn_procs({"gpus": 2})
        hog = procs.slice(gpus=0).spawn("hog", Hog)
        caller = procs.slice(gpus=1).spawn("caller", Caller)
    return hog, caller


@pytest.mark.slow
@pytest.mark.parametrize("sender", ["controller", "sibling"])
def test_a_proc_holding_its_gil_for_several_delivery_timeouts_keeps_its_links(
    meshes: tuple[Any, Any],
    sender: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hog, caller = meshes
    caplog.set_level(logging.WARNING)
    assert caller.echo_via.call_one(hog, 0).get(T) == 0  # the sibling's link is up
    held = hog.hold_gil.call_one(HOLD_S)
    time.sleep(0.3)  # (the hog's actor thread is in the C call by now)
    t0 = time.monotonic()
    if sender == "controller":
        answer = hog.echo.call_one(1)
    else:
        answer = caller.echo_via.call_one(hog, 1)
    assert answer.get(T) == 1  # after the C call returned: the link was kept
    took = held.get(T)
    waited = time.monotonic() - t0
    # Long enough that, without the verdict, the link would have been dropped and given up
    # (a timeout without acknowledgement, then one without a reconnection).
    assert took > 3 * DELIVERY_TIMEOUT and waited > 2 * DELIVERY_TIMEOUT, (took, waited)
    if sender == "controller":  # (the sibling logs in its own proc)
        assert any("but the proc is busy" in r.getMessage() for r in caplog.records)
    assert not any("killing it" in r.getMessage() for r in caplog.records)
    assert hog.echo.call_one(2).get(T) == 2  # and it goes on


@pytest.mark.slow
def test_a_stopped_proc_is_still_given_up(
    meshes: tuple[Any, Any],
) -> None:
    hog, caller = meshes
    assert caller.echo_via.call_one(hog, 0).get(T) == 0
    pid = hog.pid.call_one().get(T)
    stop_and_wait(pid)
    try:
        t0 = time.monotonic()
        with pytest.raises(ActorError):  # the sibling's call fails: its link, or the proc
            caller.echo_via.call_one(hog, 1).get(T)
        assert time.monotonic() - t0 < 20
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed as stuck meanwhile
