"""The per-process runtime: one trio loop that owns this process's connections, actors and
reply ports.

Every process of a job (the controller and each proc) runs exactly one :class:`Runtime`. It
listens on one address, dials peers lazily through an :class:`Outbox` per destination,
dispatches incoming frames to actor mailboxes and reply ports, and starts child procs through
a :class:`~regency.core._launcher.ProcLauncher`. It reaches the network only through
:mod:`regency.transports`.

Ordering: a sender always uses the one connection it dialed to a destination, so frames from
one sender to one receiver arrive in send order; mailboxes are FIFO, so handling is in order.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import itertools
import logging
import os
import random
import secrets
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import trio

from .. import transports
from ..supervision import FailureCause, ProcLost, RanksFailed
from . import _codec
from . import _messages as M
from ._config import Config, current_config
from ._errors import RemoteFailure, UndeliverableError
from ._future import runtime_threads
from ._jobdir import make_jobdir
from ._launcher import ProcHandle, ProcLauncher, ZygoteLauncher, default_launcher
from ._mailbox import ActorCell
from ._oversight import Oversight, install_interrupt_handler
from ._probe import Probe

log = logging.getLogger("regency.runtime")


class PortHandler(Protocol):
    """Receives what arrives on one reply port. Called on the runtime's trio thread."""

    #: Addresses of the procs this port waits on; a lost link to one fails the port.
    dests: frozenset[str]

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        """Handle one message; return True when the port is finished and can be closed."""

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        """The port can no longer complete (``address``, a destination, is unreachable)."""


#: Acknowledge after this many frames, or after ``_ACK_DELAY`` seconds, whichever is first.
_ACK_EVERY = 64
_ACK_DELAY = 0.05


