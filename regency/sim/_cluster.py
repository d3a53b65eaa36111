"""A simulated cluster: the production runtime on simulated hosts, one trio loop, virtual time.

Each simulated proc is an ordinary :class:`~regency.core.Runtime` whose transport is the
simulated network (``sim://HOST/PROC``), whose launcher starts more simulated procs, and whose
sync actor code runs in lockstep with the loop (:mod:`._lockstep`). Nothing in the core knows
it is simulated: the simulator provides the transport, the launcher, the clock and the sync
runner.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import IO, Any

import attrs
import trio
import trio.testing

from .._logs._sim import install_sim_proc
from ..core import _codec, _config, _waiting
from ..core._config import current_config
from ..core._environment import Environment
from ..core._launcher import ProcHandle, ProcLauncher
from ..core._runtime import Runtime, _runtime_var
from . import _targets
from ._buggify import Buggify
from ._clock import SimEvent, current_trace, run_deterministic
from ._environ import forget_environments, give_environment
from ._invariants import InvariantChecker, InvariantViolation
from ._lockstep import Lockstep, LockstepExecutor, lockstep_leader
from ._network import (
    CONTROLLER_HOST,
    ClogFault,
    CrashHostFault,
    CrashProcFault,
    DelayFault,
    DisconnectFault,
    Faults,
    FaultSchedule,
    PartitionFault,
    PauseProcFault,
    ScheduledFault,
    SimNetwork,
    SimTransport,
)
from ._runlog import RunLog, describe, root_faults_logged
from ._ticker import SimTicker

_SECRET = b"simulated-cluster-needs-no-secret"

_current: SimCluster | None = None


def current() -> SimCluster:
    """The simulated cluster this code runs in (for scheduling faults on purpose)."""
    if _current is None:
        raise RuntimeError("regency.sim.current() is only available inside a simulation")
    return _current


class _SimProc(ProcHandle):
    def __init__(self, cluster: SimCluster, rt: Runtime, scope: trio.CancelScope) -> None:
        self.cluster, self.rt, self.scope = cluster, rt, scope
        self.pid = 0
        self.crashed = False

    @property
    def transport(self) -> Any:
        """The proc's transport once it serves (a :class:`SimTransport`), else None."""
        return getattr(self.rt, "transport", None)

    def kill(self) -> None:
        if not self.crashed:
            self.crashed = True
            self.cluster.checker.proc_crashed(self.rt)
        self.scope.cancel()

    def terminate(self) -> None:
        self.kill()


class SimLauncher(ProcLauncher):
    """Starts simulated procs on one simulated host."""

    def __init__(self, cluster: SimCluster, host: str) -> None:
        self.cluster, self.host = cluster, host

    def address_for(self, proc_id: str) -> str:
        return f"sim://{self.host}/{proc_id}"

    def launch(
        self,
        bootstrap: Mapping[str, Any],
        env: Mapping[str, str],
        on_exit: Callable[[int], None],
    ) -> ProcHandle:
        return self.cluster._start_proc(self.host, dict(bootstrap), on_exit, env)


