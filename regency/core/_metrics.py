"""Message statistics for metrics (``regency.telemetry.instrument``; docs/observability.md,
"Metrics"), kept by each runtime while ``config.metrics`` is on and gathered over a reserved
port, as stacks are (core/_introspect.py).

* Each actor spawned while metrics are on keeps, per endpoint, how many calls it handled,
  how many of them failed (raised, or were cancelled), and their handling times in fixed
  latency buckets (:data:`BOUNDS`, with the sum of each bucket's times). The flight
  recorder's deque of that actor is an :class:`ActorStats` recorder, which counts each call
  as it records it. With metrics off, handling a call costs nothing more than before: no
  test for a sync endpoint's call, one attribute test for an async or concurrent one's
  (``ActorStats.handed_over``); with metrics on, one method call.
* Each actor counts the bytes of the reply frames it sends per endpoint (its mailbox's
  metered reply path, ``ActorCell._succeeded_metered``, chosen when the actor is made: no
  test per call while metrics are off; :meth:`ActorStats.replied`), and the bytes of the
  call frames it receives per endpoint (:func:`count_received`, called by the inbound
  paths where a call frame is handed to its actor, on the thread that read it: counted in
  a tally of that thread's own, as sends are).
* Each runtime counts the messages it sends per endpoint, and its casts (sends to more than
  one rank): ``Endpoint``'s send paths (core/_adverbs.py) test ``rt.config.metrics``.
* Each runtime notes its children that exit other than cleanly (a status other than 0, a
  signal) while it runs.

:data:`METRICS_PORT` in every runtime answers a :class:`MetricsRequest` with its
:class:`ProcMetrics` (and its children's, gathered the same way, when asked): the actors'
statistics and mailbox depths, the sends, the actors that died, the children that failed.
With metrics off a proc answers with an empty record. Nothing here imports OpenTelemetry:
the controller's instruments are in ``regency.telemetry``.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from . import _messages as M
from ._ports import PortBase
from ._stacks import RECENT

if TYPE_CHECKING:
    from ._children import Child
    from ._endpoint import EndpointSpec
    from ._errors import RemoteFailure
    from ._mailbox import ActorCell
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")

#: Every runtime's metrics service.
METRICS_PORT = (1 << 63) | 6

#: The upper bounds (seconds) of the handling-time buckets, 50 us to 60 s in 1-2-5 steps; a
#: last bucket takes what is longer. (OpenTelemetry's convention: a bucket holds the times
#: above the previous bound, up to and including its own.)
BOUNDS: tuple[float, ...] = (
    50e-6, 100e-6, 200e-6, 500e-6,
    1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 200e-3, 500e-3,
    1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
)  # fmt: skip

#: How many actors that are gone (stopped or failed) a proc keeps reporting, the latest.
GONE_KEPT = 1024
#: How many failed children a runtime remembers, the latest.
FAILED_CHILDREN_KEPT = 1024
#: Of a request's timeout, the part a proc gives its own children to answer.
_NESTED = 0.75
#: A call's outcome when it returned (the flight recorder's; core/_mailbox.py).
_RETURNED = "returned"


# -- what a proc answers ------------------------------------------------------------------


@attrs.frozen
class EndpointStats:
    """One actor's calls of one endpoint since it started."""

    endpoint: str
    #: Calls that returned.
    ok: int
    #: Calls that raised or were cancelled.
    errors: int
    #: Calls per bucket of handling time: ``len(BOUNDS) + 1`` counts (the last: longer
    #: than ``BOUNDS[-1]``).
    counts: tuple[int, ...]
    #: The sum of the handling times (seconds) of each bucket's calls.
    sums: tuple[float, ...]
    #: Bytes of the call frames the actor received for this endpoint (envelope included).
    bytes_received: int = 0
    #: Bytes of the reply frames the actor sent for this endpoint's calls.
    bytes_sent: int = 0

    @property
    def count(self) -> int:
        """All the calls (the buckets' counts: a record read while a call was being counted
        may have it in ``counts`` and not yet in ``ok`` or ``errors``)."""
        return sum(self.counts)

    @property
    def seconds(self) -> float:
        """The total handling time."""
        return sum(self.sums)