class Outbox:
    """The way out to one destination address: queues until connected, then writes through,
    and survives a broken connection.

    ``send`` is thread-safe and never blocks. The first send schedules the connect on the
    trio thread; frames sent meanwhile queue here and are flushed, in order, before the
    connection is published to later senders.

    Delivery is a *session*: each connection starts with ``SESSION(id, first)``, the receiver
    numbers the frames that follow from ``first``, and acknowledges (``ACK(n)``: every frame
    below ``n`` was handled) every ``_ACK_EVERY`` frames or ``_ACK_DELAY`` seconds. Frames
    stay here until acknowledged. When a connection breaks, the outbox dials again (until
    ``delivery_timeout``) and resends what was not acknowledged; the receiver drops what it
    already handled. So a link that breaks and comes back loses nothing and delivers nothing
    twice. A refused dial (nothing listens: the proc is gone) or a known exit ends it at once.
    """

    def __init__(self, runtime: Runtime, address: str) -> None:
        self._rt = runtime
        self.address = address
        self._conn: transports.Connection | None = None
        self._lock = threading.Lock()
        self._pending: list[transports.Frame] = []
        self._connecting = False
        self._error: BaseException | None = None
        # The nonce keeps ids unique across jobs: a worker outlives its controllers, whose
        # proc ids (from pids) can repeat, e.g. in containers.
        self._session = f"{runtime.proc_id}#{runtime._nonce}#{next(runtime._sessions)}"
        #: Frames sent on this session and not yet acknowledged, oldest first.
        self._unacked: deque[transports.Frame] = deque()
        #: How many frames of the session the receiver has acknowledged.
        self._acked = 0
        #: Since when (trio time) frames have waited for an acknowledgement that did not come,
        #: and how many were acknowledged then (see ``check_stalled``).
        self._stalled_since: float | None = None
        self._stalled_at = 0

    def send(self, frame: transports.Frame) -> None:
        size = len(frame) if isinstance(frame, bytes) else transports.frame_size(frame)
        if size > self._rt.config.max_frame_bytes:
            raise ValueError(
                f"message of {size} bytes exceeds max_frame_bytes="
                f"{self._rt.config.max_frame_bytes}; raise it with "
                "regency.configure(max_frame_bytes=...)"
            )
        with self._lock:
            if self._error is not None:
                raise UndeliverableError(
                    f"cannot deliver to the proc at {self.address}: {self._error}"
                )
            conn = self._conn
            probe = self._rt.probe
            if probe is not None:
                index = self._acked + len(self._unacked) + len(self._pending)
                probe.frame_sent(self._rt, self.address, self._session, index)
            if conn is None:
                self._pending.append(frame)
                if not self._connecting:
                    self._connecting = True
                    self._rt.call_soon(self._start)
                return
            self._unacked.append(frame)
            try:
                conn.send_nowait(frame)
            except transports.TransportError:
                pass  # kept in _unacked; the lost connection brings a reconnect and a resend

    def acknowledged(self, count: int) -> None:
        """The receiver handled the session's first ``count`` frames."""
        with self._lock:
            while self._acked < count and self._unacked:
                self._unacked.popleft()
                self._acked += 1

    def check_stalled(self, now: float) -> None:
        """Called every ``heartbeat_interval`` on the trio thread: a connection whose frames
        have gone unacknowledged for ``delivery_timeout`` is dead even if nothing said so (a
        silent network cut, a peer host that vanished without a reset). Drop it and
        reconnect; the reconnect either resends or, within ``delivery_timeout``, fails the
        link. Receivers acknowledge within ``_ACK_DELAY`` of handling, from their trio loop,
        so a live peer never trips this."""
        conn = self._conn
        if conn is None or not self._unacked:
            self._stalled_since = None
            return
        if self._stalled_since is None or self._acked != self._stalled_at:
            self._stalled_since, self._stalled_at = now, self._acked
            return
        waited = now - self._stalled_since
        if waited < self._rt.config.delivery_timeout:
            return
        self._stalled_since = None
        log.warning(
            "no acknowledgement from %s for %.1f s; reconnecting", self.address, waited
        )
        self._connection_lost(
            conn,
            transports.ConnectionBroken(
                f"connection to {self.address} is broken: {len(self._unacked)} frame(s) "
                f"unacknowledged for {waited:.1f} s"
            ),
        )
        conn.close()

    def _start(self) -> None:
        self._rt.nursery.start_soon(self._connect)

    async def _connect(self) -> None:
        try:
            ready = self._rt.child_ready.get(self.address)
            if ready is not None:
                with trio.fail_after(self._rt.config.spawn_timeout):
                    await ready.wait()
                if self._error is not None:
                    return
            conn = await self._dial(self._rt.config.spawn_timeout, retry_refused=True)
        except (transports.TransportError, trio.TooSlowError, OSError, ValueError) as exc:
            if isinstance(exc, trio.TooSlowError):
                exc = TimeoutError(
                    f"proc did not start within spawn_timeout={self._rt.config.spawn_timeout} s"
                )
            self._broken(exc)
            return
        self._resume(conn)

    def _resume(self, conn: transports.Connection) -> None:
        """Start a session on ``conn``: resend what is unacknowledged, then what queued."""
        with self._lock:
            if self._error is not None:
                conn.close()
                return
            # Everything queued joins the session first, so a send failing part-way loses
            # nothing: what did not go out is resent by the next attempt, in order.
            self._unacked.extend(self._pending)
            self._pending.clear()
            try:
                conn.send_nowait(_codec.pack_session(self._session, self._acked))
                for frame in self._unacked:
                    conn.send_nowait(frame)
            except transports.TransportError:
                pass  # it broke again: its connection_lost starts the next attempt
            self._conn = conn
            self._connecting = False

    async def _dial(self, within: float, *, retry_refused: bool) -> transports.Connection:
        """Connect, retrying for ``within`` seconds. While a proc starts nothing listens yet
        (``retry_refused``: a sibling may still be starting); a refused reconnect means the
        proc is gone. A wrong secret fails at once."""
        deadline = trio.current_time() + within
        delay = 0.001
        while True:
            try:
                # One dial into a black hole must not outlast the whole allowance.
                with trio.move_on_at(deadline) as attempt:
                    return await self._rt.transport.connect(self.address, _OutboundSink(self))
                assert attempt.cancelled_caught
                raise transports.ConnectionBroken(
                    f"cannot connect to {self.address}: no answer within {within} s"
                )
            except transports.AuthenticationError:
                raise
            except transports.ConnectionRefused:
                if not retry_refused or trio.current_time() + delay > deadline:
                    raise
            except transports.ConnectionBroken:
                if trio.current_time() + delay > deadline:
                    raise
            await trio.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _connection_lost(self, conn: transports.Connection, exc: BaseException) -> None:
        with self._lock:
            if self._error is not None or self._conn is not conn:
                return
            self._conn = None
            self._connecting = True  # new frames queue in _pending meanwhile
        self._rt.start_soon(self._reconnect, exc)

    async def _reconnect(self, cause: BaseException) -> None:
        child = self._rt.children.get(self.address)
        if child is not None and child.returncode is not None:
            self._broken(cause)
            return
        within = self._rt.config.delivery_timeout
        try:
            conn = await self._dial(within, retry_refused=False)
        except (transports.TransportError, OSError) as exc:
            self._broken(
                ConnectionError(f"{cause}; no reconnection within {within} s ({exc})")
                if not isinstance(exc, transports.ConnectionRefused)
                else cause
            )
            return
        log.info("reconnected to %s; resending %d frame(s)", self.address, len(self._unacked))
        self._resume(conn)

    def _broken(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = exc
            self._pending.clear()
            self._unacked.clear()
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        probe = self._rt.probe
        if probe is not None:
            probe.session_failed(self._rt, self.address, self._session)
        self._rt.link_failed(self.address, exc)

    def close(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.close()


class _OutboundSink:
    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        count = _codec.unpack_ack(frame)
        if count is not None:
            self._outbox.acknowledged(count)
        else:
            self._outbox._rt.on_frame(frame)

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        if exc is None:
            return  # we closed it
        self._outbox._connection_lost(conn, exc)


class _InboundSink:
    """One inbound connection: numbers the frames of its session, drops the ones handled
    before a reconnect, and acknowledges."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._conn: transports.Connection | None = None
        self._session: str | None = None
        #: [frames of the session handled], shared by every connection of the session, so a
        #: reconnect that overtakes the old connection's last frames still sees them.
        self._handled: list[int] | None = None
        self._next = 0  # index of the next frame in the session
        self._acked = 0
        self._ack_pending = False

    def frame_received(self, conn: transports.Connection, frame: memoryview) -> None:
        handled = self._handled
        if handled is None or frame[:4] == _codec.SESSION_MARK:
            session = _codec.unpack_session(frame)
            if session is not None:
                handled = self._rt.session_opened(*session)  # raises for a forgotten one
                if self._session is not None:
                    self._rt.session_closed(self._session)
                self._session, self._next = session
                self._handled = handled
                self._conn = conn
            else:
                self._rt.on_frame(frame)  # a peer without sessions (tests, tools)
            return
        index = self._next
        self._next = index + 1
        if index < handled[0]:
            return  # handled before the reconnect: a resend
        handled[0] = index + 1
        probe = self._rt.probe
        if probe is not None:
            assert self._session is not None
            probe.frame_handled(self._rt, self._session, index)
        self._rt.on_frame(frame)
        if index + 1 - self._acked >= self._rt.ack_every:
            self.ack()
        elif not self._ack_pending:
            self._ack_pending = True
            self._rt.ack_later(self)

    def ack(self) -> None:
        self._ack_pending = False
        count = self._handled[0] if self._handled is not None else 0
        if count > self._acked and self._conn is not None and not self._conn.closed:
            self._acked = count
            try:
                self._conn.send_nowait(_codec.pack_ack(count))
            except transports.TransportError:
                pass

    def connection_lost(self, conn: transports.Connection, exc: BaseException | None) -> None:
        self._conn = None
        if self._session is not None:
            self._rt.session_closed(self._session)
            self._session = None


class Child:
    """A proc this runtime launched."""

    def __init__(self, proc_id: str, address: str) -> None:
        self.proc_id = proc_id
        self.address = address
        self.handle: ProcHandle | None = None
        self.returncode: int | None = None
        self.exited = trio.Event()
        #: trio time of the last HELLO or heartbeat; None until the proc has started.
        self.last_seen: float | None = None
        #: Why the runtime killed this proc, if it did.
        self.killed_for: str | None = None
        #: Silence after which it counts as stuck (the setting it was started with).
        self.heartbeat_timeout = 10.0
        #: Who starts it, when not the runtime's own launcher.
        self.launcher: ProcLauncher | None = None

    def describe_exit(self) -> str:
        code = self.returncode
        if code is None:
            return f"proc {self.proc_id} is running"
        if code < 0:
            try:
                name = f" ({signal.Signals(-code).name})"
            except ValueError:
                name = ""
            how = f"was killed by signal {-code}{name}"
        else:
            how = f"exited with status {code}"
        if self.killed_for:
            how += f" after it {self.killed_for}"
        return f"proc {self.proc_id} {how}"


def _free_tcp_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class Runtime:
    """One process's runtime. Create it, then run :meth:`serve` on a trio loop."""

    def __init__(
        self,
        proc_id: str,
        *,
        secret: bytes,
        jobdir: str,
        config: Config,
        address: str | None = None,
        parent_address: str | None = None,
        seed: int | None = None,
        transport: TransportFactory | None = None,
        launcher: ProcLauncher | None = None,
    ) -> None:
        self.proc_id = proc_id
        self.secret = secret
        self.jobdir = jobdir
        self.config = config
        self.launcher: ProcLauncher | None = launcher
        self.address = address or self._default_address(proc_id)
        self.parent_address = parent_address
        self.rng = random.Random(seed)
        #: Opens this runtime's transport; the simulator passes its own.
        self._open_transport = transport or _open_real_transport
        self.actors: dict[str, ActorCell] = {}
        #: Keys of actors that stopped or failed here, with why (later messages bounce).
        self.dead: dict[str, RemoteFailure] = {}
        #: Messages for actors whose SPAWN has not arrived yet (a third party may know the
        #: mesh before the SPAWN from its owner reaches this proc).
        self.limbo: dict[str, list[tuple[Any, ...]]] = {}
        self.ports: dict[int, PortHandler] = {}
        self._port_ids = itertools.count(1)
        self._outboxes: dict[str, Outbox] = {}
        self._outbox_lock = threading.Lock()
        self.child_ready: dict[str, trio.Event] = {}
        self.children: dict[str, Child] = {}
        self._child_ids = itertools.count()
        self._names = itertools.count()
        self.started = threading.Event()
        self.thread_id: int | None = None
        #: Launchers for hosts this runtime can place procs on directly, by the ``worker``
        #: field of their HostRef (the simulator's hosts); other hosts go through workers.
        self.host_launchers: dict[str, ProcLauncher] = {}
        #: When set, sync actor code runs through it instead of on actor threads (the
        #: simulator runs it in lockstep with its loop). ``await sync_runner(fn)``.
        self.sync_runner: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None
        self.on_child_exit: list[Callable[[Child], None]] = []
        #: Told what delivery and supervision do (the simulator's invariant checker).
        self.probe: Probe | None = None
        #: Acknowledge inbound frames after this many, or this many seconds (the simulator's
        #: "buggify" runs change them to stress the delivery layer).
        self.ack_every = _ACK_EVERY
        self.ack_delay = _ACK_DELAY
        self.oversight = Oversight(self)
        #: Handlers for frame kinds beyond the core ones (the worker daemon's, the
        #: controller's side of multi-host), by kind. Called on the trio thread.
        self.extensions: dict[int, Callable[[tuple[Any, ...], list[memoryview]], None]] = {}
        #: Set once an actor here failed: the proc refuses new actors from then on.
        self.poisoned: RemoteFailure | None = None
        self._lost: set[str] = set()
        self._sessions = itertools.count(1)
        self._nonce = f"{self.rng.getrandbits(64):016x}"
        #: Per inbound session: how many of its frames were handled (resends below it drop).
        self.delivered: dict[str, list[int]] = {}
        #: Per inbound session: its open connections, and since when it has had none. A
        #: session idle for longer than its sender could still reconnect is forgotten.
        self._session_conns: dict[str, int] = {}
        self._idle_sessions: dict[str, float] = {}
        self._to_ack: dict[int, _InboundSink] = {}  # insertion-ordered: deterministic
        self._ack_scheduled = False

    def _default_address(self, proc_id: str) -> str:
        decided = self.launcher.address_for(proc_id) if self.launcher is not None else None
        if decided is not None:
            return decided
        if self.config.default_transport == "unix":
            return f"unix://{self.jobdir}/{proc_id}.sock"
        if self.config.default_transport == "tcp":
            return f"tcp://{self.config.tcp_host}:{_free_tcp_port(self.config.tcp_host)}"
        if self.config.default_transport == "nng+ipc":
            return f"nng+ipc://{self.jobdir}/{proc_id}.nng"
        scheme = self.config.default_transport
        return f"{scheme}://{self.config.tcp_host}:{_free_tcp_port(self.config.tcp_host)}"

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`stop`. Signals readiness once listening."""
        self.thread_id = threading.get_ident()
        runtime_threads.add(self.thread_id)
        self.token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        try:
            _runtime_var.set(self)  # tasks spawned from here on know their runtime
            async with self._open_transport(self) as transport, trio.open_nursery() as nursery:
                self.transport = transport
                self.nursery = nursery
                # A controller's (or worker's) zygote removes the job directory if this
                # process dies without doing so; a proc's jobdir is its spawner's.
                self.launcher = self.launcher or default_launcher(
                    nursery, self.jobdir if self.parent_address is None else ""
                )
                listener = await transport.listen(self.address, lambda c: _InboundSink(self))
                self.address = self.local_address = listener.address
                # Frames this process sends to itself take the in-process transport, where
                # there is one (the simulator's network carries them like any other).
                if "inproc" in transport.schemes:
                    self._loopback = await transport.listen(
                        f"inproc://{self.proc_id}-{os.getpid()}-{id(self)}",
                        lambda c: _InboundSink(self),
                    )
                else:
                    self._loopback = listener
                if self.parent_address is not None:
                    self.outbox(self.parent_address).send(
                        _codec.pack((M.HELLO, self.proc_id, self.address))
                    )
                if self.parent_address is None and isinstance(self.launcher, ZygoteLauncher):
                    # A controller will almost surely spawn procs: warm the zygote now.
                    self.launcher.start()
                if self.parent_address is not None:
                    nursery.start_soon(self._send_heartbeats, self.parent_address)
                nursery.start_soon(self._watchdog)
                self.started.set()
                task_status.started()
                await self._stop_event.wait()
                self._shutdown_children()
                nursery.cancel_scope.cancel()
        finally:
            runtime_threads.discard(self.thread_id)
            for cell in list(self.actors.values()):
                cell.abandon()
            for handler in list(self.ports.values()):
                handler.fail(UndeliverableError("the runtime stopped"))
            self.ports.clear()

    async def listen_also(self, address: str) -> str:
        """Listen on another address too, and make it this runtime's identity from now on
        (ports and owner references opened later carry it). Multi-host jobs use this to
        give the controller a TCP address its remote procs can reach."""
        listener = await self.transport.listen(address, lambda c: _InboundSink(self))
        self.address = listener.address
        return self.address

    async def _send_heartbeats(self, address: str) -> None:
        """Tell our spawner we are alive, from the trio loop: a stuck loop stops them."""
        frame = _codec.pack((M.HEARTBEAT, self.address))
        while True:
            await trio.sleep(self.config.heartbeat_interval)
            try:
                self.send(address, frame)
            except Exception:
                return  # the spawner is gone; we die with it

    async def _watchdog(self) -> None:
        """Every ``heartbeat_interval``: kill a started child whose heartbeats stopped for
        ``heartbeat_timeout``, and drop connections whose acknowledgements stopped."""
        while True:
            await trio.sleep(self.config.heartbeat_interval)
            now = trio.current_time()
            for box in list(self._outboxes.values()):
                box.check_stalled(now)
            if self._idle_sessions:
                self._forget_idle_sessions(now)
            for child in list(self.children.values()):
                if child.last_seen is None or child.returncode is not None:
                    continue
                silent = now - child.last_seen
                if silent > child.heartbeat_timeout and child.handle is not None:
                    child.killed_for = f"sent no heartbeat for {silent:.1f} s (stuck)"
                    log.error("proc %s %s; killing it", child.proc_id, child.killed_for)
                    child.last_seen = None
                    child.handle.kill()
                    if child.handle.remote:
                        # Its host may be unreachable: the kill cannot be confirmed.
                        self._child_exited(child, -signal.SIGKILL)

    def stop(self) -> None:
        """Ask :meth:`serve` to return. Thread-safe."""
        self.call_soon(lambda: self._stop_event.set())

    def _shutdown_children(self) -> None:
        for child in self.children.values():
            if child.handle is not None and child.returncode is None:
                child.handle.kill()

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the runtime's trio thread (now, if already there)."""
        if threading.get_ident() == self.thread_id:
            fn()
        else:
            self.token.run_sync_soon(fn)

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)`` as a task of this runtime, from any thread. The task sees this
        runtime as the current one, which matters where a process holds several (the
        simulator): a task started from a ``call_soon`` callback inherits no context."""

        async def task() -> None:
            _runtime_var.set(self)
            await fn(*args)

        self.call_soon(lambda: self.nursery.start_soon(task, name=fn))

    def on_runtime_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    # -- sending -------------------------------------------------------------------------

    def outbox(self, address: str) -> Outbox:
        box = self._outboxes.get(address)
        if box is None:
            with self._outbox_lock:
                box = self._outboxes.get(address)
                if box is None:
                    target = self._loopback.address if address == self.address else address
                    box = Outbox(self, target)
                    self._outboxes[address] = box
        return box

    def send(self, address: str, frame: transports.Frame) -> None:
        """Send a frame to the runtime at ``address``. Thread-safe, never blocks."""
        self.outbox(address).send(frame)

    def new_name(self, prefix: str) -> str:
        return f"{self.proc_id}.{prefix}{next(self._names)}"

    # -- reply ports ---------------------------------------------------------------------

    def open_port(self, handler: PortHandler) -> tuple[str, int]:
        port_id = next(self._port_ids)
        self.ports[port_id] = handler
        return (self.address, port_id)

    def close_port(self, port_id: int) -> None:
        self.ports.pop(port_id, None)

    def send_port(self, port: tuple[str, int], index: int, status: int, value: Any) -> None:
        """Send ``value`` to a reply port. Raises if the value cannot be pickled."""
        address, port_id = port
        payload = _codec.dumps(_codec.out_of_band(value))
        frame = _codec.pack_port(port_id, index, status, payload)
        if frame is None:
            frame = _codec.pack((M.PORT, port_id, index, status), payload)
        self.send(address, frame)

    def link_failed(self, address: str, exc: BaseException) -> None:
        """The way to ``address`` is gone: fail every port that waits on it and tell
        supervision the proc is lost. For a proc we launched, wait briefly for its exit
        status so errors can say how it died."""

        def lost() -> None:
            child = self.children.get(address)
            if child is not None and child.returncode is None:
                self.nursery.start_soon(self._await_exit_then_lose, child, exc)
            else:
                self._lose(address, exc, child)

        self.call_soon(lost)

    async def _await_exit_then_lose(self, child: Child, exc: BaseException) -> None:
        # A local exit status comes from a pidfd at once; a remote one from its worker, which
        # may itself be gone, so wait less for it.
        remote = child.handle is not None and child.handle.remote
        with trio.move_on_after(0.1 if remote else 0.5):
            await child.exited.wait()
        self._lose(child.address, exc, child)

    def _lose(self, address: str, exc: BaseException, child: Child | None) -> None:
        if address in self._lost:
            return
        self._lost.add(address)
        if child is not None and child.returncode is not None:
            cause = FailureCause(child.describe_exit(), exit_code=child.returncode)
        else:
            cause = FailureCause(f"lost the link to the proc at {address}: {exc}")
        error = UndeliverableError(cause.summary)
        for port_id, handler in list(self.ports.items()):
            if address in handler.dests:
                del self.ports[port_id]
                handler.fail(error, address)
        self.oversight.feed(ProcLost(address, cause))

    # -- receiving -----------------------------------------------------------------------

    def on_frame(self, frame: memoryview) -> None:
        """Dispatch one frame. A malformed frame raises, closing that one connection."""
        if frame[:4] == _codec.PORT_MARK_BYTES:
            self._to_port(*_codec.unpack_port(frame))
            return
        envelope, parts = _codec.unpack(frame)
        kind = envelope[0]
        if kind == M.CALL:
            _, key, method, port, rank, labels, sizes = envelope
            try:
                args = _codec.loads(parts)
            except Exception as exc:
                args = exc
            self._to_actor(key, ("call", method, args, port, rank, (rank, labels, sizes)))
        elif kind == M.PORT:
            _, port_id, index, status = envelope
            self._to_port(port_id, index, status, parts)
        elif kind == M.SPAWN:
            _, key, name, rank, labels, sizes, port, owner = envelope
            if self.sync_runner is None:
                # Unpickling may import heavy modules (a notebook's actor class brings torch:
                # seconds): off the loop, so heartbeats go on. Messages for the actor wait in
                # ``limbo`` meanwhile. (The simulator, which has a sync runner, unpickles
                # inline: no real thread may run there.)
                copied = [bytes(p) for p in parts]  # the receive buffer is reused
                self.start_soon(self._spawn_off_loop, key, name, (rank, labels, sizes), copied, port, owner)
                return
            try:
                payload = _codec.loads(parts)
            except Exception as exc:
                payload = exc
            self._spawn(key, name, (rank, labels, sizes), payload, port, owner)
        elif kind == M.FAILED:
            _, key, rank = envelope
            self.oversight.feed(RanksFailed(key, (rank,), _codec.loads(parts)))
        elif kind == M.HEARTBEAT:
            (_, address) = envelope
            child = self.children.get(address)
            if child is not None and child.last_seen is not None:
                child.last_seen = trio.current_time()
        elif kind == M.STOP_ACTOR:
            _, key, port = envelope
            self._to_actor(key, ("stop", port))
        elif kind == M.STOP_PROC:
            (_, port) = envelope
            if port is not None:
                self.send_port(port, 0, M.OK, None)
            self.stop()
        elif kind == M.HELLO:
            _, _proc_id, address = envelope
            ready = self.child_ready.pop(address, None)
            if ready is not None:
                ready.set()
            child = self.children.get(address)
            if child is not None:
                child.last_seen = trio.current_time()
        else:
            extension = self.extensions.get(kind)
            if extension is None:
                raise ValueError(f"unknown frame kind {kind!r}")
            extension(envelope, parts)

    def _to_port(self, port_id: int, index: int, status: int, parts: list[memoryview]) -> None:
        handler = self.ports.get(port_id)
        if handler is None:
            return  # a late reply to a port that finished or timed out
        try:
            finished = handler.deliver(index, status, parts)
        except Exception as exc:
            log.exception("reply port %s failed", port_id)
            handler.fail(exc)
            finished = True
        if finished:
            self.ports.pop(port_id, None)

    def _to_actor(self, key: str, item: tuple[Any, ...]) -> None:
        cell = self.actors.get(key)
        if cell is not None:
            cell.enqueue(item)
            return
        failure = self.dead.get(key)
        if failure is None:
            self.limbo.setdefault(key, []).append(item)
            return
        bounce(self, item, failure)

    async def _spawn_off_loop(
        self,
        key: str,
        name: str,
        point: tuple[int, list[str], list[int]],
        parts: list[bytes],
        port: tuple[str, int] | None,
        owner: tuple[str, str, str],
    ) -> None:
        def load() -> Any:
            try:
                return _codec.loads(parts)
            except Exception as exc:
                return exc

        self._spawn(key, name, point, await trio.to_thread.run_sync(load), port, owner)

    def _spawn(
        self,
        key: str,
        name: str,
        point: tuple[int, list[str], list[int]],
        payload: Any,
        port: tuple[str, int] | None,
        owner: tuple[str, str, str],
    ) -> None:
        if key in self.actors or key in self.dead:
            # Only a broken sender resends a SPAWN; dropping it keeps the link (a raise here
            # would close the connection, and the resend would close the next one too).
            log.warning("ignored a second SPAWN of actor %r on proc %s", key, self.proc_id)
            return
        if self.poisoned is not None:
            payload = RuntimeError(
                f"proc {self.proc_id} refuses new actors because an actor on it failed: "
                f"{self.poisoned.message}"
            )
        cell = ActorCell(self, key, name, point, payload, port, owner)
        self.actors[key] = cell
        cell.start()
        for item in self.limbo.pop(key, []):
            cell.enqueue(item)

    def session_opened(self, session: str, first: int) -> list[int]:
        """A connection of inbound ``session`` started at frame ``first``: its
        handled-frames counter. A session resumed after this runtime forgot it cannot be
        taken: which of its frames were handled is no longer known."""
        handled = self.delivered.get(session)
        if handled is None:
            if first > 0:
                raise ValueError(
                    f"delivery session {session} resumes at frame {first}, but this process "
                    "forgot it (idle for longer than a sender may reconnect)"
                )
            handled = self.delivered[session] = [0]
        self._session_conns[session] = self._session_conns.get(session, 0) + 1
        self._idle_sessions.pop(session, None)
        return handled

    def session_closed(self, session: str) -> None:
        left = self._session_conns.get(session, 0) - 1
        if left > 0:
            self._session_conns[session] = left
            return
        self._session_conns.pop(session, None)
        self._idle_sessions[session] = trio.current_time()

    def _forget_idle_sessions(self, now: float) -> None:
        """Drop the counters of sessions that cannot come back: a sender gives up
        reconnecting ``delivery_timeout`` after it noticed its link broke, which can be up to
        ``delivery_timeout`` (plus a watchdog tick) after we noticed; after three times that
        no resend of theirs can arrive, and a long-lived process
        (a worker serving many controllers) does not grow with every peer it ever had."""
        horizon = 3 * self.config.delivery_timeout + 2 * self.config.heartbeat_interval
        expired = [s for s, since in self._idle_sessions.items() if now - since > horizon]
        for session in expired:
            del self._idle_sessions[session]
            self.delivered.pop(session, None)

    def ack_later(self, sink: _InboundSink) -> None:
        """Acknowledge ``sink``'s frames within ``_ACK_DELAY`` (on the trio thread)."""
        self._to_ack[id(sink)] = sink
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self.nursery.start_soon(self._flush_acks)

    async def _flush_acks(self) -> None:
        await trio.sleep(self.ack_delay)
        self._ack_scheduled = False
        sinks, self._to_ack = self._to_ack, {}
        for sink in sinks.values():
            sink.ack()

    def poison(self, failure: RemoteFailure) -> None:
        """An actor here failed: refuse new actors from now on (Monarch's poisoned proc)."""
        if self.poisoned is None:
            self.poisoned = failure

    def actor_gone(self, cell: ActorCell, failure: RemoteFailure) -> None:
        """A cell stopped or failed: later messages to it bounce with ``failure``."""
        self.actors.pop(cell.key, None)
        self.dead[cell.key] = failure

    # -- child procs ---------------------------------------------------------------------

    def plan_procs(self, count: int, name: str) -> list[Child]:
        """Name and address ``count`` new procs. Thread-safe; starts nothing.

        Picks up ``regency.configure()`` changes made since the runtime started.
        """
        self.config = current_config()
        children = []
        for _ in range(count):
            proc_id = self.new_proc_id(name)
            children.append(self.plan_child(proc_id, self._default_address(proc_id)))
        return children

    def plan_on_launchers(
        self, launchers: list[ProcLauncher], per_launcher: int, name: str
    ) -> list[Child]:
        """Plan ``per_launcher`` procs on each of ``launchers`` (hosts this runtime can
        start procs on directly, like the simulator's)."""
        children = []
        for launcher in launchers:
            for _ in range(per_launcher):
                proc_id = self.new_proc_id(name)
                address = launcher.address_for(proc_id) or self._default_address(proc_id)
                child = self.plan_child(proc_id, address)
                child.launcher = launcher
                children.append(child)
        return children

    def new_proc_id(self, name: str) -> str:
        return f"{self.proc_id}.{name}{next(self._child_ids)}"

    def plan_child(self, proc_id: str, address: str) -> Child:
        self.config = current_config()  # the child gets, and is watched by, today's settings
        child = Child(proc_id, address)
        child.heartbeat_timeout = self.config.heartbeat_timeout
        # Sends to the child wait for its HELLO; the event exists before any send.
        self.child_ready[address] = trio.Event()
        return child

    def bootstrap_record(self, child: Child, boot: str | None) -> dict[str, Any]:
        """What a new proc needs to become one (see :mod:`regency.core._bootstrap`)."""
        return {
            "proc_id": child.proc_id,
            "address": child.address,
            "parent_address": self.address,
            "secret": self.secret.hex(),
            "jobdir": self.jobdir,
            "config": self.config.to_env(),
            "sys_path": list(sys.path),
            "parent_pid": os.getpid(),
            "boot": boot,
        }

    def launch_procs(
        self, children: list[Child], env: dict[str, str] | None, boot: str | None
    ) -> None:
        """Start planned procs (on the trio thread); they connect back when ready."""
        assert self.on_runtime_thread()
        assert self.launcher is not None
        for child in children:
            self.children[child.address] = child
            launcher = child.launcher or self.launcher
            try:
                child.handle = launcher.launch(
                    self.bootstrap_record(child, boot),
                    dict(env or {}),
                    functools.partial(self._child_exited, child),
                )
            except Exception as exc:
                log.error("could not start proc %s: %s", child.proc_id, exc)
                child.killed_for = f"could not be started ({exc})"
                self._child_exited(child, 1)

    def _child_exited(self, child: Child, code: int) -> None:
        if child.returncode is not None:
            return  # already known (a remote proc declared lost, then reported)
        child.returncode = code
        child.exited.set()
        ready = self.child_ready.pop(child.address, None)
        if ready is not None:
            ready.set()  # wakes senders waiting for it; they find the outbox broken
        error = ProcessLookupError(child.describe_exit())
        self.outbox(child.address)._broken(error)
        for hook in self.on_child_exit:
            hook(child)


def bounce(rt: Runtime, item: tuple[Any, ...], failure: RemoteFailure) -> None:
    """Answer a message for an actor that cannot take it (best effort: the caller's proc may
    be gone too, and nothing here may raise into the loop)."""
    try:
        _bounce(rt, item, failure)
    except Exception as exc:
        log.info("could not bounce a message (%s): %s", item[0], exc)


def _bounce(rt: Runtime, item: tuple[Any, ...], failure: RemoteFailure) -> None:
    if item[0] == "call":
        port, index = item[3], item[4]
    elif item[0] == "stop":
        port, index = item[1], 0
        if port is not None:
            rt.send_port(port, index, M.OK, None)
        return
    else:
        return
    if port is not None:
        rt.send_port(port, index, M.DEAD, failure)


# -- this process's runtime ----------------------------------------------------------------

def _open_real_transport(rt: Runtime) -> AbstractAsyncContextManager[transports.MultiTransport]:
    return transports.open_transport(rt.secret, max_frame_bytes=rt.config.max_frame_bytes)


TransportFactory = Callable[["Runtime"], AbstractAsyncContextManager[transports.Transport]]

_runtime: Runtime | None = None
#: The runtime of the code running now, where a process holds several (the simulator):
#: set in each runtime's tasks and actor threads; the process-wide one otherwise.
_runtime_var: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "regency_runtime", default=None
)
_runtime_lock = threading.Lock()