class SimCluster:
    """Simulated hosts running simulated procs over a :class:`SimNetwork`."""

    def __init__(
        self,
        rng: random.Random,
        faults: Faults | FaultSchedule | None = None,
        lockstep: Lockstep | None = None,
        buggify: Buggify | None = None,
        *,
        skip_idle: bool = True,
    ) -> None:
        self.rng = rng
        self.buggify = buggify or Buggify()
        schedule = faults if isinstance(faults, FaultSchedule) else FaultSchedule(
            faults if faults is not None else Faults()
        )
        self.schedule = schedule
        self.network = SimNetwork(
            rng, schedule.rates, connect_timeout=self.buggify.network.get("connect_timeout", 1.0)
        )
        self.lockstep = lockstep or Lockstep()
        self.procs: dict[str, _SimProc] = {}  # by address, in start order
        self._host_names: list[str] = []
        #: The launcher of every simulated host, by HostRef worker ("sim:NAME"); shared by
        #: every runtime of the cluster as its ``host_launchers``.
        self._launchers: dict[str, ProcLauncher] = {}
        #: Running procs by the address of the runtime that started them.
        self._children_of: dict[str, list[_SimProc]] = {}
        self.checker = InvariantChecker(self)
        #: Heartbeats, watchdogs and the checker's scans; skips idle virtual time.
        self.ticker = SimTicker(self, skip=skip_idle)
        self._faults = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread = 0
        self._clock: trio.abc.Clock | None = None
        self.controller: Runtime | None = None
        #: Procs given an environment of their own (``os.environ`` is a per-proc view then).
        self._given_env: list[Runtime] = []

    # -- lifetime ------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Runtime]:
        """Run the cluster and its controller (on host ``controller``) until the block ends."""
        global _current
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._thread = threading.get_ident()
            self._clock = trio.lowlevel.current_clock()
            self.lockstep.attach(nursery)
            self.network.start_delivery(nursery)
            nursery.start_soon(self.ticker.run, name="sim ticker")
            _current = self
            rt = self._runtime(CONTROLLER_HOST, "controller", None, f"sim://{CONTROLLER_HOST}/c")
            await nursery.start(rt.serve)
            self.controller = rt
            _runtime_var.set(rt)
            nursery.start_soon(self._inject_faults, name="sim faults")
            nursery.start_soon(self.checker.watch, name="sim invariant checker")
            try:
                yield rt
            finally:
                # Also when the program raised: what it queued for the loop (a launch, a
                # send) runs while the runtimes still serve, not in trio's shutdown, where
                # it would find their nurseries closed and crash the run.
                with trio.CancelScope(shield=True):
                    await trio.testing.wait_all_tasks_blocked()
                _current = None
                forget_environments(self._given_env)
                nursery.cancel_scope.cancel()

    def _runtime(
        self, host: str, proc_id: str, parent: str | None, address: str
    ) -> Runtime:
        network = self.network

        @asynccontextmanager
        async def transport(rt: Runtime) -> AsyncIterator[Any]:
            async with trio.open_nursery() as nursery:
                yield network.transport(host, nursery, max_frame_bytes=rt.config.max_frame_bytes)
                nursery.cancel_scope.cancel()

        env = Environment(
            transport=transport,
            launcher=lambda nursery: SimLauncher(self, host),
            host_launcher=self._host_launcher,
            executor=lambda rt: LockstepExecutor(self.lockstep, rt),
            waiter=lambda rt: lockstep_leader(self.lockstep, rt),
            ticker=self.ticker,
            clock=self.now,
            probe=self.checker,
            simulated_host=host,
            data_listen_address=f"sim://{host}/",
        )
        return Runtime(
            proc_id,
            secret=_SECRET,
            jobdir="/simulated",
            config=current_config(),
            address=address,
            parent_address=parent,
            seed=self.rng.getrandbits(64),
            env=self.buggify.apply_to_environment(env),
        )

    def _host_launcher(self, worker: str) -> ProcLauncher | None:
        """Any proc may place procs on any simulated host (an actor given the host mesh):
        one launcher per host, shared by every runtime of the cluster."""
        launcher = self._launchers.get(worker)
        if launcher is None and worker.startswith("sim:"):
            name = worker[len("sim:") :]
            if name in self.network._hosts or name in self._host_names:
                launcher = self._launchers[worker] = SimLauncher(self, name)
        return launcher

    def _start_proc(
        self,
        host: str,
        record: dict[str, Any],
        on_exit: Callable[[int], None],
        env: Mapping[str, str] | None = None,
    ) -> ProcHandle:
        assert self._nursery is not None
        if host in self.network._crashed:
            # As a launch through a dead host's worker fails: the spawner sees the proc exit.
            raise OSError(f"cannot start proc {record['proc_id']}: host {host!r} has crashed")
        rt = self._runtime(host, record["proc_id"], record["parent_address"], record["address"])
        install_sim_proc(rt, host, self.now)  # log forwarding, when configured
        spawner = self.procs.get(record["parent_address"])
        if give_environment(rt, env or {}, spawner.rt if spawner is not None else None):
            self._given_env.append(rt)
        scope = trio.CancelScope()
        proc = _SimProc(self, rt, scope)
        self.procs[rt.address] = proc
        parent = record["parent_address"]
        self._children_of.setdefault(parent, []).append(proc)
        boot = record.get("boot")

        async def main() -> None:
            _runtime_var.set(rt)
            code = 0
            with scope:
                if boot:  # run by rt.serve once it listens, before its HELLO, as in production
                    rt.boot = _codec.loads([bytes.fromhex(boot)])
                try:
                    await rt.serve()
                except Exception:
                    if rt.boot_error is None:
                        raise
                    # Reported to its spawner (a HELLO with the error); it exits with 1, as a
                    # real proc whose bootstrap function raised.
                    code = 1
            self.procs.pop(rt.address, None)
            self.checker.proc_exited(rt)
            siblings = self._children_of.get(parent, [])
            if proc in siblings:
                siblings.remove(proc)
            # Procs die with the proc that started them, as real ones do (PR_SET_PDEATHSIG).
            for child in self._children_of.pop(rt.address, []):
                child.kill()
            on_exit(-9 if proc.crashed else code)

        self._nursery.start_soon(main, name=f"proc {rt.proc_id}")
        return proc

    def now(self) -> float:
        """The simulation's virtual time, from the loop or from a program or sync endpoint
        (they run in lockstep with the loop, which is not running meanwhile)."""
        if self._clock is None:
            raise RuntimeError("the simulated cluster is not running")
        return self._clock.current_time()

    # -- hosts and faults --------------------------------------------------------------

    def hosts(self, count: int) -> Any:
        """A ``HostMesh`` of ``count`` fresh simulated hosts (dim ``hosts``)."""
        from ..core._hosts import HostRef
        from ..core._proc_mesh import HostMesh
        from ..core._shape import Shape

        assert self.controller is not None
        names = [f"host{i}" for i in range(count)]
        self._host_names.extend(n for n in names if n not in self._host_names)
        refs = tuple(HostRef(f"sim:{name}", name, name) for name in names)
        return HostMesh(Shape.full(["hosts"], [count]), refs)

    def _on_loop(self, fn: Callable[[], object]) -> None:
        """Faults change the simulation's state, which only its loop may touch: from a
        lockstep thread (a program, a sync endpoint) they take effect when the loop runs
        next, which is before anything else happens in virtual time."""
        if self._thread == threading.get_ident():
            fn()
        else:
            assert self._token is not None
            self._token.run_sync_soon(fn)

    # Every fault call resolves what it is aimed at first (regency/sim/_targets.py) and
    # raises TypeError or LookupError when it cannot: a fault that does nothing is a lie.

    def _hosts_of(self, target: object, what: str, *, group: bool = False) -> list[str]:
        known = list(dict.fromkeys([CONTROLLER_HOST, *self._host_names, *self.network.hosts]))
        resolve = _targets.resolve_host_group if group else _targets.resolve_hosts
        return resolve(
            target, known=known, ranked=self._host_names, controller=CONTROLLER_HOST, what=what
        )

    def _procs_of(self, target: object, what: str) -> list[str]:
        # Procs a runtime has planned count too: spawn_procs returns before they start, and
        # the fault, applied on the loop after the launch, finds them running.
        live = list(self.procs)
        for rt in [self.controller, *(proc.rt for proc in self.procs.values())]:
            if rt is not None:
                live += [a for a, c in rt.children.items() if c.returncode is None]
                live += [a for a in rt.child_ready if a not in rt.children]  # not launched yet
        return _targets.resolve_procs(target, running=live, what=what)

    def crash_proc(self, proc: object) -> None:
        """Kill simulated procs (their connections break, like SIGKILL): ``proc`` is an
        address, a ``ProcMesh`` slice or an ``ActorMesh`` (its procs)."""
        addresses = self._procs_of(proc, "crash_proc(proc)")

        def crash() -> None:
            for address in addresses:
                self._crash(address)

        self._on_loop(crash)

    def crash_host(self, host: object) -> None:
        """Crash hosts: every proc on them dies and their links break. ``host`` is a host
        name, a rank in the simulation's host mesh, a ``HostMesh``/``ProcMesh`` slice, an
        ``ActorMesh`` (the hosts of its procs) or a proc address."""
        names = self._hosts_of(host, "crash_host(host)")
        _refuse_controller(names, "crash_host(host)")

        def crash() -> None:
            for name in names:
                for address, proc in list(self.procs.items()):
                    if address.startswith(f"sim://{name}/"):
                        proc.kill()
                self.network.crash_host(name)

        self._on_loop(crash)

    def restart_host(self, host: object) -> None:
        """Let crashed hosts take new procs again (targets as for :meth:`crash_host`)."""
        names = self._hosts_of(host, "restart_host(host)")

        def restart() -> None:
            for name in names:
                self.network.restart_host(name)

        self._on_loop(restart)

    def pause_proc(self, proc: object, duration: float) -> None:
        """Pause simulated procs for ``duration`` virtual seconds, as SIGSTOP would (see
        :meth:`SimNetwork.pause`); longer than the heartbeat timeout, its parent kills it.
        ``proc`` is as for :meth:`crash_proc`."""
        _targets.check_duration(duration, "pause_proc(duration)")
        addresses = self._procs_of(proc, "pause_proc(proc)")

        def pause() -> None:
            for address in addresses:
                self._pause(address, duration)

        self._on_loop(pause)

    def _pause(self, address: str, duration: float) -> None:
        proc = self.procs.get(address)
        if proc is None:
            self.network._record("pause", f"{address} had exited already")
            return
        transport = proc.transport
        if isinstance(transport, SimTransport):
            self.network.pause(transport, duration, label=address)
            return
        # Launched, not serving yet (a pause right after spawn_procs): pause it as soon as
        # its transport exists, until the same moment the pause would have ended.
        until = trio.current_time() + duration
        assert self._nursery is not None

        async def when_serving() -> None:
            while proc.transport is None and address in self.procs:
                await trio.lowlevel.checkpoint()
            if isinstance(proc.transport, SimTransport):
                left = until - trio.current_time()
                self.network.pause(proc.transport, left, label=address)

        self._nursery.start_soon(when_serving)

    def _crash(self, address: str) -> None:
        proc = self.procs.get(address)
        if proc is not None:
            self.network._record("crash_proc", address)
            proc.kill()
        else:
            self.network._record("crash_proc", f"{address} had exited already")

    async def wind_down(self) -> None:
        """After the program: stop injecting faults, heal the network, then let the
        invariant checker see failure reports arrive, stop every proc, and check the end."""
        # What the program's last calls queued for the loop (a launch, a send) runs first:
        # the program's end must not overtake the work it started.
        await trio.testing.wait_all_tasks_blocked()
        self._faults.cancel()
        self.network.heal()
        await self.checker.finish()

    # -- scheduled and random faults -----------------------------------------------------
    #
    # Every fault of a schedule and every random one is applied by the very call a program
    # makes (crash_host, partition, ...): one code path, so a scheduled fault does exactly
    # what its direct call does (tests/sim/test_fault_paths.py holds each pair to it).

    async def _inject_faults(self) -> None:
        with self._faults:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(
                        self.network.run_faults, self.schedule.faults, apply=self.apply_fault
                    ),
                    name="sim faults",
                )
                if self.schedule.rates.proc_rate > 0:
                    nursery.start_soon(self._run_random_proc_faults, name="sim proc faults")

    def apply_fault(self, fault: ScheduledFault) -> None:
        """Apply one fault of a schedule (or a drawn one) now, through the call a program
        would make: :meth:`partition`, :meth:`disconnect`, :meth:`clog`, :meth:`delay`,
        :meth:`crash_host`, :meth:`crash_proc`, :meth:`pause_proc`. Its ``at`` is ignored.

        A partition with an empty side is the schedule's zero value (what Hypothesis shrinks
        toward) and does nothing. A process fault takes the proc at position ``proc``
        (modulo how many run) among the procs running now, in start order."""
        if isinstance(fault, PartitionFault):
            if fault.a_hosts and fault.b_hosts:
                self.partition(
                    list(fault.a_hosts),
                    list(fault.b_hosts),
                    duration=fault.duration,
                    one_way=fault.one_way,
                )
        elif isinstance(fault, DisconnectFault):
            self.disconnect(fault.host_a, fault.host_b, refuse_for=fault.refuse_for)
        elif isinstance(fault, ClogFault):
            self.clog(fault.host, fault.duration)
        elif isinstance(fault, DelayFault):
            self.delay(fault.host_a, fault.host_b, fault.extra, fault.duration)
        elif isinstance(fault, CrashHostFault):
            self.crash_host(fault.host)
        elif isinstance(fault, CrashProcFault | PauseProcFault):
            running = list(self.procs)
            if not running:
                self.network._record("proc_fault", f"{type(fault).__name__}: no procs run")
                return
            address = running[fault.proc % len(running)]
            if isinstance(fault, CrashProcFault):
                self.crash_proc(address)
            else:
                self.pause_proc(address, fault.duration)
        else:
            raise TypeError(f"not a fault: {fault!r}")

    async def _run_random_proc_faults(self) -> None:
        rates = self.schedule.rates
        total = rates.proc_rate
        net = self.network
        while True:
            await trio.sleep(net._draw("proc_fault.wait", self.rng.expovariate(total)))
            running = list(self.procs)
            if not running:
                continue
            address = net._draw("proc_fault.proc", running[self.rng.randrange(len(running))])
            if net._draw("proc_fault.kind", self.rng.random() * total) < rates.crash:
                self.crash_proc(address)
            else:
                self.pause_proc(address, net._random_duration())

    def partition(
        self,
        a: object,
        b: object,
        duration: float | None = None,
        one_way: bool = False,
    ) -> None:
        """Cut hosts ``a`` from hosts ``b`` (for ``duration`` virtual seconds, if given;
        zero is no fault). Each side is a host target (as for :meth:`crash_host`) or a list
        of them."""
        a_hosts = self._hosts_of(a, "partition(a)", group=True)
        b_hosts = self._hosts_of(b, "partition(b)", group=True)
        _targets.check_duration(duration, "partition(duration)", allow_none=True)
        if set(a_hosts) & set(b_hosts):
            raise ValueError(
                f"partition sides must not share hosts (both have "
                f"{sorted(set(a_hosts) & set(b_hosts))!r})"
            )

        def cut() -> None:
            number = self.network.partition(
                a_hosts, b_hosts, one_way=one_way,
                duration=math.inf if duration is None else duration,
            )
            if number and duration is not None and math.isfinite(duration):
                assert self._nursery is not None

                async def heal_later() -> None:
                    await trio.sleep(duration)
                    self.network.heal(number)

                self._nursery.start_soon(heal_later)

        self._on_loop(cut)

    def heal(self) -> None:
        """End every partition and delay (clogs and pauses end by themselves)."""
        self._on_loop(self.network.heal)

    def _pairs(self, a: object, b: object, what: str) -> list[tuple[str, str]]:
        a_hosts = self._hosts_of(a, f"{what}(host_a)", group=True)
        b_hosts = self._hosts_of(b, f"{what}(host_b)", group=True)
        # One host on both sides means the links between processes on that host.
        return list(dict.fromkeys((min(x, y), max(x, y)) for x in a_hosts for y in b_hosts))

    def disconnect(self, host_a: object, host_b: object, *, refuse_for: float = 0.0) -> None:
        """Break every connection between two hosts (both ends told; they may reconnect).
        Either side may name several hosts (every pair across is broken). With
        ``refuse_for``, dials between them are refused for that many virtual seconds (a
        relay in between restarting): a sender keeps dialing for ``reconnect_refused_s``."""
        pairs = self._pairs(host_a, host_b, "disconnect")
        _targets.check_duration(refuse_for, "disconnect(refuse_for)")

        def disconnect() -> None:
            for x, y in pairs:
                self.network.disconnect(x, y, refuse_for)

        self._on_loop(disconnect)

    def clog(self, host: object, duration: float) -> None:
        """Hold every frame from and to ``host`` for ``duration``, then deliver in order."""
        names = self._hosts_of(host, "clog(host)", group=True)
        _targets.check_duration(duration, "clog(duration)")

        def clog() -> None:
            for name in names:
                self.network.clog(name, duration)

        self._on_loop(clog)

    def delay(self, host_a: object, host_b: object, extra: float, duration: float) -> None:
        """Add ``extra`` seconds of one-way latency between two hosts for ``duration``."""
        pairs = self._pairs(host_a, host_b, "delay")
        _targets.check_duration(extra, "delay(extra)")
        _targets.check_duration(duration, "delay(duration)")

        def delay() -> None:
            for x, y in pairs:
                self.network.delay(x, y, extra, duration)

        self._on_loop(delay)


