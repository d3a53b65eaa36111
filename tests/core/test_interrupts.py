"""An interrupt on the main thread (Ctrl-C, or the SIGUSR2 that stops a program after an
unhandled fault) while it sends never leaves a send lock held: the outbox's and the
socket's per-message locks are taken with ``with``, which has no point where Python raises
between taking the lock and the block that releases it. ``lock.acquire(); try: ...`` has
one (acquire() returning): that form left the lock held in 200 of 200 trials below."""

from __future__ import annotations

import functools
import itertools
import signal
import socket
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from regency.core import _outbox
from regency.core._delivery import CONNECTED
from regency.transports._sockets import SocketConnection


class _Interrupt(Exception):
    pass


class _Link:
    def send_nowait(self, frame: Any, answer: bool = False) -> None:
        pass


class _NoToken:
    def run_sync_soon(self, fn: Any) -> None:
        pass


def _runtime(**more: Any) -> Any:
    """What an Outbox uses of its runtime, and ``more``."""
    return types.SimpleNamespace(
        env=types.SimpleNamespace(probe=None),
        config=types.SimpleNamespace(
            max_frame_bytes=1 << 30, send_window=1 << 16, send_buffer_bytes=1 << 28
        ),
        executor=types.SimpleNamespace(runs_freely=True),
        proc_id="p",
        new_session_id=functools.partial(next, (f"p#n#{i}" for i in itertools.count())),
        closing=False,
        **more,
    )


def _outbox_send() -> tuple[Any, Callable[[], None]]:
    box = _outbox.Outbox(_runtime(call_soon=lambda fn: None), "addr")
    box._machine.state, box._machine.link = CONNECTED, _Link()
    return box._lock, lambda: box.send(b"x" * 16)


def _socket_send() -> tuple[Any, Callable[[], None]]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = SocketConnection(ours, "peer", _NoToken(), 1 << 30)  # type: ignore[arg-type]
    conn._keep = theirs  # type: ignore[attr-defined]

    def send() -> None:
        conn._last_send = 0.0
        conn.send_nowait(b"x" * 16)

    return conn._lock, send


