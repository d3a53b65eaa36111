"""Child procs: the :class:`Child` record, and planning, launching and watching the procs
a runtime starts (:class:`ChildProcs`, the runtime's ``child_procs``, which reads the
runtime through :class:`ChildHost`), stopping them, and waiting for them to start."""

from __future__ import annotations

import functools
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..supervision import ProcStopped
from . import _extensions
from . import _messages as M
from ._config import Config
from ._errors import BootstrapError, RemoteFailure, SupervisionError, UndeliverableError
from ._future import Future
from ._launcher import ProcHandle, ProcLauncher
from ._liveness import BusyWatch
from ._output_tail import format_tail, read_tail, tail_path
from ._trace import TraceRing

if TYPE_CHECKING:
    from ._outbox import Outbox
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")
stall_log = logging.getLogger("regency.stall")


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
        #: Whether "silent but busy" was logged for it already (once is enough).
        self.busy_logged = False
        #: Whether its silence was reported as a stall (``regency.stall``) already.
        self.silence_warned = False
        #: Its coordinates in the proc mesh it was spawned in: (label, index) pairs.
        self.coords: tuple[tuple[str, int], ...] = ()
        #: The ``tail_log_lines`` it was started with, and once it exited its last lines of
        #: output as (stream, line) pairs (core/_output_tail.py), which its exit's
        #: description ends with.
        self.tail_lines = 0
        self.output_tail: tuple[tuple[str, str], ...] = ()
        #: What its bootstrap callable raised, as its HELLO reported it before it exited.
        self.boot_failure: RemoteFailure | None = None

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
        elif self.boot_failure is not None:
            failure = self.boot_failure
            how += f" after its bootstrap function raised {failure.type_name}: {failure.message}"
        return f"proc {self.proc_id} {how}{format_tail(self.output_tail)}"


def _free_tcp_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class ChildHost(Protocol):
    """What :class:`ChildProcs` needs of the runtime it is a part of."""

    proc_id: str
    address: str
    secret: bytes
    jobdir: str
    root_address: str | None
    launcher: ProcLauncher | None
    #: The trace ring while tracing is on (core/_trace.py).
    trace: TraceRing | None

    @property
    def config(self) -> Config: ...

    def refresh_config(self) -> Config:
        """Take up ``regency.configure()`` changes made since the runtime started; the
        runtime owns its live configuration."""
        ...

    def on_runtime_thread(self) -> bool: ...

    def outbox(self, address: str) -> Outbox: ...