def _refuse_controller(names: list[str], what: str) -> None:
    if CONTROLLER_HOST in names:
        raise ValueError(
            f"{what}: the controller's host {CONTROLLER_HOST!r} cannot crash (the program runs "
            "there); crash the procs on it with crash_proc"
        )


def _as_schedule(faults: Faults | FaultSchedule | None) -> FaultSchedule:
    if faults is None:
        return FaultSchedule()
    if isinstance(faults, FaultSchedule):
        return faults
    if isinstance(faults, Faults):
        return FaultSchedule(faults)
    raise TypeError(
        f"faults must be a regency.sim.Faults (random rates), a FaultSchedule or None "
        f"(got {type(faults).__name__})"
    )


def check_schedule(faults: Faults | FaultSchedule | None, hosts: int) -> FaultSchedule:
    """Refuse a schedule that a run of ``simulate(..., hosts=hosts)`` cannot apply, before
    it starts, with the errors the direct calls raise: a host that will not exist
    (``LookupError``, listing the hosts: ``controller``, ``host0`` .. ``host{hosts-1}``), the
    controller's host to crash or a partition whose sides share a host (``ValueError``),
    something that is no fault (``TypeError``). Returns the schedule."""
    schedule = _as_schedule(faults)
    ranked = [f"host{i}" for i in range(hosts)]
    known = [CONTROLLER_HOST, *ranked]

    def names(target: object, fault: object, call: str, *, group: bool = False) -> list[str]:
        resolve = _targets.resolve_host_group if group else _targets.resolve_hosts
        return resolve(
            target, known=known, ranked=ranked, controller=CONTROLLER_HOST,
            what=f"{fault!r}: {call}",
        )

    if not isinstance(schedule.faults, tuple | list):
        raise TypeError(f"FaultSchedule.faults must be a tuple of faults (got {schedule.faults!r})")
    for fault in schedule.faults:
        if isinstance(fault, PartitionFault):
            if fault.a_hosts and fault.b_hosts:  # else the zero value: no fault
                a = names(list(fault.a_hosts), fault, "partition(a)", group=True)
                b = names(list(fault.b_hosts), fault, "partition(b)", group=True)
                if set(a) & set(b):
                    raise ValueError(
                        f"{fault!r}: partition sides must not share hosts (both have "
                        f"{sorted(set(a) & set(b))!r})"
                    )
        elif isinstance(fault, DisconnectFault | DelayFault):
            call = "disconnect" if isinstance(fault, DisconnectFault) else "delay"
            names(fault.host_a, fault, f"{call}(host_a)", group=True)
            names(fault.host_b, fault, f"{call}(host_b)", group=True)
        elif isinstance(fault, ClogFault):
            names(fault.host, fault, "clog(host)", group=True)
        elif isinstance(fault, CrashHostFault):
            what = "crash_host(host)"
            _refuse_controller(names(fault.host, fault, what), f"{fault!r}: {what}")
        elif not isinstance(fault, CrashProcFault | PauseProcFault):
            raise TypeError(
                f"FaultSchedule.faults holds {fault!r}, which is no fault (PartitionFault, "
                "DisconnectFault, ClogFault, DelayFault, CrashHostFault, CrashProcFault, "
                "PauseProcFault)"
            )
    return schedule


