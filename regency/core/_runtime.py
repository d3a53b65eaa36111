"""The per-process runtime: one trio loop that owns this process's connections, actors and
reply ports.

Every process of a job (the controller and each proc) runs exactly one :class:`Runtime`. It
listens on one address, dials peers lazily through an :class:`~regency.core._outbox.Outbox`
per destination, dispatches incoming frames to actor mailboxes and reply ports, and starts
child procs through a :class:`~regency.core._launcher.ProcLauncher`. It reaches the network
only through :mod:`regency.transports`. Its parts live in their own modules: delivery
(:mod:`._outbox`, :mod:`._inbound`), child procs (:mod:`._children`), reply ports
(:mod:`._ports`); the controller's boot in :mod:`._controller`.

Ordering: a sender always uses the one connection it dialed to a destination, so frames from
one sender to one receiver arrive in send order; mailboxes are FIFO, so handling is in order.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import random
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, assert_never

import trio

from .. import transports
from ..supervision import FailureCause, ProcLost, RanksFailed
from . import _codec, _waiting
from . import _extensions as _ext
from . import _messages as M
from ._aio import AsyncioBridge, drive
from ._casting import Casting
from ._children import Child, ChildProcs
from ._config import Config, current_config
from ._controller import current_runtime, derive_secret, job_secret
from ._current import _runtime_var, current_runtime_or_none, set_current_runtime, use_runtime
from ._environment import Environment, TransportFactory, production
from ._errors import RemoteFailure, SupervisionError, UndeliverableError
from ._executor import Executor
from ._inbound import _ACK_DELAY, _ACK_EVERY, InboundSessions, InboundSink
from ._introspect import install as install_introspection
from ._introspect import watch_stalls
from ._launcher import ProcLauncher, ZygoteLauncher
from ._leader import Leader
from ._mailbox import ActorCell
from ._metrics import count_received
from ._outbox import Outbox
from ._oversight import Oversight
from ._ports import PortBase, PortHandler, PortTable
from ._probe import Probe
from ._stacks import Stall
from ._ticker import Ticker
from ._trace import TraceRing
from ._trace import install as install_trace

if TYPE_CHECKING:
    from ._hosts import _Hosts

_REPLY_MARK = _codec.REPLY_MARK
#: A SPAWN's payload while a thread decodes it (``Runtime._spawns``).
_DECODING: Any = object()
#: Port ids from here up are reserved for services (regency/_logs/_records.py, _introspect.py).
_RESERVED_PORTS = 1 << 63

log = logging.getLogger("regency.runtime")


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
        env: Environment | None = None,
    ) -> None:
        self.proc_id = proc_id
        self.secret = secret
        self.jobdir = jobdir
        self.config = config
        #: The world this runtime runs in (see :mod:`regency.core._environment`).
        self.env = env = env if env is not None else production()
        #: Starts procs on this host; made from ``env.launcher`` when ``serve`` starts.
        self.launcher: ProcLauncher | None = None
        #: The procs it launched (core/_children.py), and their tables under the runtime's
        #: names (read widely: the dashboard, introspection, the simulator's checks).
        self.child_procs = ChildProcs(self)
        self.children: dict[str, Child] = self.child_procs.children
        self.child_ready: dict[str, trio.Event] = self.child_procs.child_ready
        self.on_child_exit: list[Callable[[Child], None]] = self.child_procs.on_child_exit
        #: The workers this runtime attached to (core/_hosts.py), once it has attached.
        self.hosts: _Hosts | None = None
        #: Whether the proc at an address is alive and computing (an outbox's verdict).
        self.peer_busy = self.child_procs.peer_busy
        self.address: str = address or self.child_procs.default_address(proc_id)
        self.parent_address = parent_address
        #: The job's controller (procs learn it from their bootstrap record); None: this one.
        self.root_address: str | None = None
        self.rng = random.Random(seed)
        self.actors: dict[str, ActorCell] = {}
        #: Keys of actors that stopped or failed here, with why (later messages bounce).
        self.dead: dict[str, RemoteFailure] = {}
        #: Messages for actors whose SPAWN has not arrived yet (a third party may know the
        #: mesh before the SPAWN from its owner reaches this proc).
        self.limbo: dict[str, list[M.Call | M.StopActor]] = {}
        #: SPAWNs decoded off the loop, and those that came after them, in arrival order:
        #: each applies once it and every SPAWN before it are decoded (a small SPAWN must
        #: not overtake a big one: an actor that fails poisons its proc for the later ones).
        self._spawns: deque[list[Any]] = deque()
        #: Its open reply ports (core/_ports.py), and the table's operations under the
        #: runtime's names (bound once: no call frame more on the hot path).
        self.port_table = PortTable(self)
        self.ports: dict[int, PortHandler] = self.port_table.ports
        self.open_port = self.port_table.open
        self.close_port = self.port_table.close
        self.send_port = self.port_table.send_to
        self.deliver_reply = self.port_table.deliver
        #: One outbox per peer address, made on first use by :meth:`outbox` (read it to
        #: find one without making it; only the runtime adds or drops them).
        self.outboxes: dict[str, Outbox] = {}
        self._outbox_lock = threading.Lock()
        self._names = itertools.count()
        self.started = threading.Event()
        #: ``spawn_procs(bootstrap=fn)``'s ``fn``: run once this runtime listens, before it
        #: says HELLO, so it may use the runtime (spawn actors on ``this_proc()``, call them).
        self.boot: Callable[[], Any] | None = None
        #: What ``boot`` raised (reported to the spawner; :meth:`serve` raises it next).
        self.boot_error: Exception | None = None
        self.thread_id: int | None = None
        #: Where actor threads run and how they block (:mod:`._executor`): real threads in
        #: production, lockstep threads in the simulator (the environment's executor).
        self.executor: Executor = self.env.executor(self)
        self.oversight = Oversight(self)
        #: Handlers for frame kinds beyond the core ones (the worker daemon's, the
        #: controller's side of multi-host), by kind. Called on the trio thread.
        self.extensions: dict[type[M.HostMessage], Callable[[Any], None]] = {}
        #: Set once an actor here failed: the proc refuses new actors from then on.
        self.poisoned: RemoteFailure | None = None
        #: Addresses of the procs declared lost (each reported to supervision once).
        self.lost: set[str] = set()
        self._sessions = itertools.count(1)
        #: Set when this runtime's loop died (``runtime_died``): new calls fail with it.
        self.died: SupervisionError | None = None
        #: How this runtime's threads wait for futures (core/_waiting.py): the environment's
        #: waiter (production's reads replies on the waiting thread, the simulator's takes
        #: turns with its loop).
        self.waiter: _waiting.Waiter = self.env.waiter(self)
        #: The waiter when it is a :class:`Leader` (threads read their own replies), for
        #: its counters and settings; None otherwise.
        self.leader: Leader | None = self.waiter if type(self.waiter) is Leader else None
        self._nonce = f"{self.rng.getrandbits(64):016x}"
        #: Held while a frame is handled, on the loop or on a thread reading its own reply.
        self.dispatch_lock = threading.RLock()
        #: Its inbound sessions: which frames were handled, acknowledgements, and the
        #: connections a waiting thread may read.
        self.inbound = InboundSessions(
            config, self.env, self.dispatch_lock, lambda fn: self.nursery.start_soon(fn)
        )
        #: Casting trees: this runtime's fences as a sender, and its part as a forwarder.
        self.casting = Casting(self)
        #: Sends a stall report to the controller (or logs it, in the controller); set by
        #: ``_introspect.install``, with the stacks service and the stall sink.
        self.report_stall: Callable[[Stall], None] | None = None
        install_introspection(self)
        #: The ring of trace events while tracing is on (core/_trace.py); None: off.
        self.trace: TraceRing | None = None
        install_trace(self)

    # What the environment decides, read-only: a runtime's world does not change under it.

    @property
    def ticker(self) -> Ticker:
        """Runs the heartbeats and the watchdog (the simulator's skips idle virtual time)."""
        return self.env.ticker

    @property
    def probe(self) -> Probe | None:
        """Told what delivery and supervision do (the simulator's invariant checker)."""
        return self.env.probe

    @property
    def ack_every(self) -> int:
        """Inbound frames are acknowledged after this many, or ..."""
        return self.env.ack_every

    @property
    def ack_delay(self) -> float:
        """... after this many seconds, whichever comes first."""
        return self.env.ack_delay

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`stop`. Signals readiness once listening."""
        self.thread_id = threading.get_ident()
        _waiting.enter_loop()  # a blocking wait on this thread would freeze the runtime
        serving = False
        clean = False
        self.token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        try:
            _runtime_var.set(self)  # tasks spawned from here on know their runtime
            async with self.env.transport(self) as transport, trio.open_nursery() as nursery:
                self.transport = transport
                self.nursery = nursery
                self._asyncio = AsyncioBridge(nursery)
                self.launcher = self.env.launcher(nursery)
                listener = await transport.listen(self.address, lambda c: InboundSink(self))
                self.address = self.local_address = listener.address
                # Frames this process sends to itself take the in-process transport, where
                # there is one (the simulator's network carries them like any other).
                if "inproc" in transport.schemes:
                    self._loopback = await transport.listen(
                        f"inproc://{self.proc_id}-{os.getpid()}-{id(self)}",
                        lambda c: InboundSink(self),
                    )
                else:
                    self._loopback = listener
                if self.boot is not None:
                    try:
                        await self._run_boot(self.boot)
                    except Exception as exc:
                        self.boot_error = exc
                        await self._report_boot_failure(exc)
                        raise
                if self.parent_address is not None:
                    self.outbox(self.parent_address).send(
                        _codec.encode(M.Hello(self.proc_id, self.address))
                    )
                if self.parent_address is None and isinstance(self.launcher, ZygoteLauncher):
                    # The zygote removes our job directory should we die without doing so
                    # (a killed Jupyter kernel); a proc's jobdir is its spawner's.
                    self.launcher.remove_when_orphaned(self.jobdir)
                    # A controller will almost surely spawn procs: warm the zygote now.
                    self.launcher.start()
                if self.parent_address is not None:
                    nursery.start_soon(self._send_heartbeats, self.parent_address)
                nursery.start_soon(self._watchdog)
                serving = _waiting.serve(self.waiter)  # the process's other threads' too
                self.started.set()
                task_status.started()
                await self._stop_event.wait()
                self.child_procs.kill_all()
                nursery.cancel_scope.cancel()
            clean = True
        finally:
            if serving:
                _waiting.unserve(self.waiter)
            _waiting.leave_loop()
            for cell in list(self.actors.values()):
                cell.abandon()
            if clean:  # otherwise runtime_died() fails them, saying why
                for handler in list(self.ports.values()):
                    handler.fail(UndeliverableError("the runtime stopped"))
                self.ports.clear()

    async def _run_boot(self, boot: Callable[[], Any]) -> None:
        """Run the proc's bootstrap callable: an async one on this loop (asyncio and trio
        code both work), a sync one on a thread (it may block on futures this loop serves).
        Raising ends the proc (exit status 1: its spawner's ``initialized`` fails)."""
        if inspect.iscoroutinefunction(boot):
            await self.run_coroutine(boot())
            return
        result = await self.executor.run(boot)  # (the simulator's: a lockstep thread)
        if inspect.iscoroutine(result):  # a sync callable that returned a coroutine
            await self.run_coroutine(result)

    async def _report_boot_failure(self, exc: Exception) -> None:
        """Tell the spawner what the bootstrap callable raised, in a HELLO, and wait (within
        ``stop_timeout``) until it has handled it: the proc exits next, and its spawner
        fails the spawn with this error rather than with a bare exit status."""
        if self.parent_address is None:
            return
        failure = RemoteFailure.capture(exc)
        error = (failure.type_name, failure.message, failure.traceback)
        hello = M.Hello(self.proc_id, self.address, error)
        box = self.outbox(self.parent_address)
        box.send(_codec.encode(hello))
        with trio.move_on_after(self.config.stop_timeout):
            while not (box.idle or box.failed):  # acknowledged: the spawner handled it
                await trio.sleep(0.01)

    def runtime_died(self, exc: BaseException) -> None:
        """The trio loop of this runtime ended with ``exc`` (called on its thread once
        ``trio.run`` has returned): say so on stderr, fail every pending call with an error
        naming the cause, and refuse new ones at once instead of letting them hang."""
        cause = exc
        while True:  # the one exception behind trio's wrappers
            if isinstance(cause, trio.TrioInternalError) and cause.__cause__ is not None:
                cause = cause.__cause__
            elif isinstance(cause, BaseExceptionGroup) and len(cause.exceptions) == 1:
                cause = cause.exceptions[0]
            else:
                break
        self.died = SupervisionError(
            f"the Regency runtime thread died: {type(cause).__name__}: {cause}"
        )
        import traceback

        # Reserved ports (services: the log sink, stacks; ids with the top bit set) are no calls.
        pending = sum(1 for port_id in self.ports if port_id < _RESERVED_PORTS)
        print(
            f"regency: {self.died}; failing {pending} pending call(s)",
            file=sys.stderr,
            flush=True,
        )
        traceback.print_exception(cause, file=sys.stderr)
        for handler in list(self.ports.values()):
            try:
                handler.fail(self.died)
            except Exception:
                log.exception("failing a pending call")
        self.ports.clear()

    async def run_coroutine(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run an endpoint's coroutine here: trio code and asyncio code both work in it
        (asyncio through this runtime's asyncio loop; see ``_aio``)."""
        return await drive(coro, self._asyncio)

    async def listen_also(self, address: str) -> str:
        """Listen on another address too, and make it this runtime's identity from now on
        (ports and owner references opened later carry it). Multi-host jobs use this to
        give the controller a TCP address its remote procs can reach."""
        listener = await self.transport.listen(address, lambda c: InboundSink(self))
        self.address = listener.address
        return self.address

    async def _send_heartbeats(self, address: str) -> None:
        """Tell our spawner we are alive, from the trio loop: a stuck loop stops them."""
        frame = _codec.encode(M.Heartbeat(self.address))

        def beat(now: float) -> bool:
            try:
                self.send(address, frame)
            except Exception:
                return False  # the spawner is gone; we die with it
            return True

        await self.ticker.every(
            self._heartbeat_interval, beat, owner=self, kind="heartbeat", target=address
        )

    def _heartbeat_interval(self) -> float:
        return self.config.heartbeat_interval

    async def _watchdog(self) -> None:
        """Every ``heartbeat_interval``: kill a started child whose heartbeats stopped for
        ``heartbeat_timeout``, and drop connections whose acknowledgements stopped."""
        await self.ticker.every(
            self._heartbeat_interval, self.watchdog_tick, owner=self, kind="watchdog"
        )

    def watchdog_tick(self, now: float) -> None:
        """One round of the watchdog, as of ``now``."""
        for box in list(self.outboxes.values()):
            box.check_stalled(now)
        self.inbound.forget_idle(now)
        self._forget_broken_outboxes(now)
        self.child_procs.check_heartbeats(now)
        watch_stalls(self)

    def _forget_broken_outboxes(self, now: float) -> None:
        """Drop outboxes to peers that are gone for good (the session failed), once no
        resend or late report can concern them any more, so a long-lived process (a worker
        serving controller after controller) does not keep one per peer it ever had. Procs
        this runtime launched keep theirs: their failure is part of their record."""
        horizon = 3 * self.config.delivery_timeout + 2 * self.config.heartbeat_interval
        for address, box in list(self.outboxes.items()):
            if not box.failed or address in self.children:
                continue
            if box.broken_at is None:
                box.broken_at = now
            elif now - box.broken_at > horizon:
                del self.outboxes[address]
                self.lost.discard(address)

    async def _stop_actors_then_stop(self) -> None:
        """A proc told to stop stops its actors first, as Monarch's do: each ends what it
        owns, its running concurrent calls and then runs ``__cleanup__`` (after the messages
        already queued for it), within half of ``stop_timeout`` in all; then the runtime
        stops."""
        cells = list(self.actors.values())
        if cells:
            stopped = _AllStopped(len(cells))
            port = self.open_port(stopped)
            for cell in cells:
                cell.enqueue(M.StopActor(cell.key, port))
            with trio.move_on_after(self.config.stop_timeout / 2):
                await stopped.done.wait()
            self.close_port(port[1])
        self.stop()

    def stop(self) -> None:
        """Ask :meth:`serve` to return. Thread-safe."""
        self.call_soon(lambda: self._stop_event.set())

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

        def start() -> None:
            try:
                self.nursery.start_soon(task, name=fn)
            except RuntimeError:  # "Nursery is closed to new arrivals"
                if not self.closing:
                    raise
                # serve's last moments (its transport closing connections): nothing runs
                # tasks any more, and raising here would fail the proc as it exits.

        self.call_soon(start)

    @property
    def closing(self) -> bool:
        """Whether :meth:`serve` is on its way out: its nursery cancelled (stopped, or a task
        failed). A task started now is cancelled at its first checkpoint; once the nursery
        has closed (the transport still closing connections after it) none can start."""
        nursery: trio.Nursery | None = getattr(self, "nursery", None)
        return nursery is not None and nursery.cancel_scope.cancel_called

    def on_runtime_thread(self) -> bool:
        return threading.get_ident() == self.thread_id

    def new_session_id(self) -> str:
        """An id for a new delivery session from here, unique across jobs: the nonce, as a
        worker outlives its controllers, whose proc ids (from pids) can repeat."""
        return f"{self.proc_id}#{self._nonce}#{next(self._sessions)}"

    def refresh_config(self) -> Config:
        """Take up ``regency.configure()`` changes made since the runtime started (the
        runtime owns its live configuration; its parts read it here)."""
        self.config = current_config()
        return self.config

    # -- sending -------------------------------------------------------------------------

    def outbox(self, address: str) -> Outbox:
        box = self.outboxes.get(address)
        if box is None:
            with self._outbox_lock:
                box = self.outboxes.get(address)
                if box is None:
                    target = self._loopback.address if address == self.address else address
                    box = Outbox(self, target)
                    self.outboxes[address] = box
        return box

    def send(self, address: str, frame: transports.Frame) -> None:
        """Send a frame to the runtime at ``address``. Thread-safe, never blocks."""
        self.outbox(address).send(frame)

    def new_name(self, prefix: str) -> str:
        return f"{self.proc_id}.{prefix}{next(self._names)}"

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
        if address in self.lost:
            return
        self.lost.add(address)
        if child is not None and child.returncode is not None:
            cause = FailureCause(child.describe_exit(), exit_code=child.returncode)
        else:
            cause = FailureCause(f"lost the link to the proc at {address}: {exc}")
        error = UndeliverableError(cause.summary)
        # Supervision first: once a caller sees its call fail, a new call to those ranks
        # fails at once, and the owner's ``__supervise__`` is already queued. The root's
        # hook runs last: a caller waiting on one of these calls sees its own error first
        # (a notebook cell that catches it is not interrupted by the report).
        root = self.oversight.feed(ProcLost(address, cause), defer_root=True)
        with self.dispatch_lock:  # a thread may be delivering a reply to one of these
            for port_id, handler in list(self.ports.items()):
                if address in handler.dests:
                    if not handler.keep_port_on_loss:
                        del self.ports[port_id]
                    handler.fail(error, address)
        self.oversight.perform(root)

    # -- receiving -----------------------------------------------------------------------

    def on_frame(self, frame: memoryview) -> None:
        """Dispatch one frame. A malformed frame raises, closing that one connection; what
        cannot be unpickled inside a well-formed one fails only the call it belongs to.
        Nothing a peer sends can stop this runtime: a ``BaseException`` out of handling a
        frame becomes a ``ValueError`` here."""
        try:
            if frame[:4] == _REPLY_MARK:  # a compact reply (most of a controller's traffic)
                self.deliver_reply(*_codec.decode_reply(frame))
                return
            msg = _codec.decode(frame)
            # The two kinds that are nearly all the traffic skip the match (same outcome).
            if type(msg) is M.Call:
                cell = self.actors.get(msg.actor)
                if cell is not None:
                    cell.accept(msg)
                    if self.config.metrics:  # bytes of call frames per actor
                        count_received(self, msg, frame.nbytes)
                else:
                    self.to_actor(msg.actor, msg)
            elif type(msg) is M.Reply:
                self.port_table.deliver_record(msg)
            else:
                self.dispatch(msg)
        except (Exception, KeyboardInterrupt, trio.Cancelled):
            raise
        except BaseException as exc:
            raise ValueError(f"handling a frame raised {type(exc).__name__}: {exc}") from exc

    def dispatch(self, msg: M.Wire) -> None:
        """Handle one message from a peer (on the trio thread). Session control belongs to
        the connection's sink; here it raises like a malformed frame."""
        match msg:
            case M.Reply():
                self.port_table.deliver_record(msg)
            case M.Call():
                self.to_actor(msg.actor, msg)
            case M.Cast():
                self.casting.on_cast(msg)
            case M.Spawn():
                payload = msg.payload
                if type(payload) is M.Unpickled:
                    if self.executor.runs_freely:
                        # On a thread, so heartbeats go on while the class's modules import
                        # (a notebook's brings torch: seconds); messages for the actor wait
                        # in ``limbo`` meanwhile. Other executors (the simulator's) unpickle
                        # here: only their own threads may run.
                        slot = [msg, _DECODING]
                        self._spawns.append(slot)
                        self.start_soon(self._spawn_off_loop, slot)
                        return
                    payload = _codec.load_pickled(payload)
                if self._spawns:  # behind a SPAWN still decoding
                    self._spawns.append([msg, payload])
                    return
                self._spawn_decoded(msg, payload)
            case M.Failed():
                if type(msg.payload) is M.Undecodable:
                    raise msg.payload.error
                self.oversight.feed(RanksFailed(msg.mesh, (msg.rank,), msg.payload))
            case M.Heartbeat():
                child = self.children.get(msg.address)
                if child is not None and child.last_seen is not None:
                    child.last_seen = trio.current_time()
                    child.busy_logged = False
            case M.StopActor():
                self.to_actor(msg.actor, msg)
            case M.StopProc():
                if msg.port is not None:
                    self.send_port(msg.port, 0, M.OK, None)
                self.nursery.start_soon(self._stop_actors_then_stop)
            case M.Hello(error=error) if error is not None:
                # Its bootstrap callable raised; it exits next. It never became ready: the
                # spawn learns of the failure from its exit (core/_children.py _wait_ready).
                failed = self.children.get(msg.address)
                if failed is not None:
                    failed.boot_failure = RemoteFailure(*error)
            case M.Hello():
                ready = self.child_ready.pop(msg.address, None)
                if ready is not None:
                    ready.set()
                child = self.children.get(msg.address)
                if child is not None:
                    child.last_seen = trio.current_time()
            case (
                M.Attach() | M.Reserve() | M.Launch() | M.Exited() | M.Kill() | M.Lease()
                | M.Detach() | M.Refused() | M.Lapsed()
            ):
                extension = self.extensions.get(type(msg))
                if extension is None:
                    raise ValueError(f"{type(msg).__name__} frames are not handled here")
                extension(msg)
            case M.Session() | M.Ack():
                raise ValueError(f"a {type(msg).__name__} frame outside session control")
            case _:
                assert_never(msg)

    def post(self, address: str, msg: M.Wire) -> None:
        """Encode ``msg`` and send it to the runtime at ``address``. Thread-safe."""
        self.send(address, _codec.encode(msg))

    def threaded_actor(self, key: str) -> bool:
        """Whether ``key`` is an actor here with a thread of its own (its calls may be
        queued by a thread that read them; see ``InboundSink.frame_on_thread``)."""
        cell = self.actors.get(key)
        return cell is not None and cell.threaded

    def to_actor(self, key: str, item: M.Call | M.StopActor) -> None:
        cell = self.actors.get(key)
        if cell is not None:
            cell.accept(item)
            return
        failure = self.dead.get(key)
        if failure is None:
            self.limbo.setdefault(key, []).append(item)
            return
        bounce(self, item, failure)

    async def _spawn_off_loop(self, slot: list[Any]) -> None:
        slot[1] = await trio.to_thread.run_sync(_codec.load_pickled, slot[0].payload)
        spawns = self._spawns
        while spawns and spawns[0][1] is not _DECODING:
            msg, payload = spawns.popleft()
            self._spawn_decoded(msg, payload)

    def _spawn_decoded(self, msg: M.Spawn, payload: Any) -> None:
        if type(payload) is M.Undecodable:
            payload = payload.error
        self.spawn_here(
            msg.actor, msg.name, (msg.rank, msg.labels, msg.sizes), payload, msg.port, msg.owner
        )

    def spawn_here(
        self,
        key: str,
        name: str,
        point: tuple[int, Sequence[str], Sequence[int]],
        payload: Any,
        port: tuple[str, int] | None,
        owner: tuple[str, str, str],
    ) -> None:
        """Make actor ``key`` on this proc from its decoded SPAWN (on the trio thread);
        a payload that is an exception makes an actor that fails at once."""
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
        # What waited in limbo goes in first, under the dispatch lock: from the moment the
        # cell is in the table a thread that reads a call for it may queue it (_inbound).
        with self.dispatch_lock:
            self.actors[key] = cell
            for item in self.limbo.pop(key, []):
                cell.enqueue(item)
        cell.start()

    def poison(self, failure: RemoteFailure) -> None:
        """An actor here failed: refuse new actors from now on (Monarch's poisoned proc).

        Not the controller's own process (the root runtime): it runs the user's program and
        the job's infrastructure actors (singleton controllers, the debugger's, RDMA
        managers), and no one can replace it; one failed actor there (a singleton whose
        failure its registry handled) would break those for the rest of the run, where a
        worker proc is simply not used again."""
        if self.poisoned is None and self.parent_address is not None:
            self.poisoned = failure

    def actor_gone(self, cell: ActorCell, failure: RemoteFailure) -> None:
        """A cell stopped or failed: later messages to it bounce with ``failure``."""
        self.actors.pop(cell.key, None)
        self.dead[cell.key] = failure


class _AllStopped(PortBase):
    """A port handler counting the acknowledgements of ``n`` StopActor messages."""

    def __init__(self, n: int) -> None:
        self.missing = n
        self.done = trio.Event()
        self.dests: frozenset[str] = frozenset()  # every actor is in this proc

    def deliver(self, index: int, status: int, value: Any) -> bool:
        self.missing -= 1
        if self.missing > 0:
            return False
        self.done.set()
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.done.set()


def bounce(rt: Runtime, item: M.MailboxItem, failure: RemoteFailure) -> None:
    """Answer a message for an actor that cannot take it (best effort: the caller's proc may
    be gone too, and nothing here may raise into the loop)."""
    try:
        match item:
            case M.Call(port=port, rank=index, payload=payload):
                if isinstance(payload, _ext.DeferredArguments):  # (the tensor engine's)
                    payload.abandoned(rt, failure.message)
                if port is not None:
                    rt.send_port(port, index, M.DEAD, failure)
            case M.StopActor(port=port) if port is not None:
                rt.send_port(port, 0, M.OK, None)
    except Exception as exc:
        log.info("could not bounce a message (%s): %s", type(item).__name__, exc)


# Names other modules (and tests) import from here; they live in their own modules now.
__all__ = [
    "_ACK_DELAY",
    "_ACK_EVERY",
    "Child",
    "Outbox",
    "PortHandler",
    "Runtime",
    "TransportFactory",
    "_InboundSink",
    "_runtime_var",
    "bounce",
    "current_runtime",
    "current_runtime_or_none",
    "derive_secret",
    "job_secret",
    "set_current_runtime",
    "use_runtime",
]
_InboundSink = InboundSink