@attrs.frozen
class ActorMetrics:
    """One actor's statistics (an actor spawned while metrics were on)."""

    #: ``module.Class``.
    cls: str
    mesh: str
    rank: int
    #: The actor's key (unique in its job).
    key: str
    #: "running", "failed" or "stopped".
    state: str
    #: Messages waiting in its mailbox (0 once it is gone).
    queued: int
    endpoints: tuple[EndpointStats, ...]


@attrs.frozen
class ProcMetrics:
    """What one proc (or the controller) says, or why it did not answer."""

    proc_id: str
    address: str
    answered: bool
    #: Why it did not answer ("" when it did).
    reason: str = ""
    #: Whether metrics were on in it (off: everything below is empty).
    enabled: bool = False
    actors: tuple[ActorMetrics, ...] = ()
    #: Messages sent per (mesh, endpoint), by this runtime (its user threads and actors).
    sent: tuple[tuple[str, str, int], ...] = ()
    #: Casts (sends to more than one rank) per (mesh, endpoint).
    casts: tuple[tuple[str, str, int], ...] = ()
    #: Its children that exited other than cleanly: (proc id, how).
    failed_children: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class MetricsRequest:
    """Answer with your metrics to ``reply`` (index: the request's); with ``children``,
    gather your children's too within ``timeout`` seconds."""

    reply: tuple[str, int]
    timeout: float
    children: bool


# -- what an actor keeps ------------------------------------------------------------------