#: simulate()'s defaults, left out of a replay line.
_DEFAULT_TIMEOUT = 24 * 3600.0


def replay_line(seed: int, hosts: int, arguments: Mapping[str, Any]) -> str:
    """The call that reruns a run: every argument that shaped it (a schedule by its repr,
    which reads back with the names of ``regency.sim``)."""
    line = f"regency.sim.simulate(program, seed={seed!r}, hosts={hosts!r}"
    if arguments.get("faults") is not None:
        line += f", faults={arguments['faults']!r}"
    if arguments.get("buggify", False) is not False:
        line += f", buggify={arguments['buggify']!r}"
    if arguments.get("timeout", _DEFAULT_TIMEOUT) != _DEFAULT_TIMEOUT:
        line += f", timeout={arguments['timeout']!r}"
    if not arguments.get("skip_idle", True):
        line += ", skip_idle=False"
    return line + ")"


class ReplayDiverged(AssertionError):
    """:meth:`SimResult.replay` ran the same program with the same arguments and got another
    run: the program depends on something the simulation does not control."""


@attrs.frozen
class SimResult:
    """What :func:`simulate` returns."""

    value: Any
    #: Virtual seconds the program took.
    virtual_time: float
    #: A hash of the schedule and every random draw: equal for equal runs.
    trace_hash: str
    events: list[SimEvent]
    seed: int
    #: The runtime's own log records of the run (loggers under ``regency``), one entry per
    #: record (a traceback's lines included), each starting with its virtual time.
    log: tuple[str, ...] = attrs.field(default=(), kw_only=True, repr=False)
    #: The program that ran, and every other argument of :func:`simulate` that shaped the run
    #: (``hosts``, ``faults``, ``buggify``, ``timeout``, ``skip_idle``).
    program: Callable[[Any], Any] | None = attrs.field(default=None, kw_only=True, repr=False)
    arguments: Mapping[str, Any] = attrs.field(factory=dict, kw_only=True, repr=False)

    @property
    def replay_line(self) -> str:
        """``regency.sim.simulate(program, seed=..., hosts=..., faults=..., ...)``: the call
        that reruns this run exactly (with ``from regency.sim import *`` the schedule's
        repr reads back)."""
        arguments = dict(self.arguments)
        return replay_line(self.seed, arguments.pop("hosts", 4), arguments)

    def replay(self, *, log: bool | IO[str] = False) -> SimResult:
        """Run the same program with the same seed and arguments again, check that it is the
        same run (the trace hash), and return the new result. Raises
        :class:`ReplayDiverged` (an ``AssertionError``) naming the first event where the runs
        part when it is not."""
        if self.program is None:
            raise ValueError("this SimResult does not know its program (made by hand?)")
        again = simulate(self.program, seed=self.seed, log=log, **self.arguments)
        if again.trace_hash != self.trace_hash:
            index = next(
                (i for i, (a, b) in enumerate(zip(self.events, again.events, strict=False))
                 if a != b),
                min(len(self.events), len(again.events)),
            )

            def at(events: list[SimEvent]) -> str:
                return repr(str(events[index])) if index < len(events) else "nothing (the end)"

            parted = (
                f"they part at event {index}: {at(self.events)} then, {at(again.events)} now"
                if index < max(len(self.events), len(again.events))
                else "the event logs agree; the schedule or the random draws differ"
            )
            raise ReplayDiverged(
                f"the replay of {self.replay_line} is not the same run: trace hash "
                f"{self.trace_hash} then, {again.trace_hash} now; {parted}. The program "
                "depends on something the simulation does not control (the global random "
                "module, time.time(), os.urandom, a set's order, state it keeps between "
                "runs), or its code changed"
            )
        return again

    def write_chrome_trace(self, path: str) -> None:
        """Save the event log for Perfetto / chrome://tracing."""
        from ._export import write_chrome_trace

        write_chrome_trace(self.events, path)


