"""The simulated network: a :class:`~regency.transports.Transport` backend on virtual time.

One :class:`SimNetwork` per simulated cluster owns the delivery of every frame between
simulated hosts. Each simulated process gets its own :class:`SimTransport` (scheme ``sim``,
addresses ``sim://HOST/NAME``) from :meth:`SimNetwork.transport`, with the same semantics as
the other backends: whole frames, in order per connection, sink callbacks on the trio thread,
``close()`` reported locally with ``None`` and at the peer with :class:`ConnectionBroken`.
There is no authentication handshake: every simulated process lives in one Python process
that already shares the job secret and all of memory.

How delivery works, and why it is deterministic:

* A frame sent on a connection is delivered after a latency drawn from the network's seeded
  generator (:class:`Latency`: ``base`` plus up to ``jitter``, per host pair), but never
  before the frame sent ahead of it on that connection: its delivery time is
  ``max(now + drawn, previous frame's delivery time)``. Nothing is reordered.
* Each transport runs one delivery task (in the nursery it was given, in the context of the
  code that made it, so context variables of the simulated process are visible to its sinks).
  It keeps a heap of due entries keyed by ``(virtual time, global sequence number)`` and calls
  the sinks; every sink callback but a local ``close()``'s runs there. The heap order depends
  only on draws and sequence numbers, never on ``id()``.
* All time is trio's clock (a ``MockClock`` in a simulation); all randomness comes from the
  ``random.Random`` handed to :class:`SimNetwork`, and every draw is folded into the run's
  :class:`~regency.sim.Trace` with a label. Registries are dicts iterated in insertion order
  or sorted by stable keys; sets are only used for membership.

Faults are set from code (:meth:`SimNetwork.partition`, :meth:`~SimNetwork.heal`,
:meth:`~SimNetwork.disconnect`, :meth:`~SimNetwork.clog`, :meth:`~SimNetwork.delay`,
:meth:`~SimNetwork.set_latency`, :meth:`~SimNetwork.crash_host`), from an explicit schedule
(:class:`FaultSchedule`, run by :meth:`SimNetwork.run_faults`), or drawn at random at the
rates of :class:`LinkFaults`. Every fault is encoded so that its zero value means "no fault":
rates of 0, durations of 0 and extra delays of 0 do nothing, and empty schedules are quiet,
so Hypothesis shrinks failing schedules toward the fewest, shortest faults.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import attrs
import trio

from ..transports import _baton
from ..transports._base import (
    DEFAULT_MAX_FRAME_BYTES,
    Connection,
    ConnectionBroken,
    ConnectionClosed,
    ConnectionRefused,
    Frame,
    FrameSink,
    Listener,
    SinkFactory,
    ThreadSink,
    Transport,
    join_frame,
)
from ._clock import SimEvent, Trace, current_trace
from ._leading import Watched, new_fd, register

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

log = logging.getLogger("regency.sim")

V = TypeVar("V")

SCHEME: Final = "sim"

#: The simulated host the controller (the program) runs on, next to ``host0``, ``host1``, ...
#: of a simulated cluster's host mesh. Links to it may fail; it cannot crash.
CONTROLLER_HOST: Final = "controller"

# What a delivery heap entry carries. Frames and FINs travel the link (latency, clogs and
# partitions apply); LOST and ACCEPT are the network telling one end something, at once.
_FRAME: Final = 0
_FIN: Final = 1
_LOST: Final = 2
_ACCEPT: Final = 3

# (delivery time, global sequence number, receiving end, kind, payload). The payload of a
# frame is (its index on the connection, its bytes); of a FIN, the reason. An entry is in the
# heap at most once and keeps its sequence number, so tuples never compare past it.
_Entry = tuple[float, int, "SimConnection", int, Any]
#: Baton states in which the loop's reader may wake for a frame (transports/_baton.py): a
#: thread leads the connection (the reader then waits for it back) or set it aside.
_RACEABLE = frozenset((_baton.THREAD, _baton.HELD))


def _non_negative(what: str) -> Any:
    def check(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"{type(instance).__name__}.{attribute.name} must be a finite {what} >= 0 "
                f"(got {value!r})"
            )

    return check


def _duration_check(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:  # inf allowed: a fault that lasts until healed
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be a duration >= 0 in virtual "
            f"seconds (got {value!r})"
        )


def _number_repr(value: float) -> str:
    """``repr`` that reads back: ``float('inf')`` for a fault that lasts until healed (a
    schedule's repr is the replay line's, and ``inf`` alone is no Python name)."""
    return "float('inf')" if value == math.inf else repr(value)


@attrs.frozen
class Latency:
    """One-way latency of a link: ``base`` plus a uniform draw in ``[0, jitter)`` seconds."""

    base: float = attrs.field(default=0.001, validator=_non_negative("latency in seconds"))
    jitter: float = attrs.field(default=0.001, validator=_non_negative("jitter in seconds"))


def _probability(what: str) -> Any:
    def check(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
            raise ValueError(f"{what} must be a probability in [0, 1] (got {value!r})")

    return check


def _rate() -> Any:
    return attrs.field(default=0.0, validator=_non_negative("rate per simulated second"))


@attrs.frozen
class Faults:
    """Random faults, each a rate per simulated second; all zero (no faults) by default.

    Link faults: ``delay`` adds up to ``max_delay`` seconds to one host pair's latency for a
    while; ``disconnect`` breaks every connection between the two hosts of a random live
    connection; ``partition`` cuts a random split of the hosts in two (one way or both);
    ``clog`` holds every frame from and to one host for a while, then delivers them in order.

    Process faults (drawn by the simulated cluster, over the procs running at that moment):
    ``crash`` kills a random proc as SIGKILL would; ``pause`` stops a random proc for a while
    as SIGSTOP (or a long GC pause) would: nothing reaches it and nothing it sends leaves
    until it resumes, while its clocks keep running, so a pause longer than the heartbeat
    timeout gets it declared stuck and killed by its parent.

    How long a fault lasts is drawn from an exponential distribution with mean
    ``mean_duration``. A rate of 0 never draws that fault, and ``max_delay=0`` or
    ``mean_duration=0`` make delays, clogs, partitions and pauses harmless, so the zero value
    is always "no fault" (which Hypothesis shrinks toward).
    """

    delay: float = _rate()
    disconnect: float = _rate()
    partition: float = _rate()
    clog: float = _rate()
    crash: float = _rate()
    pause: float = _rate()
    max_delay: float = attrs.field(default=0.5, validator=_non_negative("delay in seconds"))
    mean_duration: float = attrs.field(default=1.0, validator=_non_negative("duration in seconds"))
    #: Not a rate: the chance that the loop wins a race with a thread for a connection's read
    #: (``sim/_leading.py``), drawn at each thread's ``lead`` (refused: the loop was reading
    #: just then) and at each frame that reaches a connection a thread leads or set aside
    #: (the loop's reader woke for it: it reads that connection next). 0: threads win.
    read_race: float = attrs.field(default=0.0, validator=_probability("read_race"))

    @property
    def link_rate(self) -> float:
        """Rate of the faults the network draws (delay, disconnect, partition, clog)."""
        return self.delay + self.disconnect + self.partition + self.clog

    @property
    def proc_rate(self) -> float:
        """Rate of the faults the cluster draws (crash, pause)."""
        return self.crash + self.pause

    @property
    def total_rate(self) -> float:
        return self.link_rate + self.proc_rate


#: The earlier name of :class:`Faults` (link faults only, before process faults existed).
LinkFaults = Faults


@attrs.frozen
class PartitionFault:
    """At ``at``, cut ``a_hosts`` from ``b_hosts`` for ``duration`` (see ``partition``).

    An empty side or a zero duration is no fault at all.
    """

    at: float = attrs.field(validator=_non_negative("virtual time"))
    duration: float = attrs.field(validator=_duration_check, repr=_number_repr)
    a_hosts: tuple[str, ...]
    b_hosts: tuple[str, ...]
    one_way: bool = False


@attrs.frozen
class DisconnectFault:
    """At ``at``, break every connection between ``host_a`` and ``host_b``; with
    ``refuse_for``, dials between them are refused for that long after (a relay or proxy in
    between restarting)."""

    at: float = attrs.field(validator=_non_negative("virtual time"))
    host_a: str
    host_b: str
    refuse_for: float = attrs.field(default=0.0, validator=_duration_check, repr=_number_repr)


@attrs.frozen
class ClogFault:
    """At ``at``, hold frames from and to ``host`` for ``duration`` (zero: no fault)."""

    at: float = attrs.field(validator=_non_negative("virtual time"))
    host: str
    duration: float = attrs.field(validator=_duration_check, repr=_number_repr)


@attrs.frozen
class DelayFault:
    """At ``at``, add ``extra`` seconds of latency between two hosts for ``duration``."""

    at: float = attrs.field(validator=_non_negative("virtual time"))
    host_a: str
    host_b: str
    extra: float = attrs.field(validator=_non_negative("delay in seconds"))
    duration: float = attrs.field(validator=_duration_check, repr=_number_repr)


@attrs.frozen
class CrashHostFault:
    """At ``at``, crash ``host``: in a simulated cluster exactly what
    ``regency.sim.current().crash_host(host)`` does (every proc on it dies at once, its links
    break); on a bare :class:`SimNetwork`, :meth:`SimNetwork.crash_host`."""

    at: float = attrs.field(validator=_non_negative("virtual time"))
    host: str


def _proc_position(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not (isinstance(value, int) and value >= 0):
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be a position >= 0 among the "
            f"running procs (got {value!r})"
        )


@attrs.frozen
class CrashProcFault:
    """At ``at``, crash a proc: number ``proc`` (modulo how many run) of the procs running
    then, in start order. Procs are named by position because their addresses are only
    known once the program spawned them."""

    at: float = attrs.field(validator=_non_negative("virtual time"))
    proc: int = attrs.field(validator=_proc_position)


@attrs.frozen
class PauseProcFault:
    """At ``at``, pause a proc (chosen as for :class:`CrashProcFault`) for ``duration``
    (zero: no fault)."""

    at: float = attrs.field(validator=_non_negative("virtual time"))
    proc: int = attrs.field(validator=_proc_position)
    duration: float = attrs.field(validator=_duration_check, repr=_number_repr)


LinkFault = PartitionFault | DisconnectFault | ClogFault | DelayFault | CrashHostFault
ProcFault = CrashProcFault | PauseProcFault
ScheduledFault = LinkFault | ProcFault


@attrs.frozen
class FaultSchedule:
    """Random fault rates plus explicit faults at given times (relative to ``run_faults``).

    The empty schedule (zero rates, no faults) is a quiet network.
    """

    rates: Faults = Faults()
    faults: tuple[ScheduledFault, ...] = ()

    @property
    def link_faults(self) -> tuple[LinkFault, ...]:
        return tuple(f for f in self.faults if not isinstance(f, ProcFault))

    @property
    def proc_faults(self) -> tuple[ProcFault, ...]:
        return tuple(f for f in self.faults if isinstance(f, ProcFault))


def fault_schedules(
    hosts: Sequence[str] | int,
    *,
    horizon: float = 10.0,
    max_faults: int = 6,
    max_rate: float = 0.5,
    crashes: bool = False,
    procs: bool = False,
) -> SearchStrategy[FaultSchedule]:
    """A Hypothesis strategy of :class:`FaultSchedule` over ``hosts`` that shrinks to quiet.

    Explicit faults happen within ``horizon`` virtual seconds and last at most that long;
    random rates are at most ``max_rate`` per second. Rates, durations, delays and lists all
    shrink toward zero or empty, which is "no fault". Host crashes are permanent (nothing
    restarts a host here), so they are only drawn when ``crashes`` is set. Process faults
    (:class:`CrashProcFault`, :class:`PauseProcFault` and the ``crash`` and ``pause`` rates),
    which a :class:`~regency.sim.SimCluster` applies, are only drawn when ``procs`` is set.

    For ``regency.sim.simulate(program, hosts=N)`` the host names are ``"host0"`` to
    ``"hostN-1"`` (rank ``i`` of the program's host mesh is ``"host{i}"``) and
    ``"controller"``, the host the controller (the program, and procs it spawns on
    ``this_host()``) runs on; ``fault_schedules(N)`` means all of them. ``simulate`` refuses
    a schedule that names any other host. The controller's host is never drawn to crash
    (crashing it is refused, as ``crash_host`` refuses it): its links may still fail.
    """
    from hypothesis import strategies as st

    if isinstance(hosts, bool | str):
        raise TypeError(
            f"fault_schedules takes a list of host names or a number of hosts (got {hosts!r})"
        )
    if isinstance(hosts, int):
        if hosts < 1:
            raise ValueError(f"fault_schedules needs at least one host (got {hosts})")
        names: tuple[str, ...] = (CONTROLLER_HOST, *(f"host{i}" for i in range(hosts)))
    else:
        names = tuple(hosts)
    if not names:
        raise ValueError("fault_schedules needs at least one host name (got none)")
    if not all(isinstance(name, str) for name in names):
        raise TypeError(
            f"fault_schedules takes host names (str) or a number of hosts (got {hosts!r})"
        )
    if not (math.isfinite(horizon) and horizon > 0):
        raise ValueError(f"horizon must be a positive number of virtual seconds (got {horizon})")
    times = st.floats(0, horizon, allow_nan=False)
    durations = st.floats(0, horizon, allow_nan=False)
    host = st.sampled_from(names)

    @st.composite
    def partitions(draw: st.DrawFn) -> PartitionFault:
        at, duration = draw(times), draw(durations)
        a = draw(st.lists(host, unique=True, max_size=len(names) - 1))
        rest = [h for h in names if h not in a]
        b = draw(st.lists(st.sampled_from(rest), unique=True)) if rest else []
        return PartitionFault(at, duration, tuple(sorted(a)), tuple(sorted(b)), draw(st.booleans()))

    kinds: list[SearchStrategy[ScheduledFault]] = [
        partitions(),
        st.builds(DisconnectFault, times, host, host),
        st.builds(ClogFault, times, host, durations),
        st.builds(DelayFault, times, host, host, st.floats(0, 1), durations),
    ]
    crashable = [name for name in names if name != CONTROLLER_HOST]
    if crashes and crashable:
        kinds.append(st.builds(CrashHostFault, times, st.sampled_from(crashable)))
    if procs:
        which = st.integers(0, 64)
        kinds.append(st.builds(CrashProcFault, times, which))
        kinds.append(st.builds(PauseProcFault, times, which, durations))
    rate = st.floats(0, max_rate, allow_nan=False)
    proc_rate = rate if procs else st.just(0.0)
    rates = st.builds(
        Faults,
        delay=rate,
        disconnect=rate,
        partition=rate,
        clog=rate,
        crash=proc_rate,
        pause=proc_rate,
        max_delay=st.floats(0, 1),
        mean_duration=st.floats(0, horizon / 2),
    )
    faults = st.lists(st.one_of(kinds), max_size=max_faults).map(tuple)
    return st.builds(FaultSchedule, rates, faults)


def _parse(address: str) -> tuple[str, str]:
    scheme, sep, rest = address.partition("://")
    host, slash, name = rest.partition("/")
    if scheme != SCHEME or not sep or not host or not slash:
        raise ValueError(f"sim address must look like sim://HOST/NAME (got {address!r})")
    return host, name


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _hosts_text(hosts: Iterable[str]) -> str:
    return ",".join(sorted(hosts)) or "-"


@attrs.define
class _Cut:
    id: int
    a: frozenset[str]
    b: frozenset[str]
    one_way: bool
    until: float

    def blocks(self, src: str, dst: str) -> bool:
        if src in self.a and dst in self.b:
            return True
        return not self.one_way and src in self.b and dst in self.a

    def crosses(self, x: str, y: str) -> bool:
        return (x in self.a and y in self.b) or (x in self.b and y in self.a)


@attrs.define
class _Slowdown:
    pair: tuple[str, str]
    extra: float
    until: float


class _Wire:
    """One simulated connection: its two ends, dialer first."""

    __slots__ = ("accepted", "ends", "id")

    #: Set right after construction, once both ends exist.
    ends: tuple[SimConnection, SimConnection]

    def __init__(self, wire_id: int) -> None:
        self.id = wire_id
        #: Set once the acceptor's sink exists, or the wire broke first.
        self.accepted = trio.Event()

    def hosts(self) -> tuple[str, str]:
        return self.ends[0].host, self.ends[1].host


class SimConnection(Connection):
    """One end of a simulated connection.

    Frames sent here travel to the other end with a drawn latency, in order. The end is closed
    (``closed`` is True, sends raise) from the moment it breaks; its sink hears of it through
    ``connection_lost`` from its transport's delivery task soon after, and no frame reaches
    that sink after that.

    A thread may read it (``transports.ThreadReadable``, as a socket: ``sim/_leading.py``):
    who reads is the same baton state machine as a socket's (``transports/_baton.py``). While
    a thread leads the end or set it aside, frames that arrive wait in it, unread, in order
    (a FIN too); the thread hands each to its sink's ``frame_on_thread``; what it leaves, and
    everything once the loop takes the end back, the loop hands to ``frame_received``.
    """

    readable_by_threads = True

    def __init__(
        self,
        wire: _Wire,
        side: int,
        transport: SimTransport,
        peer: str,
        sink: FrameSink | None,
    ) -> None:
        self.peer = peer
        self.sink = sink
        self._wire = wire
        self._side = side  # 0 dialer, 1 acceptor
        self._transport = transport
        self._closed = False
        self._error: BaseException | None = None
        self._reported = False  # connection_lost was called: the sink hears nothing more
        self._muted = False  # connect() gave up after the wire was accepted: never call sink
        #: A dialer's end until connect() returns it: nothing reaches its sink before that.
        #: What falls due meanwhile waits in ``_parked``, keys unchanged, in order.
        self._pending = False
        self._parked: list[_Entry] = []
        #: The latest delivery time scheduled into this end. Frames into it get delivery times
        #: that never decrease, which is what keeps them in order.
        self._last_at = -math.inf
        self._sent = 0  # frames sent from this end: the next frame's index
        #: Who reads it (transports/_baton.py): the loop's delivery, idle, to begin with.
        self._baton = _baton.LOOP_WAITING
        #: Frames (and a FIN) that arrived while a thread led it or set it aside, in order:
        #: ``(kind, payload)``.
        self._unread: deque[tuple[int, Any]] = deque()
        self._fd = new_fd()
        self._watched = Watched()
        register(self._fd, self)

    @property
    def id(self) -> int:
        """The connection's number, shared by both ends (``cN`` in the event log)."""
        return self._wire.id

    @property
    def host(self) -> str:
        """The host this end is on."""
        return self._transport.host

    @property
    def other(self) -> SimConnection:
        return self._wire.ends[1 - self._side]

    @property
    def closed(self) -> bool:
        return self._closed

    def _broken(self, reason: str) -> ConnectionBroken:
        return ConnectionBroken(f"connection to {self.peer} is broken: {reason}")

    # -- read by a thread (transports.ThreadReadable) -------------------------------------

    def _step(self, event: int) -> int:
        """Move the baton; returns the action (the simulated loop needs only WAKE_LOOP)."""
        self._baton, action = _baton.STEP[self._baton | event]
        if action == _baton.WAKE_LOOP or action == _baton.HAND_BACK:
            try:
                self._transport._token.run_sync_soon(self._loop_reads)
            except trio.RunFinishedError:
                pass  # the simulation is over: nothing reads it again
        elif action == _baton.ILLEGAL:
            raise AssertionError(f"sim connection c{self._wire.id}: illegal baton move")
        return action

    def lead(self) -> bool:
        if self._closed:
            return False
        if self._race("lead refused: the loop reads"):
            return False
        return self._step(_baton.LEAD) != _baton.REFUSED

    def _race(self, what: str) -> bool:
        """Whether the loop wins this race for the read (``Faults.read_race``)."""
        net = self._transport._net
        chance = net.faults.read_race
        if not chance or not net._draw("read_race", net._rng.random() < chance):
            return False
        detail = f"c{self._wire.id} {self.host}: {what}"
        if threading.get_ident() == self._transport._thread:
            net._record("read_race", detail)
        else:  # (a lockstep thread's lead: recorded on the loop, at this virtual time)
            self._transport._token.run_sync_soon(net._record, "read_race", detail)
        return True

    def fileno(self) -> int:
        return self._fd

    def ready(self) -> bool:
        """Something for the thread that leads it to read (or its end)."""
        return self._baton in _baton.THREAD_READS and (bool(self._unread) or self._closed)

    def watch(self, wake: Any) -> None:
        self._watched.watch(wake)

    def unwatch(self, wake: Any) -> None:
        self._watched.unwatch(wake)

    def read_led(self) -> bool:
        if self._baton not in _baton.THREAD_READS:
            return False
        unread = self._unread
        # (A connection a thread leads is an inbound one: its sink takes frames on threads.)
        on_thread = cast(ThreadSink, self.sink).frame_on_thread
        while unread and not self._closed:
            kind, payload = unread[0]
            if kind != _FRAME:
                break  # the loop reads a FIN
            unread.popleft()
            taken = False
            try:
                taken = on_thread(self, memoryview(payload[1]))
            finally:
                if not taken:
                    unread.appendleft((kind, payload))
                    self._step(_baton.GIVE_BACK_UNREAD)
            if not taken:
                return False
        if unread or self._closed:
            self._step(_baton.GIVE_BACK_UNREAD)
            return False
        return True

    def _dirty(self) -> int:
        return _baton.UNREAD if self._unread or self._closed else 0

    def hold(self) -> None:
        self._step(_baton.HOLD + self._dirty())

    def give_back(self) -> None:
        self._step(_baton.GIVE_BACK + self._dirty())

    def reclaim(self) -> bool:
        return self._step(_baton.RECLAIM + self._dirty()) != _baton.REFUSED

    def _arrived(self, kind: int, payload: Any) -> bool:
        """A frame or FIN reached this end: kept unread (True) while a thread leads it or
        set it aside, or while what came before it waits for the loop."""
        if self._baton == _baton.LOOP_WAITING and not self._unread:
            return False
        self._unread.append((kind, payload))
        if self._baton in _RACEABLE and self._race("the loop's reader woke"):
            self._step(_baton.LOOP_WAKES)  # held: the loop's now; led: it waits for it
            if self._baton == _baton.LOOP:
                self._transport._token.run_sync_soon(self._loop_reads)
        self._watched.wake()
        return True

    def _loop_reads(self) -> None:
        """On the loop: the baton is the loop's again with frames unread: handle them, in
        order, as they would have been on arrival."""
        if self._baton != _baton.LOOP:
            return  # (a thread led it again first, or it is the loop's and idle)
        net = self._transport._net
        unread = self._unread
        while unread and not self._closed:
            kind, payload = unread.popleft()
            if kind == _FIN:
                unread.clear()
                net._mark_closed(self, self._broken(payload))
                net._record("fin", self._label(towards_me=True))
                net._report(self)
                break
            self._transport._hand_to_sink(self, payload[1])
        unread.clear()
        self._step(_baton.LOOP_WAITS)

    def _label(self, towards_me: bool) -> str:
        src, dst = (self.other.host, self.host) if towards_me else (self.host, self.other.host)
        return f"c{self._wire.id} {src}->{dst}"

    def send_nowait(self, frame: Frame, answer: bool = False) -> None:
        if self._closed:
            error = self._error
            if error is None:
                raise ConnectionClosed(f"connection to {self.peer} is closed")
            if isinstance(error, ConnectionBroken | ConnectionClosed):
                raise type(error)(str(error))
            raise self._broken(repr(error))
        transport = self._transport
        if threading.get_ident() != transport._thread:
            # Outside a simulation (the conformance suite) a sender may be another thread:
            # hop onto the trio thread, in order, so every draw happens there.
            try:
                transport._token.run_sync_soon(self._send_on_trio_thread, frame)
            except trio.RunFinishedError:
                raise ConnectionClosed(f"connection to {self.peer} is closed") from None
            return
        transport._net._transmit(self, _FRAME, join_frame(frame))

    def _send_on_trio_thread(self, frame: Frame) -> None:
        if not self._closed:
            self._transport._net._transmit(self, _FRAME, join_frame(frame))

    def close(self) -> None:
        if self._closed:
            return
        net = self._transport._net
        net._mark_closed(self, None)
        net._record("close", self._label(towards_me=False))
        if not self.other._closed:
            net._transmit(self, _FIN, f"sim://{self.host} closed the connection")
        net._report(self)


class SimListener(Listener):
    def __init__(self, address: str, transport: SimTransport, sinks: SinkFactory) -> None:
        self.address = address
        self._transport = transport
        self._sinks = sinks

    def close(self) -> None:
        self._transport._net._unlisten(self, "unlisten")


class SimTransport(Transport):
    """The ``sim://`` transport of one simulated process on one host.

    Made by :meth:`SimNetwork.transport`. Its delivery task lives in the nursery it was given;
    when that nursery is cancelled (the process ends), its listeners vanish and the peers of
    its connections see them break, as with a process killed by the kernel.
    """

    schemes = (SCHEME,)

    def refusal_is_final(self, address: str) -> bool:
        # As in production, where a host's procs talk over unix sockets (a refusal: the
        # proc is gone) and hosts over tcp (something in between may be restarting).
        return _parse(address)[0] == self.host

    def __init__(
        self,
        net: SimNetwork,
        host: str,
        index: int,
        max_frame_bytes: int,
    ) -> None:
        self.host = host
        self.name = f"sim transport {host}#{index}"
        self._net = net
        self._max_frame_bytes = max_frame_bytes
        self._heap: list[_Entry] = []
        self._wakeup = trio.Event()
        #: Entries of this transport in the network's heap (when it delivers for all).
        self._queued = 0
        #: The context of the process that made it: its sinks run in it (the current
        #: runtime, among others), whichever task delivers.
        self._context = contextvars.copy_context()
        self._dead = False
        #: Until when the process behind this transport is paused (see SimNetwork.pause).
        self._paused_until = -math.inf
        #: Open ends on this side, by (wire id, side): insertion order is creation order.
        self._ends: dict[tuple[int, int], SimConnection] = {}
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.get_ident()
        #: Addresses it listens on (so a process's end need not scan every listener).
        self._listening: dict[str, None] = {}

    @property
    def paused_until(self) -> float:
        """Virtual time the process behind this transport resumes (past: not paused)."""
        return self._paused_until

    async def listen(self, address: str, sinks: SinkFactory) -> Listener:
        host, name = _parse(address)
        if host != self.host:
            raise ValueError(
                f"a sim transport on host {self.host!r} can only listen on "
                f"sim://{self.host}/NAME (got {address!r})"
            )
        net = self._net
        if host in net._crashed:
            raise OSError(f"cannot listen on {address}: host {host!r} has crashed")
        if self._dead:
            raise OSError(f"cannot listen on {address}: {self.name} has stopped")
        if not name:
            while True:
                net._names[host] = net._names.get(host, 0) + 1
                address = f"{SCHEME}://{host}/{net._names[host]}"
                if address not in net._listeners:
                    break
        elif address in net._listeners:
            raise OSError(f"sim address already in use: {address}")
        listener = SimListener(address, self, sinks)
        net._listeners[address] = listener
        self._listening[address] = None
        net._record("listen", address)
        await trio.lowlevel.checkpoint()
        return listener

    async def connect(self, address: str, sink: FrameSink) -> Connection:
        """Dial ``address``: a round trip of drawn latency, then the connection.

        Raises :class:`ConnectionBroken` naming the address when nothing listens there (after
        the round trip) or when the far host cannot be reached (partitioned or crashed: after
        the network's ``connect_timeout``).
        """
        host, _ = _parse(address)
        net = self._net
        me = self.host
        if me in net._crashed:
            raise ConnectionBroken(f"cannot connect to {address}: host {me!r} has crashed")
        if self._dead:
            raise ConnectionBroken(f"cannot connect to {address}: {self.name} has stopped")
        if self._paused_until > trio.current_time():
            await trio.sleep_until(self._paused_until)  # a paused process dials on resume
        start = trio.current_time()
        arrive = max(start + net._draw_latency(me, host), net._held_until(me, host))
        if not net._reachable(me, host):
            await self._give_up(address, start)
        await trio.sleep_until(arrive)
        if not net._reachable(me, host):
            await self._give_up(address, start)
        if net._refusing.get(_pair(me, host), -math.inf) > trio.current_time():
            await trio.sleep(net._draw_latency(host, me))
            net._record("connect_failed", f"{me}->{address} refused in between")
            raise ConnectionRefused(
                f"cannot connect to {address}: refused by what is between hosts {me!r} and "
                f"{host!r} (restarting)"
            )
        listener = net._listeners.get(address)
        if listener is None:
            await trio.sleep(net._draw_latency(host, me))
            net._record("connect_failed", f"{me}->{address} nothing listens")
            raise ConnectionRefused(f"cannot connect to {address}: nothing listens there")
        now = trio.current_time()
        wire = net._new_wire(self, listener, sink)
        net._record("connect", f"c{wire.id} {me}->{address}")
        dialer = wire.ends[0]
        # The answer arrives at `established`; so does anything the acceptor sends at once.
        established = now + net._draw_latency(host, me)
        dialer._last_at = established
        try:
            listener._transport._push(now, None, wire.ends[1], _ACCEPT, listener)
            with trio.move_on_at(start + net.connect_timeout):
                await wire.accepted.wait()
            if not wire.accepted.is_set():
                net._break(wire, "the listener did not accept in time")
            elif wire.ends[1].sink is None:
                net._break(wire, "the listening process exited before it accepted")
            else:
                await trio.sleep_until(established)
        except BaseException:
            dialer._muted = True
            net._break(wire, "the dialer gave up")
            raise
        if dialer._closed:
            dialer._muted = True
            raise ConnectionBroken(f"cannot connect to {address}: {dialer._error}")
        dialer._pending = False
        for entry in dialer._parked:
            self._push(*entry)
        dialer._parked.clear()
        return dialer

    async def _give_up(self, address: str, start: float) -> None:
        net = self._net
        await trio.sleep_until(start + net.connect_timeout)
        net._record("connect_failed", f"{self.host}->{address} unreachable")
        raise ConnectionBroken(
            f"cannot connect to {address}: timed out after {net.connect_timeout} virtual "
            f"seconds (host {_parse(address)[0]!r} is partitioned from {self.host!r} or crashed)"
        )

    def _push(
        self, at: float, seq: int | None, end: SimConnection, kind: int, payload: Any
    ) -> None:
        """Schedule an entry; ``seq`` is None for a new one, given for one put back.

        An entry put back keeps its sequence number. Hold times only grow (clogs extend, never
        shrink), so with the original numbers an earlier frame of a connection always sorts
        before a later one, however often either is held; fresh numbers would let a frame
        held twice fall behind one held once.
        """
        if self._dead:
            return
        if seq is None:
            seq = next(self._net._seq)
        net = self._net
        if net._delivering:
            self._queued += 1
            heapq.heappush(net._heap, (at, seq, end, kind, payload, self))
            if net._heap[0][1] == seq:
                net._wakeup.set()
            return
        heapq.heappush(self._heap, (at, seq, end, kind, payload))
        if self._heap[0][1] == seq:
            self._wakeup.set()

    async def _run(self) -> None:
        """Deliver due entries forever, oldest first; on the way out, act as a dead process.
        (With the network's one delivery task running, it only waits for the way out.)"""
        heap = self._heap
        try:
            if self._net._delivering:
                await trio.sleep_forever()
            while True:
                now = trio.current_time()
                if self._paused_until > now:
                    # A paused process takes nothing in: what is due waits, in order.
                    await trio.sleep_until(self._paused_until)
                    continue
                batch: list[_Entry] = []
                while heap and heap[0][0] <= now:
                    batch.append(heapq.heappop(heap))
                if batch:
                    for entry in batch:
                        try:
                            self._dispatch(entry)
                        except Exception:
                            log.exception("%s: a sink callback failed", self.name)
                    await trio.lowlevel.checkpoint()
                    continue
                self._wakeup = trio.Event()
                with trio.move_on_at(heap[0][0] if heap else math.inf):
                    await self._wakeup.wait()
        finally:
            self._net._transport_gone(self)

    def _dispatch(self, entry: _Entry) -> None:
        _, seq, end, kind, payload = entry
        net = self._net
        if kind == _LOST:
            net._report(end)
            return
        if kind == _ACCEPT:
            self._accept(end, payload)
            return
        label = f"{end._label(towards_me=True)} {'fin' if kind == _FIN else f'#{payload[0]}'}"
        if end._closed:
            net._record("drop", label)
            return
        if end._pending:
            # Due no earlier than the moment connect() returns, but its task has not run yet.
            end._parked.append(entry)
            return
        src, dst = end.other.host, end.host
        now = trio.current_time()
        held = net._held_until(src, dst)
        if held > now:
            net._record("hold", f"{label} until {held:.9f}")
            self._push(held, seq, end, kind, payload)
            return
        if net._blocked(src, dst):
            net._record("drop", f"{label} partitioned")
            net._break(end._wire, f"a frame from {src!r} to {dst!r} was lost to a partition")
            return
        if kind == _FIN:
            if end._arrived(kind, payload):
                net._record("fin_unread", label)
                return
            net._mark_closed(end, end._broken(payload))
            net._record("fin", label)
            net._report(end)
            return
        frame = payload[1]
        size = memoryview(frame).nbytes
        if size > self._max_frame_bytes:
            net._fail(
                end,
                end._broken(
                    f"frame of {size} bytes exceeds max_frame_bytes={self._max_frame_bytes}"
                ),
            )
            return
        net._record("deliver", f"{label} {size}B")
        if end._arrived(kind, payload):
            return  # a thread reads it (sim/_leading.py), or the loop once it takes it back
        end._step(_baton.LOOP_WAKES)
        self._hand_to_sink(end, frame)
        end._step(_baton.LOOP_WAITS)

    def _hand_to_sink(self, end: SimConnection, frame: Any) -> None:
        """The loop hands a frame to ``end``'s sink (a bad one fails the connection)."""
        assert end.sink is not None
        try:
            end.sink.frame_received(end, memoryview(frame))
        except Exception as exc:
            log.error("closing sim connection to %s after bad frame: %r", end.peer, exc)
            self._net._fail(end, exc)

    def _accept(self, end: SimConnection, listener: SimListener) -> None:
        wire = end._wire
        if end._closed:
            return
        try:
            end.sink = listener._sinks(end)
        except Exception as exc:
            log.exception("no handler for sim connection from %s", end.peer)
            net = self._net
            net._mark_closed(end, exc)
            net._break(wire, f"the listener at {listener.address} failed to accept: {exc!r}")
            return
        self._net._record("accept", f"c{wire.id} {listener.address}")
        wire.accepted.set()


class SimNetwork:
    """Every link between the hosts of one simulated cluster, and its faults.

    Lives inside one ``trio.run`` (normally on ``MockClock(autojump_threshold=0)``; see
    :func:`regency.sim.run_deterministic`). Every decision it makes is drawn from ``rng`` and
    recorded in ``trace`` (by default the current run's trace, else a private one), together
    with an event for everything that happens to a frame, connection or link. Not thread-safe:
    only ``send_nowait`` may be called from another thread.

    Random faults at the ``faults`` rates are only drawn while :meth:`run_faults` runs.
    ``connect_timeout`` is how long a dial into a partition or a crashed host takes to fail.
    """

    def __init__(
        self,
        rng: random.Random,
        faults: Faults | None = None,
        *,
        latency: Latency | None = None,
        connect_timeout: float = 1.0,
        trace: Trace | None = None,
    ) -> None:
        if not isinstance(rng, random.Random):
            raise TypeError(f"rng must be a seeded random.Random (got {type(rng).__name__})")
        if not (math.isfinite(connect_timeout) and connect_timeout > 0):
            raise ValueError(
                f"connect_timeout must be a positive number of virtual seconds "
                f"(got {connect_timeout!r})"
            )
        self.faults = faults if faults is not None else Faults()
        self.connect_timeout = connect_timeout
        self.trace = trace if trace is not None else (current_trace() or Trace())
        self._rng = rng
        self._latency = latency if latency is not None else Latency()
        self._links: dict[tuple[str, str], Latency] = {}
        self._hosts: dict[str, None] = {}  # an ordered set
        self._transports = 0
        self._names: dict[str, int] = {}
        self._listeners: dict[str, SimListener] = {}
        self._wires: dict[int, _Wire] = {}  # live wires (an end still open), in id order
        self._wire_ids = itertools.count(1)
        self._seq = itertools.count()
        self._cuts: list[_Cut] = []
        self._last_cut = 0
        self._slowdowns: list[_Slowdown] = []
        self._clogs: dict[str, float] = {}
        #: Host pairs whose dials are refused until a time (``disconnect(refuse_for=)``).
        self._refusing: dict[tuple[str, str], float] = {}
        self._crashed: set[str] = set()  # membership only: never iterated
        #: Transports whose process runs, by name (in creation order).
        self._live: dict[str, SimTransport] = {}
        #: Set by :meth:`deliver`: one task delivers for every transport, from one heap.
        self._delivering = False
        self._heap: list[tuple[float, int, SimConnection, int, Any, SimTransport]] = []
        self._wakeup = trio.Event()

    # -- public ---------------------------------------------------------------------------

    @property
    def events(self) -> list[SimEvent]:
        """The event log this network records into (shared with its trace)."""
        return self.trace.events

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host a transport was made for, sorted."""
        return tuple(sorted(self._hosts))

    def transport(
        self,
        host: str,
        nursery: trio.Nursery,
        *,
        secret: bytes | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> SimTransport:
        """A transport for one simulated process on ``host``, its task in ``nursery``.

        ``secret`` is accepted so the call lines up with the other backends and ignored: no
        handshake is needed between simulated processes in one Python process. Frames larger
        than ``max_frame_bytes`` break the connection at the receiver, as on sockets.
        """
        del secret
        if not host or "/" in host or ":" in host:
            raise ValueError(f"sim host names must be non-empty without '/' or ':' (got {host!r})")
        if host in self._crashed:
            raise RuntimeError(
                f"host {host!r} has crashed; call restart_host({host!r}) before starting "
                "processes on it"
            )
        self._hosts.setdefault(host)
        self._transports += 1
        transport = SimTransport(self, host, self._transports, max_frame_bytes)
        self._live[transport.name] = transport
        # start_soon copies the calling context: the sinks run with the process's context.
        nursery.start_soon(transport._run, name=transport.name)
        self._record("transport", transport.name)
        return transport

    def set_latency(
        self, base: float, jitter: float = 0.0, *, between: tuple[str, str] | None = None
    ) -> None:
        """Set the one-way latency of every link, or of the link ``between`` two hosts.

        Applies to frames sent from now on; a link set explicitly keeps its own latency when
        the default changes.
        """
        latency = Latency(base, jitter)
        if between is None:
            self._latency = latency
            self._record("latency", f"* base={base} jitter={jitter}")
        else:
            self._links[_pair(*between)] = latency
            self._record("latency", f"{'|'.join(_pair(*between))} base={base} jitter={jitter}")

    def partition(
        self,
        a_hosts: Iterable[str],
        b_hosts: Iterable[str],
        one_way: bool = False,
        *,
        duration: float = math.inf,
    ) -> int:
        """Cut ``a_hosts`` from ``b_hosts`` for ``duration`` virtual seconds; return its id.

        Every existing connection across the cut breaks at once (both ends see
        ``connection_lost``), and dialing across it fails after ``connect_timeout``. With
        ``one_way`` only frames from ``a_hosts`` to ``b_hosts`` are lost: a ``b`` host can
        still dial an ``a`` host and send to it, and such a connection breaks when it loses
        its first frame towards ``b``. An empty side or a zero duration is no fault (and
        returns 0). The cut ends by itself after ``duration``, or with :meth:`heal`.
        """
        a, b = frozenset(a_hosts), frozenset(b_hosts)
        if a & b:
            raise ValueError(f"partition sides must not share hosts (both have {sorted(a & b)!r})")
        if not a or not b or not duration > 0:
            return 0
        self._last_cut += 1
        cut = _Cut(self._last_cut, a, b, one_way, trio.current_time() + duration)
        self._cuts.append(cut)
        self._record(
            "partition",
            f"#{cut.id} {_hosts_text(a)} {'->' if one_way else '|'} {_hosts_text(b)} "
            f"until {cut.until:.9f}",
        )
        for wire in list(self._wires.values()):
            if cut.crosses(*wire.hosts()):
                self._break(wire, f"hosts {_hosts_text(a)} were partitioned from {_hosts_text(b)}")
        return cut.id

    def heal(self, cut: int | None = None) -> None:
        """End partition ``cut`` (an id from :meth:`partition`), or every partition and delay.

        ``heal(0)`` heals nothing: 0 is what a partition that was no fault returns. Clogs are
        not healed: they end by themselves. Broken connections stay broken.
        """
        if cut is None:
            self._cuts.clear()
            self._slowdowns.clear()
            self._record("heal", "*")
            return
        if cut == 0:
            return
        if not 0 < cut <= self._last_cut:
            raise LookupError(f"no partition with id {cut} (ids come from partition())")
        self._cuts = [c for c in self._cuts if c.id != cut]
        self._record("heal", f"#{cut}")

    def disconnect(self, host_a: str, host_b: str, refuse_for: float = 0.0) -> int:
        """Break every connection between two hosts (both ends told); return how many.

        With ``refuse_for``, dials between the two are refused for that many virtual seconds
        after (what a relay, proxy or load balancer in between does while it restarts):
        across hosts a refusal may pass (``SimTransport.refusal_is_final``)."""
        broken = 0
        for wire in list(self._wires.values()):
            if _pair(*wire.hosts()) == _pair(host_a, host_b):
                self._break(wire, f"hosts {host_a!r} and {host_b!r} were disconnected")
                broken += 1
        refusing = ""
        if refuse_for > 0:
            until = trio.current_time() + refuse_for
            pair = _pair(host_a, host_b)
            self._refusing[pair] = max(self._refusing.get(pair, -math.inf), until)
            refusing = f", refusing until {self._refusing[pair]:.9f}"
        self._record("disconnect", f"{host_a}|{host_b} broke {broken}{refusing}")
        return broken

    def clog(self, host: str, duration: float) -> None:
        """Hold every frame from and to ``host`` for ``duration``, then deliver them in order.

        Frames already in flight are held too; dials to and from the host arrive after the
        clog. A zero duration is no fault.
        """
        if not duration > 0:
            return
        until = trio.current_time() + duration
        self._clogs[host] = max(self._clogs.get(host, -math.inf), until)
        self._record("clog", f"{host} until {self._clogs[host]:.9f}")

    def delay(self, host_a: str, host_b: str, extra: float, duration: float) -> None:
        """Add ``extra`` seconds to the latency between two hosts for ``duration``.

        Order per connection still holds. A zero ``extra`` or ``duration`` is no fault.
        """
        if not (extra > 0 and duration > 0):
            return
        until = trio.current_time() + duration
        self._slowdowns.append(_Slowdown(_pair(host_a, host_b), extra, until))
        self._record("delay", f"{'|'.join(_pair(host_a, host_b))} +{extra} until {until:.9f}")

    def crash_host(self, host: str) -> None:
        """Crash ``host``: its listeners vanish and every connection to it breaks.

        Dials to it fail after ``connect_timeout``; its own transports can no longer listen or
        dial. Stopping its processes is the launcher's job, not the network's.
        """
        self._record("crash", host)
        self._crashed.add(host)
        for listener in list(self._listeners.values()):
            if listener._transport.host == host:
                self._unlisten(listener, "unlisten")
        for wire in list(self._wires.values()):
            if host in wire.hosts():
                self._break(wire, f"host {host!r} crashed")

    def pause(self, transport: SimTransport, duration: float, label: str = "") -> None:
        """Pause the process behind ``transport`` for ``duration`` virtual seconds.

        Nothing is delivered to it meanwhile (frames, FINs, lost-connection notices and
        accepts wait, in order) and what it sends or dials leaves when it resumes; its
        connections stay up. Its timers keep running, as a stopped process finds them all due
        when it continues. A zero duration is no fault; pauses extend, never shorten.
        """
        if not duration > 0 or transport._dead:
            return
        until = trio.current_time() + duration
        transport._paused_until = max(transport._paused_until, until)
        transport._wakeup.set()
        self._record("pause", f"{label or transport.name} until {transport._paused_until:.9f}")

    def restart_host(self, host: str) -> None:
        """Let a crashed ``host`` take new transports again (its old state is gone)."""
        self._crashed.discard(host)
        self._record("restart", host)

    def start_delivery(self, nursery: trio.Nursery) -> None:
        """Deliver due entries of every transport from one task in ``nursery`` (which must
        outlive the transports), instead of a task per transport: what a large simulation
        spends its time on is waking tasks. Call it before the first transport is made.
        Each transport's entries are still handed over in (time, sequence) order, and a
        paused process's entries wait, in order, until it resumes."""
        if self._transports:
            raise RuntimeError("start_delivery() must come before the first transport is made")
        self._delivering = True
        nursery.start_soon(self._deliver_all, name="sim network delivery")

    async def _deliver_all(self) -> None:
        heap = self._heap
        while True:
            now = trio.current_time()
            batch = []
            while heap and heap[0][0] <= now:
                batch.append(heapq.heappop(heap))
            if batch:
                for at, seq, end, kind, payload, transport in batch:
                    transport._queued -= 1
                    if transport._dead:
                        continue
                    if transport._paused_until > now:
                        # A paused process takes nothing in: it waits, keeping its order.
                        transport._queued += 1
                        heapq.heappush(heap, (transport._paused_until, seq, end, kind, payload,
                                              transport))
                        continue
                    try:
                        transport._context.run(transport._dispatch, (at, seq, end, kind, payload))
                    except Exception:
                        log.exception("%s: a sink callback failed", transport.name)
                await trio.lowlevel.checkpoint()
                continue
            self._wakeup = trio.Event()
            with trio.move_on_at(heap[0][0] if heap else math.inf):
                await self._wakeup.wait()

    def quiet(self, now: float) -> bool:
        """Nothing in flight and no fault in force: no frame, FIN, accept or loss waits to
        be delivered, no dial is pending, no process is paused, and no partition, delay or
        clog holds. What happens next on such a network is only what is sent next."""
        if self._cuts or any(s.until > now for s in self._slowdowns):
            return False
        if any(until > now for until in self._clogs.values()):
            return False
        for transport in self._live.values():
            if transport._heap or transport._queued or transport._paused_until > now:
                return False
            if any(end._pending or end._parked for end in transport._ends.values()):
                return False
        return True

    def base_latency(self, src: str, dst: str) -> float:
        """The one-way latency between two hosts without jitter (what a frame takes at
        least)."""
        return self._links.get(_pair(src, dst), self._latency).base

    def max_latency(self) -> float:
        """The longest one-way latency any link may draw (base plus jitter)."""
        links = [self._latency, *self._links.values()]
        return max(link.base + link.jitter for link in links)

    def apply(self, fault: ScheduledFault) -> None:
        """Apply one explicit link fault now (its ``at`` is ignored); a process fault is the
        cluster's and does nothing here."""
        if isinstance(fault, ProcFault):
            return
        if isinstance(fault, PartitionFault):
            self.partition(fault.a_hosts, fault.b_hosts, fault.one_way, duration=fault.duration)
        elif isinstance(fault, DisconnectFault):
            self.disconnect(fault.host_a, fault.host_b, fault.refuse_for)
        elif isinstance(fault, ClogFault):
            self.clog(fault.host, fault.duration)
        elif isinstance(fault, DelayFault):
            self.delay(fault.host_a, fault.host_b, fault.extra, fault.duration)
        else:
            self.crash_host(fault.host)

    async def run_faults(
        self,
        schedule: Iterable[ScheduledFault] = (),
        *,
        apply: Callable[[ScheduledFault], None] | None = None,
    ) -> None:
        """Inject link faults until cancelled: ``schedule`` at its times, and random ones.

        Times in ``schedule`` count from the call. Random link faults are drawn at the rates
        of ``faults`` (returns once the schedule is done when every link rate is zero). Each
        fault, scheduled or drawn, is handed to ``apply`` (by default :meth:`apply`, which
        skips process faults: they are the cluster's); a simulated cluster passes its own,
        which makes the same call a program makes (``regency.sim.current().partition(...)``
        and so on). Run it in a nursery and cancel it to stop injecting; then :meth:`heal` to
        end what is in force.
        """
        if apply is None:
            apply = self.apply
            schedule = [f for f in schedule if not isinstance(f, ProcFault)]
        faults = sorted(schedule, key=lambda f: f.at)  # stable: ties keep schedule order
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            if faults:
                nursery.start_soon(
                    self._run_schedule, faults, start, apply, name="sim fault schedule"
                )
            if self.faults.link_rate > 0:
                nursery.start_soon(self._run_random, start, apply, name="sim random faults")

    # -- fault drivers --------------------------------------------------------------------

    async def _run_schedule(
        self,
        faults: list[ScheduledFault],
        start: float,
        apply: Callable[[ScheduledFault], None],
    ) -> None:
        for fault in faults:
            await trio.sleep_until(start + fault.at)
            apply(fault)

    async def _run_random(self, start: float, apply: Callable[[ScheduledFault], None]) -> None:
        """Draw random link faults at the rates of ``faults``; each becomes a fault record
        (its ``at`` counted from ``start``) that ``apply`` applies, as a scheduled one."""
        rates = self.faults
        total = rates.link_rate
        while True:
            await trio.sleep(self._draw("fault.wait", self._rng.expovariate(total)))
            pick = self._draw("fault.kind", self._rng.random() * total)
            at = trio.current_time() - start
            fault: LinkFault | None
            if pick < rates.delay:
                fault = self._random_delay(at)
            elif pick < rates.delay + rates.disconnect:
                fault = self._random_disconnect(at)
            elif pick < rates.delay + rates.disconnect + rates.partition:
                fault = self._random_partition(at)
            else:
                fault = self._random_clog(at)
            if fault is not None:
                apply(fault)

    def _random_duration(self) -> float:
        mean = self.faults.mean_duration
        if mean <= 0:
            return 0.0
        return self._draw("fault.duration", self._rng.expovariate(1 / mean))

    def _random_host(self, label: str) -> str | None:
        hosts = self.hosts
        if not hosts:
            return None
        return self._draw(label, hosts[self._rng.randrange(len(hosts))])

    def _random_delay(self, at: float) -> DelayFault | None:
        a, b = self._random_host("fault.delay.a"), self._random_host("fault.delay.b")
        if a is None or b is None:
            return None
        extra = self._draw("fault.delay.extra", self._rng.random() * self.faults.max_delay)
        return DelayFault(at, a, b, extra, self._random_duration())

    def _random_disconnect(self, at: float) -> DisconnectFault | None:
        wires = list(self._wires.values())
        if not wires:
            self._record("disconnect", "(no connections)")
            return None
        wire = wires[self._draw("fault.disconnect", self._rng.randrange(len(wires)))]
        return DisconnectFault(at, *wire.hosts())

    def _random_partition(self, at: float) -> PartitionFault | None:
        hosts = list(self.hosts)
        if len(hosts) < 2:
            return None
        self._rng.shuffle(hosts)
        self._draw("fault.partition.order", tuple(hosts))
        k = self._draw("fault.partition.split", self._rng.randrange(1, len(hosts)))
        one_way = self._draw("fault.partition.one_way", self._rng.random() < 0.5)
        return PartitionFault(
            at, self._random_duration(), tuple(hosts[:k]), tuple(hosts[k:]), one_way
        )

    def _random_clog(self, at: float) -> ClogFault | None:
        host = self._random_host("fault.clog")
        if host is None:
            return None
        return ClogFault(at, host, self._random_duration())

    # -- internals used by transports and connections --------------------------------------

    def _draw(self, label: str, value: V) -> V:
        self.trace.record_draw(label, value)
        return value

    def _record(self, kind: str, detail: str) -> None:
        self.trace.record_event(kind, detail)

    def _draw_latency(self, src: str, dst: str) -> float:
        pair = _pair(src, dst)
        latency = self._links.get(pair, self._latency)
        delay = latency.base
        if latency.jitter:
            delay += self._draw("latency", self._rng.random() * latency.jitter)
        if self._slowdowns:
            now = trio.current_time()
            self._slowdowns = [s for s in self._slowdowns if s.until > now]
            delay += sum(s.extra for s in self._slowdowns if s.pair == pair)
        return delay

    def _blocked(self, src: str, dst: str) -> bool:
        if not self._cuts:
            return False
        now = trio.current_time()
        self._cuts = [c for c in self._cuts if c.until > now]
        return any(c.blocks(src, dst) for c in self._cuts)

    def _reachable(self, src: str, dst: str) -> bool:
        return dst not in self._crashed and not self._blocked(src, dst)

    def _held_until(self, src: str, dst: str) -> float:
        if not self._clogs:
            return -math.inf
        return max(self._clogs.get(src, -math.inf), self._clogs.get(dst, -math.inf))

    def _new_wire(self, dialer: SimTransport, listener: SimListener, sink: FrameSink) -> _Wire:
        wire = _Wire(next(self._wire_ids))
        acceptor = listener._transport
        wire.ends = (
            SimConnection(wire, 0, dialer, listener.address, sink),
            SimConnection(wire, 1, acceptor, f"sim://{dialer.host} (connection {wire.id})", None),
        )
        wire.ends[0]._pending = True
        dialer._ends[(wire.id, 0)] = wire.ends[0]
        acceptor._ends[(wire.id, 1)] = wire.ends[1]
        self._wires[wire.id] = wire
        return wire

    def _transmit(self, src: SimConnection, kind: int, payload: Any) -> None:
        """Send a frame or FIN from ``src`` to its other end, after a drawn latency, in order."""
        dst = src.other
        now = max(trio.current_time(), src._transport._paused_until)  # a paused sender's
        at = max(now + self._draw_latency(src.host, dst.host), dst._last_at)  # frames wait
        dst._last_at = at
        if kind == _FRAME:
            index = src._sent
            src._sent += 1
            dst._transport._push(at, None, dst, kind, (index, payload))
            size = memoryview(payload).nbytes
            self._record("send", f"{src._label(towards_me=False)} #{index} {size}B at {at:.9f}")
        else:
            dst._transport._push(at, None, dst, kind, payload)
            self._record("send_fin", f"{src._label(towards_me=False)} at {at:.9f}")

    def _mark_closed(self, end: SimConnection, error: BaseException | None) -> None:
        end._closed = True
        end._error = error
        end._parked.clear()
        end._unread.clear()  # lost with the connection, as frames still on their way
        end._watched.wake()  # a thread that leads it hands it back
        end._transport._ends.pop((end._wire.id, end._side), None)
        if end.other._closed:
            self._wires.pop(end._wire.id, None)
        # A dialer waiting for the accept must not wait for one that can no longer come.
        end._wire.accepted.set()

    def _report(self, end: SimConnection) -> None:
        """Tell ``end``'s sink the connection is gone, once; nothing reaches it afterwards."""
        if end._reported or end._muted or end._pending or end.sink is None:
            return
        end._reported = True
        end.sink.connection_lost(end, end._error)

    def _break(self, wire: _Wire, reason: str) -> None:
        """Something outside broke ``wire``: close both ends now, tell each sink soon."""
        self._record("break", f"c{wire.id} {'|'.join(wire.hosts())}: {reason}")
        now = trio.current_time()
        for end in wire.ends:
            if not end._closed:
                self._mark_closed(end, end._broken(reason))
                end._transport._push(now, None, end, _LOST, None)
        wire.accepted.set()

    def _fail(self, end: SimConnection, error: BaseException) -> None:
        """This end gave up on a bad frame: close it, tell its sink now, tell the peer later."""
        self._mark_closed(end, error)
        self._record("fail", f"{end._label(towards_me=True)}: {error!r}")
        if not end.other._closed:
            self._transmit(end, _FIN, f"sim://{end.host} closed the connection: {error!r}")
        self._report(end)

    def _unlisten(self, listener: SimListener, kind: str) -> None:
        if self._listeners.get(listener.address) is listener:
            del self._listeners[listener.address]
            listener._transport._listening.pop(listener.address, None)
            self._record(kind, listener.address)

    def _transport_gone(self, transport: SimTransport) -> None:
        """The process behind ``transport`` ended: drop its listeners, FIN its peers.

        Its own sinks are not told (the process is gone), as when the kernel closes the
        sockets of a killed process.
        """
        transport._dead = True
        self._live.pop(transport.name, None)
        self._record("transport_gone", transport.name)
        for address in list(transport._listening):
            listener = self._listeners.get(address)
            if listener is not None and listener._transport is transport:
                self._unlisten(listener, "unlisten")
        for end in list(transport._ends.values()):
            self._mark_closed(
                end,
                ConnectionClosed(f"connection to {end.peer} is closed: {transport.name} stopped"),
            )
            end._reported = True
            if not end.other._closed:
                self._transmit(end, _FIN, f"the process at sim://{end.host} exited")
        transport._heap.clear()
