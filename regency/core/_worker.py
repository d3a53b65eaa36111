"""The worker daemon: ``regency worker --listen tcp://ADDR:PORT`` on each host of a job.

The scheme of ``--listen`` may be any TCP-capable transport (``tcp``, ``nng+tcp``,
``nng+tls+tcp``); the procs a worker launches listen on the scheme the controller chose for
them (:func:`regency.core._hostlinks.remote_scheme`).

A worker is a runtime that launches procs on its host for one controller at a time. The
controller attaches (ATTACH), asks for ports (RESERVE), launches procs (LAUNCH; a record may
carry a ``proc_bind`` binding, which the worker applies with numactl or taskset), kills them
(KILL), renews its lease (LEASE) and detaches (DETACH); the worker reports each proc's exit
(EXITED). Every link is authenticated by the job secret before any frame is read.

No orphans: the worker's procs die with the worker (``PR_SET_PDEATHSIG``), and when the
controller's lease runs out (it died, or its network is gone for longer than the lease) the
worker kills every proc it launched for it and waits for a new controller.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections import OrderedDict
from urllib.parse import urlsplit

import trio

from ..transports import scheme_of
from . import _messages as M
from ._bootstrap_command import BootstrapCommand
from ._current import set_current_runtime
from ._errors import RemoteFailure
from ._hostlinks import host_address
from ._launcher import LocalLauncher, ProcHandle
from ._liveness import BusyWatch
from ._output_tail import read_tail, tail_path
from ._proc_bind import RECORD_KEY, bind_command
from ._runtime import Runtime

log = logging.getLogger("regency.worker")

#: Ports handed out per RESERVE (and at ATTACH) when the controller asks for none in particular.
PORT_BATCH = 32
#: Most ports a worker holds reserved at once (each is a bound socket, a descriptor).
MAX_HELD_PORTS = 1024
#: Seconds the lease watcher sleeps between looks; a look much later than that means this
#: worker itself was not running (paused, stopped, starved), which is not the controller's
#: silence.
_LEASE_TICK = 0.1
_PAUSE = 0.5
#: A proc whose CPU time advanced within this many seconds counts as busy (vouched for).
_BUSY_WINDOW = 1.0


class WorkerService:
    """The worker's side of the multi-host protocol, installed on a runtime."""

    def __init__(self, rt: Runtime, host_ip: str, *, exit_on_shutdown: bool = False) -> None:
        self.rt = rt
        self.host_ip = host_ip
        #: ``run_worker_loop_forever`` workers exit when their controller shuts the host
        #: mesh down (``HostMesh.shutdown()``); ``regency worker`` daemons serve on.
        self.exit_on_shutdown = exit_on_shutdown
        #: Set when the worker should stop serving (a signal, or a shutdown as above).
        self.finished = trio.Event()
        self.controller: str | None = None
        self.lease = 0.0
        self.deadline = 0.0
        self.procs: dict[str, ProcHandle] = {}
        #: The proc ids of those procs, by address (where their output tails are).
        self.proc_ids: dict[str, str] = {}
        #: Reserved ports, each held by a bound (not listening) SO_REUSEADDR socket until
        #: its proc exits or the controller goes: another process cannot bind it meanwhile,
        #: while our proc (which binds with SO_REUSEADDR too) can.
        self.held: dict[int, socket.socket] = {}
        #: Controllers dropped because their lease ran out, with why (the latest few), so a
        #: late request from one gets a clear answer.
        self.lapsed: OrderedDict[str, str] = OrderedDict()
        self._busy = BusyWatch()
        rt.extensions[M.Attach] = self._attach
        rt.extensions[M.Reserve] = self._reserve
        rt.extensions[M.Launch] = self._launch
        rt.extensions[M.Kill] = self._kill
        rt.extensions[M.Lease] = self._renew
        rt.extensions[M.Detach] = self._detach

    # -- protocol ----------------------------------------------------------------------

    def _attach(self, msg: M.Attach) -> None:
        controller, lease, port = msg.controller, msg.lease, msg.port
        now = trio.current_time()
        if self.controller not in (None, controller) and now < self.deadline:
            message = f"worker {self.rt.address} already serves the controller at {self.controller}"
            log.warning("refused a second controller at %s: %s", controller, message)
            self.rt.send_port(port, 0, M.ERROR, RemoteFailure("regency.WorkerBusy", message, ""))
            return
        if self.controller not in (None, controller):
            self._release(f"a new controller attached ({controller})")
        self.lapsed.pop(controller, None)
        self.controller = controller
        self.lease = float(lease)
        self.deadline = now + self.lease
        log.info("attached to the controller at %s (lease %.1f s)", controller, self.lease)
        try:
            ports = self._reserve_ports(PORT_BATCH)
        except OSError as exc:
            self.rt.send_port(port, 0, M.ERROR, RemoteFailure("regency.WorkerBusy", str(exc), ""))
            return
        self.rt.send_port(port, 0, M.OK, (socket.gethostname(), self.host_ip, ports))

    def _not_ours(self, controller: str) -> str:
        """Why a request from ``controller`` is refused (it is not the one we serve)."""
        lapsed = self.lapsed.get(controller)
        if lapsed is not None:
            return lapsed
        if self.controller is None:
            return f"the worker at {self.rt.address} is not attached to this controller"
        return f"the worker at {self.rt.address} serves another controller ({self.controller})"

    def _reserve(self, msg: M.Reserve) -> None:
        controller, count, port = msg.controller, msg.count, msg.port
        if controller != self.controller:
            why = self._not_ours(controller)
            self.rt.send_port(port, 0, M.ERROR, RemoteFailure("regency.NotAttached", why, ""))
            return
        try:
            self.rt.send_port(port, 0, M.OK, self._reserve_ports(int(count)))
        except OSError as exc:
            self.rt.send_port(port, 0, M.ERROR, RemoteFailure("regency.WorkerBusy", str(exc), ""))

    def _launch(self, msg: M.Launch) -> None:
        controller = msg.controller
        if type(msg.payload) is M.Undecodable:
            raise msg.payload.error
        requests = msg.payload
        if controller != self.controller:
            why = self._not_ours(controller)
            log.warning("refused a launch from %s: %s", controller, why)
            for record, _env in requests:
                self._refuse(controller, record["address"], why)
            return
        assert self.rt.launcher is not None
        for record, env in requests:
            taken = self._port_taken(record["address"])
            if taken is not None:
                log.error("not launching %s: %s", record["proc_id"], taken)
                self._refuse(controller, record["address"], taken)
                continue
            # The proc runs on this host: our interpreter's path, our job dir, us as parent.
            record["sys_path"] = list(sys.path)
            record["jobdir"] = self.rt.jobdir
            record["parent_pid"] = os.getpid()
            address = record["address"]
            record["config"] = {
                **record["config"],
                "REGENCY_DEFAULT_TRANSPORT": scheme_of(address),
                "REGENCY_TCP_HOST": self.host_ip,
            }
            launcher = self.rt.launcher
            bind = record.pop(RECORD_KEY, None)
            if bind is not None:  # spawn_procs(proc_bind=...): numactl/taskset, as here
                try:
                    command = bind_command(bind, BootstrapCommand(sys.executable))
                except (ValueError, FileNotFoundError) as exc:
                    log.error("not launching %s: %s", record["proc_id"], exc)
                    self._refuse(controller, address, f"{exc} (on {socket.gethostname()})")
                    continue
                launcher = LocalLauncher(self.rt.nursery, command=command)
            self.proc_ids[address] = record["proc_id"]
            self.procs[address] = launcher.launch(
                record, env, functools.partial(self._exited, address)
            )

    def _refuse(self, controller: str, address: str, why: str) -> None:
        try:
            self.rt.post(controller, M.Refused(address, why))
        except Exception as exc:
            log.warning("could not tell %s that %s was refused: %s", controller, address, exc)

    def _port_taken(self, address: str) -> str | None:
        """Why the proc at ``address`` could not listen there, or None when it can: another
        process may have taken the port although we reserved it (one that also sets
        SO_REUSEADDR and listens), which the proc would only find out by dying."""
        port = urlsplit(address).port
        if port is None:
            return None
        probe = socket.socket(socket.AF_INET6 if ":" in self.host_ip else socket.AF_INET)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((self.host_ip, port))
        except OSError as exc:
            return (
                f"port {port} on {socket.gethostname()} ({self.host_ip}) was taken by another "
                f"process after this worker reserved it ({exc.strerror or exc}); spawn again "
                "to get other ports"
            )
        finally:
            probe.close()
        return None

    def _exited(self, address: str, code: int) -> None:
        handle = self.procs.pop(address, None)
        if handle is not None and handle.pid:
            self._busy.forget(handle.pid)
        port = urlsplit(address).port
        held = self.held.pop(port, None) if port is not None else None
        if held is not None:
            held.close()
        proc_id = self.proc_ids.pop(address, None)
        tail = read_tail(tail_path(self.rt.jobdir, proc_id)) if proc_id is not None else ()
        if self.controller is not None:
            try:
                self.rt.post(self.controller, M.Exited(address, code, tail))
            except Exception as exc:
                log.warning("could not report the exit of %s: %s", address, exc)

    def _kill(self, msg: M.Kill) -> None:
        controller, address = msg.controller, msg.address
        handle = self.procs.get(address)
        if controller == self.controller and handle is not None:
            handle.kill()

    def _renew(self, msg: M.Lease) -> None:
        controller = msg.controller
        if controller == self.controller:
            self.deadline = trio.current_time() + self.lease
        elif controller in self.lapsed:
            self._tell_lapsed(controller)

    def _tell_lapsed(self, controller: str) -> None:
        try:
            self.rt.post(controller, M.Lapsed(self.rt.address, self.lapsed[controller]))
        except Exception as exc:
            log.info("could not tell %s its lease lapsed: %s", controller, exc)

    def _detach(self, msg: M.Detach) -> None:
        if msg.controller == self.controller:
            self._release(
                "the controller shut the host mesh down"
                if msg.shutdown
                else "the controller detached"
            )
            if msg.shutdown and self.exit_on_shutdown:
                log.info("exiting: the controller shut the host mesh down")
                self.finished.set()

    # -- lifetime ------------------------------------------------------------------------

    def _release(self, why: str) -> None:
        """Kill every proc launched for the current controller and forget it."""
        if self.procs:
            log.warning("killing %d proc(s): %s", len(self.procs), why)
        for handle in self.procs.values():
            handle.kill()
        # Ports reserved and not in use by a proc go back; the rest follow their procs.
        in_use = {urlsplit(address).port for address in self.procs}
        for port in [p for p in self.held if p not in in_use]:
            self.held.pop(port).close()
        self.controller = None

    async def watch_lease(self) -> None:
        """Drop a controller not heard from for its lease, and vouch for busy procs."""
        last = trio.current_time()
        next_vouch = last
        while True:
            await trio.sleep(_LEASE_TICK)
            now = trio.current_time()
            late, last = now - last - _LEASE_TICK, now
            if late > _PAUSE and self.controller is not None:
                # This worker did not run for that long: the renewals sent meanwhile are
                # still unread on the socket. That time does not count against the lease.
                log.warning("this worker was paused for %.1f s; extending the lease", late)
                self.deadline += late
                continue
            if self.controller is not None and now > self.deadline:
                controller = self.controller
                why = (
                    f"the worker at {self.rt.address} dropped this controller: nothing heard "
                    f"from it for its lease of {self.lease:.1f} s, so its procs were killed; "
                    "call attach_to_workers again to use this host"
                )
                self._release(f"the controller's lease ran out ({self.lease:.1f} s)")
                self.lapsed[controller] = why
                while len(self.lapsed) > 16:
                    self.lapsed.popitem(last=False)
                self._tell_lapsed(controller)
            if now >= next_vouch:
                next_vouch = now + self.rt.config.heartbeat_interval
                self._vouch_for_busy_procs()

    def _vouch_for_busy_procs(self) -> None:
        """A proc in a long C call that holds the GIL sends no heartbeats; we can see that it
        computes (its CPU time advances, it is not stopped) and say so to the controller,
        whose watchdog would otherwise kill it as stuck. A stopped or idle-silent proc gets
        no word from us."""
        if self.controller is None:
            return
        for address, handle in list(self.procs.items()):
            if handle.pid and self._busy.busy(handle.pid, trio.current_time(), _BUSY_WINDOW):
                try:
                    self.rt.post(self.controller, M.Heartbeat(address))
                except Exception:
                    return

    def _reserve_ports(self, count: int) -> list[int]:
        """Bind ``count`` free ports and hold them (see ``held``)."""
        if len(self.held) + count > MAX_HELD_PORTS:
            raise OSError(
                f"the worker at {self.rt.address} holds {len(self.held)} reserved ports; "
                f"reserving {count} more would exceed {MAX_HELD_PORTS}"
            )
        ports = []
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in self.host_ip else socket.AF_INET)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((self.host_ip, 0))
            except OSError:
                s.close()
                raise
            port = s.getsockname()[1]
            self.held[port] = s
            ports.append(port)
        return ports