def check_simulation(
    program: Callable[[Any], Any],
    *,
    seed: int = 0,
    hosts: int = 4,
    runs: int = 2,
    faults: Faults | FaultSchedule | None = None,
    buggify: bool | None = False,
) -> SimResult:
    """Run ``program`` ``runs`` times on the same seed; raise ``AssertionError`` naming the
    first event where a run diverged from the first (a determinism self-check)."""

    def once() -> SimResult:
        return simulate(program, seed=seed, hosts=hosts, faults=faults, buggify=buggify)

    first = once()
    for run in range(2, runs + 1):
        other = once()
        for index, (a, b) in enumerate(zip(first.events, other.events, strict=False)):
            if a != b:
                raise AssertionError(
                    f"seed {seed} is not deterministic: run {run} diverged from run 1 at "
                    f"event {index}: {a} vs {b}"
                )
        if len(first.events) != len(other.events) or first.trace_hash != other.trace_hash:
            raise AssertionError(
                f"seed {seed} is not deterministic: run {run} had {len(other.events)} events "
                f"and hash {other.trace_hash[:12]}, run 1 {len(first.events)} and "
                f"{first.trace_hash[:12]}"
            )
    return first


def simulate(
    program: Callable[[Any], Any],
    *,
    seed: int = 0,
    hosts: int = 4,
    faults: Faults | FaultSchedule | None = None,
    timeout: float | None = _DEFAULT_TIMEOUT,
    buggify: bool | None = False,
    skip_idle: bool = True,
    log: bool | IO[str] = False,
) -> SimResult:
    """Run ``program(host_mesh)`` on a simulated cluster of ``hosts`` hosts.

    ``program`` may be sync (blocking ``.get()`` style) or async. The same program and seed
    give the same result, virtual time, trace hash and event log. ``faults`` injects random
    and scheduled faults (a schedule naming a host the run will not have, ``"controller"``
    and ``"host0"`` .. ``"host{hosts-1}"``, is refused before the run starts); ``buggify``
    switches on adversarial settings (shrunken timeouts, other acknowledgement cadences;
    :mod:`regency.sim._buggify`): ``True``, ``False``, or ``None`` to let the seed decide.
    Every run is checked against the runtime's invariants (:mod:`regency.sim._invariants`);
    a violation raises :class:`InvariantViolation` with the seed and how to replay the run.
    ``skip_idle=False`` runs every heartbeat tick instead of skipping idle stretches of
    virtual time (:mod:`regency.sim._ticker`; for checking that the skipping changes nothing
    that matters).

    The runtime's own log records (loggers under ``regency``: reconnects, replies for
    crashed procs, procs killed as stuck) go to the run's log, ``SimResult.log``, stamped
    with virtual time, and not to stderr; a failed run's exception shows the last of them
    (all in its ``sim_log`` attribute). ``log=True`` also prints each as it is written (to
    ``sys.stderr``; or pass a text stream). ``SimResult.replay()`` reruns the run.
    """

    if buggify not in (True, False, None):
        raise TypeError(
            f"buggify must be True, False or None (the seed decides); got {buggify!r}"
        )
    if isinstance(hosts, bool) or not isinstance(hosts, int):
        raise TypeError(f"hosts must be a number of simulated hosts (got {hosts!r})")
    if hosts < 0:
        raise ValueError(f"hosts must be a number of simulated hosts >= 0 (got {hosts})")
    check_schedule(faults, hosts)
    arguments: dict[str, Any] = {
        "hosts": hosts, "faults": faults, "buggify": buggify, "timeout": timeout,
        "skip_idle": skip_idle,
    }
    replay = replay_line(seed, hosts, arguments)
    echo = sys.stderr if log is True else (log or None)
    run_log = RunLog(echo=echo)
    checkers: list[InvariantChecker] = []
    locksteps: list[Lockstep] = []
    switched: list[Buggify] = []

    async def main(rng: random.Random) -> tuple[Any, float]:
        bug = Buggify.draw(rng, buggify, current_trace())
        switched.append(bug)
        with _config.overridden(**bug.config):
            return await run(rng, bug)

    async def run(rng: random.Random, bug: Buggify) -> tuple[Any, float]:
        cluster = SimCluster(rng, faults, buggify=bug, skip_idle=skip_idle)
        checkers.append(cluster.checker)
        locksteps.append(cluster.lockstep)
        run_log.lockstep, run_log.now = cluster.lockstep, cluster.now
        async with cluster.running() as controller:
            mesh = cluster.hosts(hosts)
            start = trio.current_time()
            if inspect.iscoroutinefunction(program):
                value = await program(mesh)
            else:

                def run_program() -> Any:
                    _runtime_var.set(controller)
                    with _waiting.bound(controller.waiter):  # as a program's thread waits
                        return program(mesh)

                value = await cluster.lockstep.run(run_program)
            elapsed = trio.current_time() - start
            await cluster.wind_down()
            return value, elapsed

    def with_log(exc: BaseException) -> None:
        if run_log.entries:
            exc.add_note(describe(run_log.entries))
        try:
            exc.sim_log = tuple(run_log.entries)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass

    with run_log.capturing(), root_faults_logged(run_log):
        try:
            try:
                (value, elapsed), digest, events = run_deterministic(main, seed, timeout=timeout)
            finally:
                for lockstep in locksteps:
                    lockstep.close()  # threads of procs that never stopped unwind now
        except BaseException as raised:
            # The program's own error comes back as itself, not inside the cluster's
            # nursery's exception group.
            exc = _sole_exception(raised)
            if checkers and checkers[0].violations:
                exc.add_note("invariant violations seen before it:\n  " + "\n  ".join(
                    checkers[0].violations[:10]
                ))
            if switched and switched[0].on:
                exc.add_note(switched[0].describe())
            with_log(exc)
            exc.add_note(f"replay: {replay}")
            if exc is raised:
                raise
            raise exc from None
    if switched[0].on:
        replay += f"  # {switched[0].describe()}"
    try:
        checkers[0].raise_if_violated(replay)
    except InvariantViolation as violation:
        with_log(violation)
        raise
    return SimResult(
        value, elapsed, digest, events, seed,
        log=tuple(run_log.entries), program=program, arguments=arguments,
    )