def use_runtime(rt: Runtime) -> None:
    """Make ``rt`` the current runtime of the calling context (a thread, a task, a
    ``contextvars.Context``): where a process holds several runtimes, the simulator's."""
    _runtime_var.set(rt)


def set_current_runtime(rt: Runtime) -> None:
    global _runtime
    _runtime = rt


def derive_secret(text: str) -> bytes:
    """The job secret from a passphrase (``REGENCY_SECRET``, a secret file, an argument)."""
    text = text.strip()
    if len(text) < 16:
        raise ValueError(f"a job secret must be at least 16 characters (got {len(text)})")
    return hashlib.sha256(text.encode()).digest()


#: Set by ``attach_to_workers(secret=...)`` before the runtime starts.
secret_override: bytes | None = None


def job_secret() -> bytes:
    """The secret given to ``attach_to_workers``, else ``REGENCY_SECRET`` (multi-host jobs
    share it), else a fresh random secret."""
    if secret_override is not None:
        return secret_override
    text = os.environ.get("REGENCY_SECRET")
    return derive_secret(text) if text else secrets.token_bytes(32)


def current_runtime_or_none() -> Runtime | None:
    return _runtime_var.get() or _runtime


def current_runtime() -> Runtime:
    """This process's runtime; in a controller the first call starts it on its own thread."""
    rt = _runtime_var.get() or _runtime
    if rt is not None:
        return rt
    with _runtime_lock:
        if _runtime is None:
            _start_controller()
        assert _runtime is not None
        return _runtime