class ActorStats(deque[tuple[str, Any, float, float, float, str]]):
    """An actor's flight recorder (a deque of its last :data:`RECENT` calls, as
    ``ActorCell.recent`` is otherwise) that also counts each call it records, per endpoint.

    Written by one thread, the actor's driver (its thread, or the loop for an all-async
    actor), so without a lock. Read on the loop, meanwhile: a read may see a call's time
    before its count (the time is added first), and the count in its bucket before its
    outcome's; each number on its own only grows. An actor whose calls are also recorded
    from the loop (concurrent endpoints of an actor with a thread) gets
    :class:`SharedActorStats`."""

    def __init__(
        self, cls: str, mesh: str, rank: int, key: str, concurrent: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(maxlen=RECENT)
        self.cls, self.mesh, self.rank, self.key = cls, mesh, rank, key
        #: The actor's concurrent endpoints (see :meth:`handed_over`).
        self.concurrent = concurrent
        #: The start time (the very object) of the record not to count, if any.
        self._handed_over: float | None = None
        #: endpoint -> [returned, failed, calls per bucket, seconds per bucket, reply bytes]
        self._endpoints: dict[str, list[Any]] = {}

    def handed_over(self, endpoint: str, started: float) -> None:
        """The mailbox loop is about to record a call it started at ``started`` (an async or
        concurrent endpoint's). A concurrent endpoint's call goes on as a task of its own,
        which records it again when it ends: the mailbox loop's record (the hand-over) is
        not counted. It is told apart by its start time, the same float object."""
        if endpoint in self.concurrent:
            self._handed_over = started

    def append(self, entry: tuple[str, Any, float, float, float, str]) -> None:
        """Record a handled call: (endpoint, reply port, queued, started, finished,
        outcome)."""
        _deque_append(self, entry)
        endpoint, _, _, started, finished, outcome = entry
        if started is self._handed_over:
            self._handed_over = None
            return
        took = finished - started
        stats = self._endpoints.get(endpoint)
        if stats is None:
            stats = self._endpoints.setdefault(endpoint, _new_endpoint())
        bucket = bisect_left(BOUNDS, took)
        stats[3][bucket] += took
        stats[2][bucket] += 1
        stats[0 if outcome == _RETURNED else 1] += 1

    def replied(self, endpoint: str, nbytes: int) -> None:
        """A reply of ``nbytes`` bytes to a call of ``endpoint`` was sent (from the thread
        that handled the call: the actor's driver, or the loop for async endpoints)."""
        stats = self._endpoints.get(endpoint)
        if stats is None:
            stats = self._endpoints.setdefault(endpoint, _new_endpoint())
        stats[4] += nbytes

    def snapshot(self, received: Mapping[str, int] | None = None) -> tuple[EndpointStats, ...]:
        """The statistics per endpoint; ``received``: endpoint -> bytes of call frames (the
        runtime's tallies: :meth:`MetricsService.received`)."""
        received = received or {}
        out = [
            EndpointStats(
                endpoint, ok, failed, tuple(counts), tuple(sums), received.get(endpoint, 0), sent
            )
            for endpoint, (ok, failed, counts, sums, sent) in list(self._endpoints.items())
        ]
        size = len(BOUNDS) + 1
        for endpoint, nbytes in received.items():  # calls received, none handled yet
            if endpoint not in self._endpoints:
                out.append(EndpointStats(endpoint, 0, 0, (0,) * size, (0.0,) * size, nbytes))
        return tuple(out)


class SharedActorStats(ActorStats):
    """:class:`ActorStats` recorded from two threads (an actor with a thread and concurrent
    endpoints, whose calls are recorded on the loop): each record and read takes a lock."""

    def __init__(
        self, cls: str, mesh: str, rank: int, key: str, concurrent: frozenset[str] = frozenset()
    ) -> None:
        super().__init__(cls, mesh, rank, key, concurrent)
        self._lock = threading.Lock()

    def append(self, entry: tuple[str, Any, float, float, float, str]) -> None:
        with self._lock:
            super().append(entry)

    def replied(self, endpoint: str, nbytes: int) -> None:
        with self._lock:
            super().replied(endpoint, nbytes)

    def snapshot(self, received: Mapping[str, int] | None = None) -> tuple[EndpointStats, ...]:
        with self._lock:
            return super().snapshot(received)


_deque_append = deque.append


def _new_endpoint() -> list[Any]:
    size = len(BOUNDS) + 1
    return [0, 0, [0] * size, [0.0] * size, 0]


def actor_stats(
    rt: Runtime, cell: ActorCell, endpoints: Mapping[str, EndpointSpec[..., Any]]
) -> ActorStats | None:
    """The statistics (and flight recorder) of an actor being made, with ``endpoints``,
    registered with its runtime; None while metrics are off (``ActorCell.__init__``)."""
    if not rt.config.metrics:
        return None
    # An actor with a thread records its concurrent endpoints' calls from the loop too.
    concurrent = frozenset(name for name, spec in endpoints.items() if spec.concurrent)
    kind = SharedActorStats if concurrent and cell.threaded else ActorStats
    stats = kind(cell.instance.class_name, cell.name, cell.point.rank, cell.key, concurrent)
    service = _service(rt)
    if service is not None:
        service.cells[cell.key] = stats
    return stats


def frame_bytes(frame: Any) -> int:
    """The size of an encoded frame: bytes, or a list of parts (core/_codec.py)."""
    if type(frame) is bytes:
        return len(frame)
    if isinstance(frame, memoryview):
        return frame.nbytes
    if isinstance(frame, (bytearray, bytes)):
        return len(frame)
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in frame)


def count_received(rt: Runtime, call: M.Call, nbytes: int) -> None:
    """A call frame of ``nbytes`` bytes for ``call.actor`` arrived (called by the inbound
    paths, on the thread that read it, only while metrics are on)."""
    service = rt.ports.get(METRICS_PORT)
    if type(service) is MetricsService:
        service.received(call.actor, call.method, nbytes)


def count_sent(rt: Runtime, mesh: str, endpoint: str, messages: int) -> None:
    """``messages`` calls of ``mesh.endpoint`` sent by this runtime (one per rank; more
    than one: a cast). Called only while metrics are on."""
    service = rt.ports.get(METRICS_PORT)
    if type(service) is MetricsService:
        service.sent(mesh, endpoint, messages)


def _service(rt: Runtime) -> MetricsService | None:
    service = rt.ports.get(METRICS_PORT)
    return service if isinstance(service, MetricsService) else None


# -- the service ----------------------------------------------------------------------------