class ChildProcs:
    """The procs a runtime launched: planning, launching, exits, heartbeats (the runtime's
    ``child_procs``). Reads what it needs of the runtime through :class:`ChildHost`."""

    def __init__(self, host: ChildHost) -> None:
        self._host = host
        #: The procs launched, by address.
        self.children: dict[str, Child] = {}
        #: Sends to a planned child wait for its HELLO: set then, or when it exits.
        self.child_ready: dict[str, trio.Event] = {}
        #: Called (on the runtime's thread) with each child that exits.
        self.on_child_exit: list[Callable[[Child], None]] = []
        self._ids = itertools.count()
        #: CPU time of silent children between looks (busy or stuck, see _liveness).
        self._busy = BusyWatch()

    def default_address(self, proc_id: str) -> str:
        """Where the proc ``proc_id`` listens: its launcher's choice, else one of the
        configured transport's (a socket in the job directory, a free port)."""
        host = self._host
        decided = host.launcher.address_for(proc_id) if host.launcher is not None else None
        if decided is not None:
            return decided
        config = host.config
        if config.default_transport == "unix":
            return f"unix://{host.jobdir}/{proc_id}.sock"
        if config.default_transport == "tcp":
            return f"tcp://{config.tcp_host}:{_free_tcp_port(config.tcp_host)}"
        if config.default_transport == "nng+ipc":
            return f"nng+ipc://{host.jobdir}/{proc_id}.nng"
        scheme = config.default_transport
        return f"{scheme}://{config.tcp_host}:{_free_tcp_port(config.tcp_host)}"

    def plan(self, count: int, name: str) -> list[Child]:
        """Name and address ``count`` new procs. Thread-safe; starts nothing.

        Picks up ``regency.configure()`` changes made since the runtime started.
        """
        self._host.refresh_config()
        children = []
        for _ in range(count):
            proc_id = self.new_proc_id(name)
            children.append(self.plan_child(proc_id, self.default_address(proc_id)))
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
                address = launcher.address_for(proc_id) or self.default_address(proc_id)
                child = self.plan_child(proc_id, address)
                child.launcher = launcher
                children.append(child)
        return children

    def new_proc_id(self, name: str) -> str:
        return f"{self._host.proc_id}.{name}{next(self._ids)}"

    def plan_child(self, proc_id: str, address: str) -> Child:
        # The child gets, and is watched by, today's settings.
        config = self._host.refresh_config()
        child = Child(proc_id, address)
        child.heartbeat_timeout = config.heartbeat_timeout
        child.tail_lines = config.tail_log_lines
        # Sends to the child wait for its HELLO; the event exists before any send.
        self.child_ready[address] = trio.Event()
        return child

    def bootstrap_record(self, child: Child, boot: str | None) -> dict[str, Any]:
        """What a new proc needs to become one (see :mod:`regency.core._bootstrap`)."""
        host = self._host
        return {
            "proc_id": child.proc_id,
            "address": child.address,
            "parent_address": host.address,
            "root_address": host.root_address or host.address,
            "secret": host.secret.hex(),
            "jobdir": host.jobdir,
            "config": host.config.to_env(),
            "sys_path": list(sys.path),
            "parent_pid": os.getpid(),
            "boot": boot,
        }

    def launch(self, children: list[Child], env: dict[str, str] | None, boot: str | None) -> None:
        """Start planned procs (on the trio thread); they connect back when ready."""
        host = self._host
        assert host.on_runtime_thread()
        assert host.launcher is not None
        for child in children:
            self.children[child.address] = child
            launcher = child.launcher or host.launcher
            try:
                child.handle = launcher.launch(
                    self.bootstrap_record(child, boot),
                    dict(env or {}),
                    functools.partial(self.exited, child),
                )
            except Exception as exc:
                log.error("could not start proc %s: %s", child.proc_id, exc)
                child.killed_for = f"could not be started ({exc})"
                self.exited(child, 1)

    def exited(self, child: Child, code: int) -> None:
        """``child`` exited with ``code`` (negative: killed by that signal); once."""
        if child.returncode is not None:
            return  # already known (a remote proc declared lost, then reported)
        child.returncode = code
        if child.tail_lines and not child.output_tail:  # a worker may have sent it already
            child.output_tail = read_tail(tail_path(self._host.jobdir, child.proc_id))
        child.exited.set()
        ready = self.child_ready.pop(child.address, None)
        if ready is not None:
            ready.set()  # wakes senders waiting for it; they find the outbox broken
        error = ProcessLookupError(child.describe_exit())
        trace = self._host.trace
        if trace is not None:
            trace.instant(f"proc {child.proc_id}", "proc exited", {"how": child.describe_exit()})
        self._host.outbox(child.address).give_up(error)
        for hook in self.on_child_exit:
            hook(child)

    def kill_all(self) -> None:
        """Kill every child still running (the runtime is stopping)."""
        for child in self.children.values():
            if child.handle is not None and child.returncode is None:
                child.handle.kill()

    def check_heartbeats(self, now: float) -> None:
        """Kill a started child whose heartbeats stopped for ``heartbeat_timeout``."""
        for child in list(self.children.values()):
            handle = child.handle
            local_pid = handle.pid if handle is not None and not handle.remote else 0
            if child.last_seen is None or child.returncode is not None:
                if local_pid and child.returncode is not None:
                    self._busy.forget(local_pid)
                continue
            silent = now - child.last_seen
            self._warn_silent(child, silent, local_pid)
            # Every look samples the child's CPU time, so that when it falls silent we know
            # whether it has been computing. Silent but computing (a long C call holding the
            # GIL) is not stuck; a stopped proc, or one using no CPU, is (see _liveness).
            busy = bool(local_pid) and self._busy.busy(
                local_pid, now, max(child.heartbeat_timeout, 1.0)
            )
            if busy and silent > child.heartbeat_timeout:
                if not child.busy_logged:
                    child.busy_logged = True
                    log.warning(
                        "proc %s has sent no heartbeat for %.1f s but its CPU time advances: "
                        "busy (a long call holding the GIL), not stuck",
                        child.proc_id,
                        silent,
                    )
                continue
            if silent > child.heartbeat_timeout and child.handle is not None:
                child.killed_for = f"sent no heartbeat for {silent:.1f} s (stuck)"
                log.error("proc %s %s; killing it", child.proc_id, child.killed_for)
                child.last_seen = None
                child.handle.kill()
                if child.handle.remote:
                    # Its host may be unreachable: the kill cannot be confirmed.
                    self.exited(child, -signal.SIGKILL)

    def peer_busy(self, address: str, now: float) -> bool:
        """Whether the proc at ``address`` is known to be alive and computing: not stopped,
        and its CPU time advanced within ``heartbeat_timeout`` (the watchdog's "busy, not
        stuck", ``_check_heartbeats``; ``now`` on the same clock; a proc needs two looks a
        moment apart, the first says False). Its outbox then waits for its acknowledgements
        instead of dropping the link (``Outbound.tick``). It can tell for a child started on
        this host, and for another proc of this host behind a unix socket (a sibling: the
        process listening at the socket's path); False for what it cannot see: procs on
        other hosts (their worker watches them), simulated procs."""
        child = self.children.get(address)
        if child is not None:
            handle = child.handle
            if child.returncode is not None or handle is None or handle.remote:
                return False
            pid, window = handle.pid, child.heartbeat_timeout
        else:
            pid, window = _listener_pid(address) or 0, self._host.config.heartbeat_timeout
        if not pid:
            return False
        return self._busy.busy(pid, now, max(window, 1.0))

    def _warn_silent(self, child: Child, silent: float, pid: int) -> None:
        """A proc whose event loop stopped answering (no heartbeat for half of
        ``heartbeat_timeout``) is reported as a stall (logger ``regency.stall``) before it
        is declared stuck; once, and once more when it answers again."""
        config = self._host.config
        if not config.stall_warning_s:
            return
        limit = max(child.heartbeat_timeout / 2, 2 * config.heartbeat_interval)
        if silent > limit and not child.silence_warned:
            child.silence_warned = True
            where = f"pid {pid}" if pid else "on another host"
            stall_log.warning(
                "stalled: proc %s (%s) has sent no heartbeat for %.1f s: its event loop is "
                "blocked (a long call on the loop, a sync wait inside an async endpoint, or "
                "a paused process); it counts as stuck after %.1f s unless its CPU time "
                "advances",
                child.proc_id,
                where,
                silent,
                child.heartbeat_timeout,
            )
        elif silent <= limit and child.silence_warned:
            child.silence_warned = False
            stall_log.info("proc %s answers again", child.proc_id)