@pytest.mark.parametrize("make", [_outbox_send, _socket_send], ids=["outbox", "socket"])
def test_an_interrupt_while_waiting_for_a_send_lock_does_not_leave_it_held(
    make: Callable[[], tuple[Any, Callable[[], None]]],
) -> None:
    assert threading.current_thread() is threading.main_thread()
    main = threading.main_thread().ident
    assert main is not None

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        for _ in range(30):
            lock, send = make()
            lock.acquire()  # another sender holds it
            sending = threading.Event()

            def other(lock: Any = lock, sending: threading.Event = sending) -> None:
                sending.wait()  # (not while the main thread still starts this one)
                time.sleep(0.002)  # the main thread now waits in the lock
                lock.release()  # wakes it, while this thread keeps the GIL a while
                signal.pthread_kill(main, signal.SIGUSR1)
                x = 0
                for i in range(20_000):
                    x += i

            thread = threading.Thread(target=other)
            thread.start()
            try:
                sending.set()
                send()
                thread.join()  # the signal is taken here if not inside send()
            except _Interrupt:
                pass
            thread.join()
            assert lock.acquire(timeout=1), "an interrupt left the send lock held"
            lock.release()
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.slow
def test_an_interrupt_before_the_first_dial_is_scheduled_loses_nothing(
    spawn_procs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread whose frame opens a session to a proc is handed the first Dial, and
    schedules it after it lets go of the outbox's lock; a KeyboardInterrupt in between
    (simulated here, raised where ``_after`` would schedule it) lost it, and every later
    message to that proc queued behind a dial that never came. Now the watchdog's second
    tick hands the Dial out again (``Outbound.tick``)."""
    from regency.core._controller import current_runtime
    from regency.core._delivery import Dial

    from .hardening_actors import Busy

    pm = spawn_procs(per_host={"gpus": 1})
    lost: list[Any] = []
    real_after = _outbox.Outbox._after

    def after(box: Any, actions: list[Any]) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main and not lost and any(isinstance(a, Dial) and a.first for a in actions):
            lost.append(box)
            raise KeyboardInterrupt  # as if Ctrl-C landed here
        real_after(box, actions)

    monkeypatch.setattr(_outbox.Outbox, "_after", after)
    with pytest.raises(KeyboardInterrupt):
        pm.spawn("first", Busy)  # its first frame to the proc opens the session
    monkeypatch.setattr(_outbox.Outbox, "_after", real_after)
    (box,) = lost
    assert box is current_runtime().outboxes[box.address]
    box.check_stalled(0.0)  # the watchdog's ticks (it also runs them on its own)
    box.check_stalled(1.0)
    busy = pm.spawn("second", Busy)
    assert len(set(busy.pid.call().get(30).values())) == 1


class _CutWrite:
    """A link whose first write an interrupt cuts short (before or after some of the
    frame's bytes went out: the sender cannot tell)."""

    def __init__(self) -> None:
        self.cut = False
        self.closed = False

    def send_nowait(self, frame: Any, answer: bool = False) -> None:
        if not self.cut:
            self.cut = True
            raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True


def test_an_interrupt_inside_a_write_resumes_the_session_on_a_new_connection() -> None:
    """Ctrl-C inside a connection's write left the frame counted as sent while it was not
    (or half) written: the receiver numbered the next frame in its place and later
    delivered one twice. Now the connection goes and the session resumes on a new one from
    what the receiver acknowledged (which drops what it handled already): the frame is
    sent again, nothing is delivered twice."""
    from regency.core._delivery import DIALING, Transmit

    scheduled: list[Callable[[], None]] = []
    started: list[Any] = []
    rt = _runtime(
        call_soon=scheduled.append, start_soon=lambda fn, *args: started.append(args)
    )
    box = _outbox.Outbox(rt, "addr")
    link = _CutWrite()
    machine = box._machine
    machine.state, machine.link = CONNECTED, link
    with pytest.raises(KeyboardInterrupt):
        box.send(b"f0")
    assert machine.state == DIALING and not box._lock.locked()
    (after,) = scheduled  # the loop closes the connection and dials again
    after()
    assert link.closed
    ((dial,),) = started
    assert machine.begin_dial(dial)
    assert machine.connected("link2") == [Transmit("link2", (b"f0",), resume_at=0)]


class _Signalled(BaseException):
    """What a signal handler raises here, as Ctrl-C raises KeyboardInterrupt."""


class _Written:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_nowait(self, frame: Any, answer: bool = False) -> None:
        self.sent.append(frame)

    def close(self) -> None:
        pass


def test_a_signal_pending_when_the_send_lock_is_taken_never_leaves_a_frame_counted_unwritten(
) -> None:
    """A signal that arrives while the main thread waits for the outbox's lock is raised at
    the first point after it takes it where Python checks: that was as the frame joined the
    unacknowledged ones, before the write (so before the handler above), leaving it counted,
    unwritten and the connection in use (the reviewer's set-up: 40 of 40 trials). Whatever
    point it lands on now, the frame is written, or the session resumes on a new
    connection, or nothing was counted."""
    previous = signal.signal(signal.SIGUSR1, _raise_signalled)
    main = threading.main_thread().ident
    assert main is not None
    try:
        for _ in range(20):
            scheduled: list[Any] = []
            box = _outbox.Outbox(_runtime(call_soon=scheduled.append), "addr")
            link = _Written()
            machine = box._machine
            machine.state, machine.link = CONNECTED, link
            box._lock.acquire()
            sending = threading.Event()

            def release_then_signal(
                lock: Any = box._lock, sending: threading.Event = sending
            ) -> None:
                sending.wait()  # (not while the main thread still starts this one)
                time.sleep(0.002)
                lock.release()
                signal.pthread_kill(main, signal.SIGUSR1)

            other = threading.Thread(target=release_then_signal)
            other.start()
            try:
                sending.set()
                box.send(b"x" * 16)
                other.join()  # (the signal lands here if not in send)
            except _Signalled:
                pass
            other.join()
            if machine.unacked and not link.sent:  # counted, not written
                assert scheduled and machine.state != CONNECTED, (
                    "a frame counted as sent but never written, on a connection still in use"
                )
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _raise_signalled(signum: int, frame: Any) -> None:
    raise _Signalled


class _NoMemory:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.fail = True

    def send_nowait(self, frame: Any, answer: bool = False) -> None:
        if self.fail:
            self.fail = False
            raise MemoryError("no room to seal it")
        self.sent.append(frame)


def test_a_frame_whose_write_fails_before_any_byte_went_out_is_not_counted() -> None:
    """An ordinary error of a frame's own (no memory to seal it) goes to its sender, and the
    frame is not counted as sent: the next frame takes its number, as the receiver sees."""
    box = _outbox.Outbox(_runtime(call_soon=lambda fn: None), "addr")
    link = _NoMemory()
    machine = box._machine
    machine.state, machine.link = CONNECTED, link
    with pytest.raises(MemoryError):
        box.send(b"f0", True)
    assert (machine.queued_count, list(machine.unacked), box.direct_mark) == (0, [], 0)
    assert box.send(b"f1", True) == 1 and link.sent == [b"f1"] and box.direct_mark == 1