class MetricsService(PortBase):
    """The handler of :data:`METRICS_PORT` (on the loop), and this runtime's statistics."""

    dests: frozenset[str] = frozenset()

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: The statistics of each actor spawned here while metrics were on, by key.
        self.cells: dict[str, ActorStats] = {}
        #: Keys of those that are gone (stopped or failed), oldest first.
        self._gone: OrderedDict[str, None] = OrderedDict()
        #: Sends, counted by each sending thread in a tally of its own (one writer each,
        #: no lock per send): (mesh, endpoint) -> [messages, casts].
        self._local = threading.local()
        self._tallies: list[dict[tuple[str, str], list[int]]] = []
        #: Bytes of the call frames received for the actors, counted the same way: (actor
        #: key, endpoint) -> [bytes].
        self._traffic: list[dict[tuple[str, str], list[int]]] = []
        self._tallies_lock = threading.Lock()
        self._failed_children: deque[tuple[str, str]] = deque(maxlen=FAILED_CHILDREN_KEPT)

    def sent(self, mesh: str, endpoint: str, messages: int) -> None:
        try:
            tally: dict[tuple[str, str], list[int]] = self._local.tally
        except AttributeError:  # this thread's first send
            tally = self._local.tally = {}
            with self._tallies_lock:
                self._tallies.append(tally)
        key = (mesh, endpoint)
        counts = tally.get(key)
        if counts is None:
            counts = tally[key] = [0, 0]
        counts[0] += messages
        if messages > 1:
            counts[1] += 1

    def received(self, key: str, endpoint: str, nbytes: int) -> None:
        """A call frame of ``nbytes`` bytes for actor ``key``'s ``endpoint`` (this thread's
        tally)."""
        try:
            tally: dict[tuple[str, str], list[int]] = self._local.traffic
        except AttributeError:  # this thread's first
            tally = self._local.traffic = {}
            with self._tallies_lock:
                self._traffic.append(tally)
        counts = tally.get((key, endpoint))
        if counts is None:
            counts = tally[(key, endpoint)] = [0]
        counts[0] += nbytes

    def traffic(self) -> dict[str, dict[str, int]]:
        """Actor key -> endpoint -> bytes of call frames received, summed over threads."""
        out: dict[str, dict[str, int]] = {}
        with self._tallies_lock:
            tallies = list(self._traffic)
        for tally in tallies:
            for (key, endpoint), (nbytes,) in list(tally.items()):
                of_actor = out.setdefault(key, {})
                of_actor[endpoint] = of_actor.get(endpoint, 0) + nbytes
        return out

    def _sends(self) -> tuple[tuple[tuple[str, str, int], ...], tuple[tuple[str, str, int], ...]]:
        """Messages and casts per (mesh, endpoint), summed over the sending threads."""
        sent: dict[tuple[str, str], int] = {}
        casts: dict[tuple[str, str], int] = {}
        with self._tallies_lock:
            tallies = list(self._tallies)
        for tally in tallies:
            for key, (messages, cast) in list(tally.items()):
                sent[key] = sent.get(key, 0) + messages
                if cast:
                    casts[key] = casts.get(key, 0) + cast
        return (
            tuple((m, e, n) for (m, e), n in sent.items()),
            tuple((m, e, n) for (m, e), n in casts.items()),
        )

    def _forget(self, key: str) -> None:
        """An actor gone long ago: its statistics and its bytes go."""
        self.cells.pop(key, None)
        with self._tallies_lock:
            tallies = list(self._traffic)
        for tally in tallies:
            for counted in [k for k in list(tally) if k[0] == key]:
                tally.pop(counted, None)

    def child_exited(self, child: Child) -> None:
        code = child.returncode
        rt = self.rt
        if code and rt.config.metrics and not rt.closing:
            self._failed_children.append((child.proc_id, child.describe_exit()))

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if not isinstance(value, MetricsRequest):
            raise TypeError(f"the metrics port takes a MetricsRequest (got {type(value).__name__})")
        self.rt.start_soon(self._answer, index, value)
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass

    async def _answer(self, index: int, request: MetricsRequest) -> None:
        rt = self.rt
        answer = [self.capture()]
        if request.children:
            answer += await gather(rt, children_of(rt), request.timeout * _NESTED)
        try:
            rt.send_port(request.reply, index, M.OK, answer)
        except Exception as exc:
            log.info("could not answer a metrics request from %s: %s", request.reply[0], exc)

    def capture(self) -> ProcMetrics:
        """This runtime's record, now (on its loop: the actor table does not change)."""
        rt = self.rt
        if not rt.config.metrics and not self.cells and not self._tallies and not self._traffic:
            return ProcMetrics(rt.proc_id, rt.address, True)
        actors = []
        traffic = self.traffic()
        for key, stats in list(self.cells.items()):
            cell = rt.actors.get(key)
            if cell is not None:
                state, queued = "running", cell.queued()
            else:
                state, queued = ("failed" if _died(rt.dead.get(key)) else "stopped"), 0
                if key not in self._gone:
                    self._gone[key] = None
                    while len(self._gone) > GONE_KEPT:
                        self._forget(self._gone.popitem(last=False)[0])
            actors.append(
                ActorMetrics(
                    stats.cls, stats.mesh, stats.rank, key, state, queued,
                    stats.snapshot(traffic.get(key)),
                )
            )
        sent, casts = self._sends()
        return ProcMetrics(
            rt.proc_id,
            rt.address,
            True,
            enabled=rt.config.metrics,
            actors=tuple(actors),
            sent=sent,
            casts=casts,
            failed_children=tuple(self._failed_children),
        )