#: Pids of the processes listening at unix socket paths (with their start times, to tell a
#: reused pid), found by :func:`_listener_pid`.
_listeners: dict[str, tuple[int, str]] = {}


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    return fields[19].decode() if len(fields) > 19 else None


def _listener_pid(address: str) -> int | None:
    """The pid of the process of this host listening at ``address`` when it is a unix
    socket (``unix:///path``), from ``/proc`` (Linux; None elsewhere, or when it cannot be
    seen: another user's, or nothing listens). A scan of every process's descriptors, so
    the answer is kept (and checked against the process's start time on later calls)."""
    if not address.startswith("unix://"):
        return None
    path = address[len("unix://") :]
    known = _listeners.get(path)
    if known is not None:
        if _start_time(known[0]) == known[1]:
            return known[0]
        del _listeners[path]
    try:
        with open("/proc/net/unix") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    inode = None
    for line in lines:
        parts = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: listening.
        if len(parts) >= 8 and parts[7] == path and int(parts[3], 16) & 0x10000:
            inode = parts[6]
            break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    break
            except OSError:
                continue
        else:
            continue
        started = _start_time(pid)
        if started is None:
            return None
        if len(_listeners) > 256:
            _listeners.clear()
        _listeners[path] = (pid, started)
        return pid
    return None


async def _wait_ready(rt: Runtime, children: list[Child], ready: Future[None]) -> None:
    try:
        with trio.fail_after(rt.config.spawn_timeout):
            for child in children:
                event = rt.child_ready.get(child.address)
                if event is not None:
                    async with trio.open_nursery() as n:

                        async def exited(c: Child = child) -> None:
                            await c.exited.wait()
                            n.cancel_scope.cancel()

                        n.start_soon(exited)
                        await event.wait()
                        n.cancel_scope.cancel()
                if child.returncode is not None:
                    if child.boot_failure is not None:
                        raise BootstrapError(
                            child.proc_id, child.boot_failure, format_tail(child.output_tail)
                        )
                    raise SupervisionError(
                        f"proc {child.proc_id} exited with {child.returncode} before it "
                        f"started{format_tail(child.output_tail)}"
                    )
    except trio.TooSlowError:
        ready.set_exception(
            TimeoutError(f"procs did not start within spawn_timeout={rt.config.spawn_timeout} s")
        )
    except Exception as exc:
        ready.set_exception(exc)
    else:
        ready.set_result(None)


async def _stop_procs(rt: Runtime, addresses: list[str], done: Future[None]) -> None:
    # A barrier: no line printed before stop is lost.
    await _extensions.log_forwarding().flush_procs(rt, addresses)
    for address in addresses:
        rt.oversight.feed(ProcStopped(address))  # stopping is not failing
    children = [rt.children[a] for a in addresses if a in rt.children]
    for child in children:
        remote = child.handle is not None and child.handle.remote
        if child.returncode is None and remote and child.address in rt.lost:
            # Declared lost (its worker died): no exit status will ever come; don't wait.
            rt.child_procs.exited(child, -signal.SIGKILL)
    for child in children:
        if child.returncode is None:
            try:
                rt.post(child.address, M.StopProc(None))
            except UndeliverableError:
                pass
    with trio.move_on_after(rt.config.stop_timeout):
        for child in children:
            await child.exited.wait()
    for child in children:
        if child.returncode is None and child.handle is not None:
            child.handle.kill()
    with trio.move_on_after(rt.config.stop_timeout):
        for child in children:
            await child.exited.wait()
    for child in children:
        if child.returncode is None:  # a remote proc whose worker is gone, or never started
            rt.child_procs.exited(child, -signal.SIGKILL)
    done.set_result(None)


def stop_owned_procs(rt: Runtime, timeout: float) -> None:
    """At exit: ask every child proc to stop, then kill what is left."""
    if not rt.children:
        return
    done: Future[None] = Future()
    addresses = list(rt.children)

    try:
        rt.start_soon(_stop_procs, rt, addresses, done)
        done.get(timeout)
    except Exception:
        for child in list(rt.children.values()):
            if child.handle is not None and child.returncode is None:
                child.handle.kill()


# -- ports and channels --------------------------------------------------------------------