def _sole_exception(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups, else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def start_simulated_controller(seed: int) -> Runtime:
    """``REGENCY_RUNTIME=sim``: run this unchanged program on a simulated cluster.

    The simulation's loop runs on a background thread; the calling (main) thread becomes a
    lockstep thread, so the program's blocking calls interleave with the simulation
    deterministically. Returns the controller's runtime once the program may go on.
    """
    import sys
    import threading

    from ..core import _notebook, _oversight

    lockstep = Lockstep()
    started: dict[str, Runtime] = {}
    failed: list[BaseException] = []
    wait_first_turn = lockstep.adopt_current_thread()
    command = " ".join(sys.argv) or "python your_program.py"
    _oversight.report_suffix = (
        f"\nreplay this simulation: REGENCY_RUNTIME=sim REGENCY_SEED={seed} {command}"
    )
    if _notebook.kernel_shell() is not None:  # the kernel's argv would not replay anything
        _oversight.report_suffix = (
            "\nreplay this simulation: run the same cells in a fresh kernel after "
            f"regency.configure(runtime='sim', seed={seed})"
        )

    async def main(rng: random.Random) -> None:
        cluster = SimCluster(rng, lockstep=lockstep)
        _report_violations_at_exit(cluster.checker, _oversight.report_suffix)
        async with cluster.running() as rt:
            started["rt"] = rt
            lockstep.start_main()
            await trio.sleep_forever()

    def run() -> None:
        try:
            run_deterministic(main, seed, timeout=None)
        except BaseException as exc:
            failed.append(exc)
            main_worker = lockstep._main_worker
            assert main_worker is not None  # (adopted above, before this thread started)
            main_worker.turn.release()

    threading.Thread(target=run, name="regency-simulation", daemon=True).start()
    wait_first_turn()
    if failed:
        raise RuntimeError(f"the simulation failed to start: {failed[0]!r}") from failed[0]
    _waiting.bind(started["rt"].waiter)  # the program's thread waits as the controller's
    return started["rt"]


def _report_violations_at_exit(checker: InvariantChecker, replay: str) -> None:
    """``REGENCY_RUNTIME=sim``: the checks made while the program ran are reported when it
    exits; a violation makes the exit status 70 (EX_SOFTWARE) whatever the program did."""
    import atexit
    import os
    import sys

    def report() -> None:
        if checker.violations:
            print(
                f"regency.sim: {len(checker.violations)} invariant violation(s):\n  "
                + "\n  ".join(checker.violations[:20])
                + replay,
                file=sys.stderr,
                flush=True,
            )
            os._exit(70)

    atexit.register(report)