def _died(failure: RemoteFailure | None) -> bool:
    """Whether an actor that is gone failed (rather than stopped): the failure its later
    messages bounce with says so (``ActorCell._dead_failure``'s message)."""
    return failure is not None and failure.message.startswith("The actor ") and (
        "have failed" in failure.message
    )


def install(rt: Runtime) -> None:
    """Give a runtime its metrics service (core/_introspect.install)."""
    service = MetricsService(rt)
    rt.ports[METRICS_PORT] = service
    rt.on_child_exit.append(service.child_exited)


# -- gathering ------------------------------------------------------------------------------


def children_of(rt: Runtime) -> list[tuple[str, str]]:
    """The running children of ``rt``: (address, proc id)."""
    return [(c.address, c.proc_id) for c in rt.children.values() if c.returncode is None]


async def gather(
    rt: Runtime, targets: Sequence[tuple[str, str]], timeout: float
) -> list[ProcMetrics]:
    """Ask each target proc (address, proc id), and through it its children, for its
    metrics, on the loop; at most ``timeout`` seconds. One record per target, in order (then
    what each gathered from its own children): the unanswered ones say why."""
    from ._introspect import _silent, ask

    if not targets:
        return []
    addresses = [address for address, _ in targets]
    collect, before = await ask(
        rt, METRICS_PORT, addresses, lambda port: MetricsRequest(port, timeout * _NESTED, True),
        timeout,
    )
    out: list[ProcMetrics] = []
    nested: list[ProcMetrics] = []
    for index, (address, proc_id) in enumerate(targets):
        answer = collect.answers.get(index)
        if answer:
            out.append(answer[0])
            nested += answer[1:]
        else:
            why = _silent(rt, address, timeout, collect.lost.get(address), before[address])
            out.append(ProcMetrics(proc_id, address, False, why))
    return out + nested


def collect(rt: Runtime, timeout: float) -> list[ProcMetrics]:
    """The metrics of this runtime and of every proc it owns, procs spawned by actors
    included (blocking; not on the runtime's loop): this runtime's record first. Procs that
    do not answer within ``timeout`` seconds are listed with the reason."""
    from ._future import Future

    if rt.on_runtime_thread():
        raise RuntimeError(
            "collecting metrics would block the runtime's event loop; collect from another "
            "thread (a metric reader's)"
        )
    fut: Future[list[ProcMetrics]] = Future()

    async def run() -> None:
        try:
            service = _service(rt)
            own = [service.capture()] if service is not None else []
            fut.set_result(own + await gather(rt, children_of(rt), timeout))
        except BaseException as exc:
            fut.set_exception(exc)
            raise

    rt.start_soon(run)
    return fut.get(timeout + 5)