async def _watch_signals(service: WorkerService) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            service._release("the worker was asked to stop")
            service.finished.set()
            return


async def _serve(
    rt: Runtime, service: WorkerService, dial: str, inherited: socket.socket | None
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve)
        if inherited is not None:
            inherited.close()  # our listener is up on its port: the inherited socket goes
        # Controllers know us by the address they dial (an alias's DIAL, not its BIND).
        rt.address = dial
        print(f"regency worker listening on {dial}", flush=True)
        nursery.start_soon(service.watch_lease)
        nursery.start_soon(_watch_signals, service)
        await service.finished.wait()
        rt.stop()
        nursery.cancel_scope.cancel()


def _inherit(fd: int, where: str) -> socket.socket:
    """The TCP socket inherited as descriptor ``fd`` (``tcp://HOST:fdN``)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ValueError(f"{where}: descriptor {fd} is not an open socket ({exc})") from None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()
        raise ValueError(f"{where}: descriptor {fd} is not a TCP socket")
    if sock.getsockname()[1] == 0:
        sock.detach()
        raise ValueError(f"{where}: the socket of descriptor {fd} is not bound to a port")
    return sock


def serve_worker(listen: str, secret: bytes, *, exit_on_shutdown: bool = False) -> None:
    """Run a worker until SIGTERM or SIGINT (or, with ``exit_on_shutdown``, until its
    controller calls ``HostMesh.shutdown()``). ``listen`` is any worker address of
    :mod:`._worker_address` (``tcp://HOST:PORT``, ``ipc:///PATH``, ``DIAL@BIND``,
    ``tcp://HOST:fdN``)."""
    from ._config import configure, current_config
    from ._worker_address import parse_worker_address, with_port

    where = parse_worker_address(listen, "--listen", worker=True)
    inherited: socket.socket | None = None
    bind = where.bind
    if where.fd is not None:
        inherited = _inherit(where.fd, listen)
        ip, port = inherited.getsockname()[:2]
        where = with_port(where, port)
        bind = host_address("tcp", ip, port)
        if inherited.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            # Already listening: our listener can only take the port once it is closed.
            inherited.close()
            inherited = None
        else:
            # Bound, not listening: ours binds beside it (SO_REUSEADDR), then it is closed,
            # so the port is never free for another process to take meanwhile.
            inherited.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    host = where.proc_host
    # Procs here get addresses by IP: a proc announces the address it bound, which must be
    # the one the controller planned (a name that resolves only to 127.0.0.1 works too).
    try:
        host_ip = str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve the host in {listen!r}: {exc}") from None
    scheme = "tcp" if where.is_unix else bind.split("://", 1)[0]
    configure(default_transport=scheme, tcp_host=host_ip)
    jobdir = tempfile.mkdtemp(prefix="regency-worker-")
    os.chmod(jobdir, 0o700)
    rt = Runtime(
        f"w-{socket.gethostname()}-{os.getpid()}",
        secret=secret,
        jobdir=jobdir,
        config=current_config(),
        address=bind,
    )
    set_current_runtime(rt)
    service = WorkerService(rt, host_ip, exit_on_shutdown=exit_on_shutdown)
    try:
        trio.run(_serve, rt, service, where.dial, inherited)
    finally:
        if inherited is not None:
            inherited.close()
        shutil.rmtree(jobdir, ignore_errors=True)