def _start_controller() -> None:
    global _runtime
    import atexit

    config = current_config()
    if config.runtime == "sim":
        from ..sim._cluster import start_simulated_controller

        install_interrupt_handler()
        _runtime = start_simulated_controller(config.seed)
        return

    jobdir = make_jobdir()
    rt = Runtime(
        f"c{os.getpid()}",
        secret=job_secret(),
        jobdir=jobdir,
        config=current_config(),
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            trio.run(rt.serve)
        except BaseException as exc:  # surfaced to the thread that started us
            errors.append(exc)
            rt.started.set()

    install_interrupt_handler()
    thread = threading.Thread(target=run, name="regency-runtime", daemon=True)
    thread.start()
    rt.started.wait()
    if errors:
        raise RuntimeError(f"regency runtime failed to start: {errors[0]!r}") from errors[0]
    _runtime = rt
    atexit.register(_shutdown_controller, rt, thread, jobdir)


def _shutdown_controller(rt: Runtime, thread: threading.Thread, jobdir: str) -> None:
    global _runtime
    from ._hosts import detach_all
    from ._mesh import stop_owned_procs

    try:
        stop_owned_procs(rt, timeout=1.0)
        rt.call_soon(lambda: detach_all(rt))
    finally:
        rt.stop()
        thread.join(timeout=2.0)
        _runtime = None
        import shutil

        shutil.rmtree(jobdir, ignore_errors=True)
