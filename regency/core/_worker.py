"""The worker daemon: ``regency worker --listen tcp://ADDR:PORT`` on each host of a job.

A worker is a runtime that launches procs on its host for one controller at a time. The
controller attaches (ATTACH), asks for ports (RESERVE), launches procs (LAUNCH), kills them
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
import signal
import socket
import sys
import tempfile
from urllib.parse import urlsplit

import trio

from . import _messages as M
from ._current import set_current_runtime
from ._errors import RemoteFailure
from ._launcher import ProcHandle
from ._runtime import Runtime

log = logging.getLogger("regency.worker")

#: Ports handed out per RESERVE (and at ATTACH) when the controller asks for none in particular.
PORT_BATCH = 32


class WorkerService:
    """The worker's side of the multi-host protocol, installed on a runtime."""

    def __init__(self, rt: Runtime, host_ip: str) -> None:
        self.rt = rt
        self.host_ip = host_ip
        self.controller: str | None = None
        self.lease = 0.0
        self.deadline = 0.0
        self.procs: dict[str, ProcHandle] = {}
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
        self.controller = controller
        self.lease = float(lease)
        self.deadline = now + self.lease
        log.info("attached to the controller at %s (lease %.1f s)", controller, self.lease)
        info = (socket.gethostname(), self.host_ip, self._free_ports(PORT_BATCH))
        self.rt.send_port(port, 0, M.OK, info)

    def _reserve(self, msg: M.Reserve) -> None:
        if msg.controller == self.controller:
            self.rt.send_port(msg.port, 0, M.OK, self._free_ports(int(msg.count)))

    def _launch(self, msg: M.Launch) -> None:
        if msg.controller != self.controller:
            log.warning("ignored a launch from %s, which is not our controller", msg.controller)
            return
        if type(msg.payload) is M.Undecodable:
            raise msg.payload.error
        assert self.rt.launcher is not None
        for record, env in msg.payload:
            # The proc runs on this host: our interpreter's path, our job dir, us as parent.
            record["sys_path"] = list(sys.path)
            record["jobdir"] = self.rt.jobdir
            record["parent_pid"] = os.getpid()
            record["config"] = {
                **record["config"],
                "REGENCY_DEFAULT_TRANSPORT": "tcp",
                "REGENCY_TCP_HOST": self.host_ip,
            }
            address = record["address"]
            self.procs[address] = self.rt.launcher.launch(
                record, env, functools.partial(self._exited, address)
            )

    def _exited(self, address: str, code: int) -> None:
        self.procs.pop(address, None)
        if self.controller is not None:
            try:
                self.rt.post(self.controller, M.Exited(address, code))
            except Exception as exc:
                log.warning("could not report the exit of %s: %s", address, exc)

    def _kill(self, msg: M.Kill) -> None:
        handle = self.procs.get(msg.address)
        if msg.controller == self.controller and handle is not None:
            handle.kill()

    def _renew(self, msg: M.Lease) -> None:
        if msg.controller == self.controller:
            self.deadline = trio.current_time() + self.lease

    def _detach(self, msg: M.Detach) -> None:
        if msg.controller == self.controller:
            self._release("the controller detached")

    # -- lifetime ------------------------------------------------------------------------

    def _release(self, why: str) -> None:
        """Kill every proc launched for the current controller and forget it."""
        if self.procs:
            log.warning("killing %d proc(s): %s", len(self.procs), why)
        for handle in self.procs.values():
            handle.kill()
        self.controller = None

    async def watch_lease(self) -> None:
        while True:
            await trio.sleep(0.1)
            if self.controller is not None and trio.current_time() > self.deadline:
                self._release(f"the controller's lease ran out ({self.lease:.1f} s)")

    def _free_ports(self, count: int) -> list[int]:
        held = []
        try:
            for _ in range(count):
                s = socket.socket(socket.AF_INET6 if ":" in self.host_ip else socket.AF_INET)
                s.bind((self.host_ip, 0))
                held.append(s)
            return [s.getsockname()[1] for s in held]
        finally:
            for s in held:
                s.close()


async def _serve(rt: Runtime, service: WorkerService) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve)
        print(f"regency worker listening on {rt.address}", flush=True)
        nursery.start_soon(service.watch_lease)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                service._release("the worker was asked to stop")
                rt.stop()
                break
        nursery.cancel_scope.cancel()


def serve_worker(listen: str, secret: bytes) -> None:
    """Run a worker until SIGTERM or SIGINT."""
    from ._config import configure, current_config

    parts = urlsplit(listen)
    if parts.scheme != "tcp" or parts.hostname is None or parts.port is None:
        raise ValueError(f"--listen must look like tcp://HOST:PORT (got {listen!r})")
    host_ip = parts.hostname
    configure(default_transport="tcp", tcp_host=host_ip)
    jobdir = tempfile.mkdtemp(prefix="regency-worker-")
    os.chmod(jobdir, 0o700)
    rt = Runtime(
        f"w-{socket.gethostname()}-{os.getpid()}",
        secret=secret,
        jobdir=jobdir,
        config=current_config(),
        address=listen,
    )
    set_current_runtime(rt)
    service = WorkerService(rt, host_ip)
    trio.run(_serve, rt, service)
