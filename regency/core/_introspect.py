"""Seeing inside a running job: stacks gathered from every proc, stall reports, and the
explanation a timed-out call carries.

Procs answer for themselves over the job's authenticated links, on two reserved reply ports
(no actor, no frame kind, as the log sink): :data:`STACKS_PORT` in every runtime takes a
:class:`StacksRequest` and answers with its :class:`~._stacks.ProcStacks` (and, asked to, its
own children's, gathered the same way: procs spawned by actors are included), and
:data:`STALL_PORT` in the controller takes :class:`~._stacks.Stall` reports and logs them
(logger ``regency.stall``). A proc that does not answer in time is listed with what its
spawner knows of it: exited (and how), paused (stopped by a signal), or not answering (its
event loop is blocked: busy computing, or waiting in a blocking call). The metrics port
(core/_metrics.py) gathers the same way, through :func:`ask`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from . import _messages as M
from ._future import Future
from ._liveness import cpu_sample
from ._ports import PortBase
from ._stacks import JobStacks, ProcStacks, Stall, capture, check_stalls, innermost_user

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")
stall_log = logging.getLogger("regency.stall")

#: Every runtime's stacks service.
STACKS_PORT = (1 << 63) | 3
#: The controller's stall sink.
STALL_PORT = (1 << 63) | 4

#: Of a request's timeout, the part a proc gives its own children to answer (the rest is
#: for its answer to travel back).
_NESTED = 0.75


@attrs.frozen
class StacksRequest:
    """Answer with your stacks to ``reply`` (index: the request's); with ``children``, gather
    your children's too within ``timeout`` seconds."""

    reply: tuple[str, int]
    timeout: float
    children: bool


class StacksService(PortBase):
    """The handler of :data:`STACKS_PORT` (on the loop): answers a request with this proc's
    stacks, after gathering its children's when asked."""

    dests: frozenset[str] = frozenset()

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if not isinstance(value, StacksRequest):
            raise TypeError(f"the stacks port takes a StacksRequest (got {type(value).__name__})")
        self.rt.start_soon(self._answer, index, value)
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass

    async def _answer(self, index: int, request: StacksRequest) -> None:
        rt = self.rt
        answer = [capture(rt)]
        if request.children and rt.children:
            targets = [(c.address, c.coords) for c in rt.children.values()]
            answer += await gather(rt, targets, request.timeout * _NESTED, children=True)
        try:
            rt.send_port(request.reply, index, M.OK, answer)
        except Exception as exc:
            log.info("could not answer a stacks request from %s: %s", request.reply[0], exc)


class _Collect(PortBase):
    """The reply port of one gather: each target's answer, or why it has none."""

    keep_port_on_loss = True

    def __init__(self, addresses: Sequence[str]) -> None:
        self.dests = frozenset(addresses)
        self.answers: dict[int, list[Any]] = {}
        self.lost: dict[str, str] = {}
        self.missing = len(addresses)
        self.done = trio.Event()
        self._index = {a: i for i, a in enumerate(addresses)}

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if index in self.answers or status != M.OK or not isinstance(value, list):
            return False
        self.answers[index] = value
        self._count()
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        if address is not None and address not in self.lost:
            self.lost[address] = str(exc)
            if self._index.get(address) not in self.answers:
                self._count()

    def _count(self) -> None:
        self.missing -= 1
        if self.missing <= 0:
            self.done.set()


async def ask(
    rt: Runtime,
    service: int,
    addresses: Sequence[str],
    request: Callable[[tuple[str, int]], Any],
    timeout: float,
) -> tuple[_Collect, dict[str, int | None]]:
    """Send ``request(reply_port)`` to the reserved port ``service`` of each proc at
    ``addresses`` and wait at most ``timeout`` seconds for their answers (lists), on the
    loop. The answers, by the address's index, and why some are missing; and each proc's
    CPU time before (for :func:`_silent`)."""
    collect = _Collect(addresses)
    if not addresses:
        return collect, {}
    port = rt.open_port(collect)
    before = {a: _cpu(rt, a) for a in addresses}
    try:
        message = request(port)
        for index, address in enumerate(addresses):
            try:
                rt.send_port((address, service), index, M.OK, message)
            except Exception as exc:
                collect.fail(exc, address)
        with trio.move_on_after(timeout):
            await collect.done.wait()
    finally:
        rt.close_port(port[1])
    return collect, before


async def gather(
    rt: Runtime,
    targets: Sequence[tuple[str, tuple[tuple[str, int], ...]]],
    timeout: float,
    *,
    children: bool,
) -> list[ProcStacks]:
    """Ask each target proc (address, its coordinates) for its stacks, on the loop; at most
    ``timeout`` seconds. One record per target, in order (then what each gathered from its
    own children): the unanswered ones say why."""
    if not targets:
        return []
    addresses = [address for address, _ in targets]
    collect, before = await ask(
        rt,
        STACKS_PORT,
        addresses,
        lambda port: StacksRequest(port, timeout * _NESTED, children),
        timeout,
    )
    out: list[ProcStacks] = []
    nested: list[ProcStacks] = []
    for index, (address, coords) in enumerate(targets):
        answer = collect.answers.get(index)
        if answer:
            out.append(answer[0].located(coords))
            nested += answer[1:]
        else:
            why = _silent(rt, address, timeout, collect.lost.get(address), before[address])
            child = rt.children.get(address)
            proc_id = child.proc_id if child is not None else "?"
            pid = _pid(rt, address)
            out.append(ProcStacks(proc_id, address, _host_of(address), pid, coords, False, why))
    return out + nested


def _pid(rt: Runtime, address: str) -> int:
    child = rt.children.get(address)
    handle = child.handle if child is not None else None
    return handle.pid if handle is not None and not handle.remote else 0


def _cpu(rt: Runtime, address: str) -> int | None:
    pid = _pid(rt, address)
    sample = cpu_sample(pid) if pid else None
    return sample[1] if sample is not None else None


def _host_of(address: str) -> str:
    scheme, _, rest = address.partition("://")
    if scheme.endswith("tcp"):
        return rest.rsplit(":", 1)[0]
    return "this host"


def _silent(rt: Runtime, address: str, timeout: float, lost: str | None, cpu: int | None) -> str:
    """Why the proc at ``address`` did not answer, as far as this runtime can tell."""
    child = rt.children.get(address)
    if child is not None and child.returncode is not None:
        return f"exited: {child.describe_exit()}"
    if lost is not None:
        return f"unreachable: {lost}"
    pid = _pid(rt, address)
    if pid:
        sample = cpu_sample(pid)
        if sample is None:
            return f"exited (pid {pid} is gone)"
        state, ticks = sample
        if state in "Tt":
            return f"paused: pid {pid} is stopped (SIGSTOP, or a debugger); did not answer in {timeout:.3g} s"
        if state in "ZXx":
            return f"exited: pid {pid} is a zombie, its exit not yet collected"
        if cpu is not None and ticks > cpu:
            return (
                f"not answering within {timeout:.3g} s: its event loop is blocked while its "
                "CPU time advances (busy: a long call on the loop, or one holding the GIL)"
            )
        return (
            f"not answering within {timeout:.3g} s: its event loop is blocked and uses no CPU "
            "(a blocking call on the loop: a sync wait inside an async endpoint?)"
        )
    return f"not answering within {timeout:.3g} s"


# -- the controller's API ----------------------------------------------------------------


def check_timeout(timeout: object, what: str) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{what}: timeout must be a positive number of seconds (got {timeout!r})")
    if math.isinf(timeout) or math.isnan(timeout):
        raise ValueError(f"{what}: timeout must be finite (got {timeout!r})")
    return float(timeout)


def targets_of(rt: Runtime, target: Any) -> tuple[list[tuple[str, Any]], bool]:
    """The procs ``target`` names (address, coordinates), and whether their children are
    included (only for the default: every proc this runtime owns)."""
    from ._actor_mesh import ActorMesh
    from ._proc_mesh import HostMesh, ProcMesh

    if target is None:
        return [(c.address, c.coords) for c in rt.children.values()], True
    if isinstance(target, ProcMesh):
        shape = target._shape
        return [
            (target._procs[rank][1], tuple(point.items()))
            for rank, point in zip(shape.ranks, _points(shape), strict=True)
        ], False
    if isinstance(target, ActorMesh):
        route = target._route()
        shape = target._shape
        return [
            (address, tuple(point.items()))
            for address, point in zip(route.addresses, _points(shape), strict=True)
        ], False
    if isinstance(target, HostMesh):
        hosts = target._hosts
        if hosts is None:  # this host: the procs it started itself
            chosen = [c for c in rt.children.values() if c.handle is None or not c.handle.remote]
        else:
            ips = {hosts[r].ip for r in target._shape.ranks}
            chosen = [c for c in rt.children.values() if _host_of(c.address) in ips]
        return [(c.address, c.coords) for c in chosen], True
    raise TypeError(
        "stacks() takes a ProcMesh, an ActorMesh, a HostMesh (a slice of one too) or None for "
        f"every proc (got {type(target).__name__})"
    )


def _points(shape: Any) -> list[Any]:
    from ._shape import Extent, Point

    extent = Extent(shape.labels, shape.sizes)
    return [Point(i, extent) for i in range(len(shape))]


def stacks(target: Any = None, *, timeout: float = 10.0) -> JobStacks:
    """The stacks of every proc of ``target`` (default: every proc this process owns,
    procs spawned by actors included), each proc answering within ``timeout`` seconds;
    the unanswered ones are listed with the reason. See docs/observability.md."""
    from ._controller import current_runtime

    timeout = check_timeout(timeout, "stacks()")
    rt = current_runtime()
    if rt.on_runtime_thread():
        raise RuntimeError(
            "stacks() would block the runtime's event loop; call it from the program's "
            "threads or a sync endpoint"
        )
    targets, children = targets_of(rt, target)
    fut: Future[JobStacks] = Future()

    async def run() -> None:
        try:
            procs = await gather(rt, targets, timeout, children=children)
            fut.set_result(JobStacks(tuple(procs), timeout))
        except BaseException as exc:
            fut.set_exception(exc)
            raise

    rt.start_soon(run)
    return fut.get(timeout + 30)


def stacks_for_call(
    rt: Runtime, addresses: Sequence[str], timeout: float
) -> JobStacks | None:
    """The stacks a timed-out call explains itself with (bounded; None when they cannot
    be had: the runtime is stopping, or this is its own thread)."""
    if rt.on_runtime_thread() or rt.died is not None:
        return None
    fut: Future[JobStacks] = Future()
    targets = [(address, ()) for address in dict.fromkeys(addresses)]

    async def run() -> None:
        try:
            procs = await gather(rt, targets, timeout, children=False)
            fut.set_result(JobStacks(tuple(procs), timeout))
        except BaseException as exc:
            fut.set_exception(exc)

    try:
        rt.start_soon(run)
        return fut.get(timeout + 5)
    except Exception as exc:
        log.debug("no stacks for a timed-out call: %s", exc)
        return None


# -- stalls ------------------------------------------------------------------------------


class StallSink(PortBase):
    """The controller's :data:`STALL_PORT`: logs each report (logger ``regency.stall``)."""

    dests: frozenset[str] = frozenset()

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if isinstance(value, Stall):
            log_stall(value)
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass


def log_stall(stall: Stall) -> None:
    if stall.kind == "ended":
        stall_log.info("%s", stall)
    else:
        stall_log.warning("stalled: %s", stall)


def install(rt: Runtime) -> None:
    """Give a runtime its stacks service, stall sink and stall reporter, and its metrics
    service (core/_metrics.py)."""
    from ._metrics import install as install_metrics

    rt.ports[STACKS_PORT] = StacksService(rt)
    rt.ports[STALL_PORT] = StallSink()
    install_metrics(rt)

    def report(stall: Stall) -> None:
        root = rt.root_address or rt.parent_address
        if root is None or root == rt.address:
            log_stall(stall)
            return
        try:
            rt.send_port((root, STALL_PORT), 0, M.OK, stall)
        except Exception as exc:
            log.info("could not send a stall report: %s", exc)
            log_stall(stall)

    rt.report_stall = report


def watch_stalls(rt: Runtime) -> None:
    """One look for stalled calls (the runtime's watchdog tick)."""
    report = rt.report_stall
    if report is not None:
        check_stalls(rt, rt.config.stall_warning_s, report)


def describe_late(
    stacks: JobStacks | None, late: Sequence[tuple[int, str]], endpoint: str
) -> tuple[str, list[int]]:
    """For a timed-out call: each late rank (rank, address) with the endpoint it is in,
    for how long and its innermost user frame, alike ranks grouped; and the ranks among
    them that did handle the call (their replies are held up a casting tree, gathered with
    a late rank's)."""
    from ._stacks import ranges, span

    # Alike ranks (the same endpoint at the same line, or the same reason) go together.
    groups: dict[Any, tuple[list[int], list[float], list[str]]] = {}
    by_address: dict[str, ProcStacks] = {}
    if stacks is not None:
        by_address = {p.address: p for p in stacks.procs}
    mesh, _, method = endpoint.rpartition(".")
    held: list[int] = []
    for rank, address in late:
        proc = by_address.get(address)
        if proc is None:
            key: Any = ("no stacks (its proc did not say)",)
            took = None
        elif not proc.answered:
            key, took = (proc.reason,), None
        else:
            key, took = _doing(proc, mesh, method, rank)
            if key == _HELD:
                held.append(rank)
        ranks, times, procs = groups.setdefault(key, ([], [], []))
        ranks.append(rank)
        if took is not None:
            times.append(took)
        if proc is not None:
            procs.append(f"{proc.proc_id} (host {proc.host}, pid {proc.pid})")
    lines = []
    # The ranks still running first; those whose replies are only held, last.
    for key, (ranks, times, procs) in sorted(groups.items(), key=lambda kv: kv[0] == _HELD):
        which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"
        where = f" on proc {procs[0]}" if len(procs) == 1 else f" on {len(procs)} procs"
        if len(key) == 1:
            lines.append(f"  {which}{where}: {key[0]}")
            continue
        running, at = key
        during = f" for {span(times)}" if times else ""
        lines.append(f"  {which}{where}: {running}{during}{at}")
    return "\n".join(lines), held


#: A late rank that handled the call: its reply is held with a late rank's up a casting tree.
_HELD = ("handled the call: its reply waits up the casting tree, gathered with a late rank's",)


def _doing(
    proc: ProcStacks, mesh: str, method: str, rank: int
) -> tuple[tuple[str, ...], float | None]:
    """What rank ``rank`` of ``mesh`` does on a proc that answered: the endpoint it runs
    and where (its innermost user frame), and for how long."""
    frames_by_actor: dict[tuple[str, int], Any] = {}
    for thread in proc.threads:
        if thread.actor is not None and thread.frames:
            frames_by_actor[(thread.actor.mesh, thread.actor.rank)] = thread.frames
    for call in proc.calls:
        frames_by_actor[(call.actor.mesh, call.actor.rank)] = call.frames
    mine = [a for a in proc.actors if a.mesh == mesh]
    actor = next((a for a in mine if a.rank == rank), mine[0] if len(mine) == 1 else None)
    if actor is None:
        return (f"no actor of mesh {mesh!r} rank {rank} there (not spawned yet, or gone)",), None
    if actor.endpoint is None:
        if actor.recent and actor.recent[-1].endpoint == method:
            return _HELD, None
        return (f"idle, {actor.queued} message(s) queued: the call has not arrived",), None
    frame = innermost_user(frames_by_actor.get((actor.mesh, actor.rank), ()))
    at = f", at {frame.file}:{frame.line} in {frame.function}: {frame.source}" if frame else ""
    queued = f" ({actor.queued} queued behind it)" if actor.queued else ""
    running = f"in endpoint {actor.endpoint}{queued}"
    return (running, at), actor.running_for


#: A timed-out call asks the late procs for their stacks for at most this long.
EXPLAIN_TIMEOUT = 2.0
#: Below this ``get`` timeout, a call that times out names its late ranks without asking for
#: stacks (a caller polling with tiny timeouts pays nothing for it).
EXPLAIN_MIN_GET_TIMEOUT = 0.05


def timed_out(
    endpoint: str, called: int, late: Sequence[tuple[int, str]], timeout: float | None
) -> BaseException:
    """The ``TimeoutError`` of a call's ``get(timeout)``: which ranks are late, and what
    each is doing (from a bounded stacks request to their procs)."""
    from ._current import current_runtime_or_none
    from ._errors import CallTimeoutError

    rt = current_runtime_or_none()
    stacks = None
    wait = timeout or 0.0
    if rt is not None and late and wait >= EXPLAIN_MIN_GET_TIMEOUT:
        stacks = stacks_for_call(rt, [a for _, a in late], min(EXPLAIN_TIMEOUT, max(wait, 0.25)))
    detail, held = describe_late(stacks, late, endpoint)
    ranks = tuple(rank for rank, _ in late if rank not in held) or tuple(r for r, _ in late)
    head = f"{endpoint} did not finish within {timeout} s: {len(ranks)} of {called} rank(s) did not answer"
    if held and len(ranks) < len(late):
        head += f" ({len(held)} more did; their replies wait in a casting tree for the late ones)"
    return CallTimeoutError(f"{head}:\n{detail}" if detail else head, stacks, ranks)
