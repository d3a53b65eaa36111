"""A thread that waits for a reply reads it itself (leader/follower).

Without this, a reply to a thread blocked in ``Future.get()`` costs two wake-ups: the kernel
wakes the runtime's trio loop, which reads and dispatches the frame, then releases the lock
the thread sleeps on, and the thread wakes (about 20-30 us a hop on this machine, plus the
loop's own round). Instead, a thread about to block takes over reading the runtime's
inbound connections while the loop is idle on them (``SocketConnection.lead``: the loop's
interest in those sockets is silenced, not woken), polls them itself, and hands each whole
frame to the same sink code the loop runs (``InboundSink.frame_on_thread``), under the
runtime's dispatch lock. Only replies (to ports that take them off the loop) and calls to
actors with a thread are handled on the thread; any other frame, a frame too
big for the buffer, end of stream or an error hands that connection back to the loop at
once, unconsumed, so the loop handles it in order. When the future resolves (by a frame this
thread read, or by the loop: a reply on another connection, a lost link, a stop) the thread
gives every connection back; the loop is woken only where bytes are left for it. A thread
that sent a call to several ranks (``Leader.sending``) sets them aside for the ``get()``
that follows instead, and that wait for the next fan-out (``Leader._hold``: still silenced,
any thread may lead them again without a syscall), as does a wait for one rank's reply that
led that proc's connection alone, for the next call's reply (which the loop then cannot
read before the caller waits for it); the loop takes them back if no thread comes for
them, and at once when a thread waits for the loop to read for it.

Guarantees kept: frames of one connection are handled in order by exactly one reader at a
time (the connection's baton); the delivery session's numbering and acknowledgements run in
the sink as before; a proc that dies ends the stream, which hands the connection back to the
loop, whose reader reports the loss and fails the future (the thread's doorbell wakes it);
``get(timeout)`` polls with the time left and raises ``TimeoutError`` as before.

The Leader is production's :class:`~regency.core._waiting.Waiter` (the environment gives
it to a runtime with ``thread_reads`` on); the simulator's threads wait in lockstep with
their own waiter.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import select
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ._future import Future
from ._inbound import deferred
from ._messages import Call as _Call
from ._replies import OneReply
from ._spin import SpinPolicy, cpu_gauge, spin_limit
from ._waiting import block, blocked_in, here, served

if TYPE_CHECKING:
    from ._runtime import Runtime

#: A thread leads at most this many connections (one poll over them); beyond that it waits
#: on its lock, as every thread did before.
MAX_LED = 16
#: Seconds a connection a thread set aside (``SocketConnection.hold``) may stay away from
#: the loop once no thread sets it aside again: the loop takes it back between one and two
#: of these later (while threads go on setting connections aside, it costs one loop wake-up
#: per ``HOLD``). Frames for the loop on it wait that long at most, also while a thread
#: goes on calling other procs, and only while no thread waits on its lock for the loop
#: (such a thread takes them all back at once).
HOLD = 0.01
#: Poll sets a thread keeps (one per set of connections it led).
_POLL_SETS = 8
#: Procs whose reply connection a runtime remembers (beyond that it forgets them all).
_KNOWN_PROCS = 4096


_get_ident = threading.get_ident


class _Here(threading.local):
    declined = 0


_here = _Here()


@contextlib.contextmanager
def loop_reads() -> Iterator[None]:
    """Inside the block this thread reads nothing itself: what it waits for is read, decoded
    and resolved on the loop, as with ``thread_reads=False``. For code that changes how this
    thread unpickles (the tensor engine's active mesh is a torch dispatch mode on the thread:
    tensors in a reply must not be rebuilt under it)."""
    _here.declined += 1
    try:
        yield
    finally:
        _here.declined -= 1


class Bell:
    """A thread's doorbell: an eventfd it polls beside the sockets it leads."""

    __slots__ = ("fd", "owner")

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.owner = threading.get_ident()

    def ring(self) -> None:
        if threading.get_ident() != self.owner:  # the owner is awake: it checks the future
            os.eventfd_write(self.fd, 1)

    def drain(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass

    def __del__(self) -> None:
        os.close(self.fd)


class Polling(Protocol):
    """The leader's I/O and blocking, injected (the environment's): production's polls
    descriptors with ``select.poll`` and rings an ``eventfd``; the simulator's
    (``regency.sim._leading``) waits in lockstep with its loop, in virtual time, on the
    simulated network's connections."""

    #: Whether a waiting thread may spin before it sleeps (core/_spin.py).
    spins: bool
    #: Whether its threads run freely (False: in lockstep with a simulation's loop).
    runs_freely: bool

    def bell(self) -> Any:
        """A new doorbell for the calling thread: ``fd``, ``owner``, ``ring()``,
        ``drain()``."""
        ...

    def poller(self) -> Any:
        """A new poll set: ``register(fd, mask)``, ``unregister(fd)``, ``poll(ms)`` (a list
        of ``(fd, events)``; ``ms`` None waits until something is ready, 0 not at all)."""
        ...

    def block(self, fut: Future[Any], timeout: float | None) -> None:
        """Wait for ``fut`` while the loop reads for this thread (``TimeoutError``)."""
        ...

    def wait_on_loop(self, fut: Future[Any]) -> Awaitable[None]:
        """``await fut`` on this thread's event loop."""
        ...

    def monotonic(self) -> float:
        """Seconds, for deadlines."""
        ...


class OsPolling:
    """Production's: ``select.poll`` over the sockets and an ``eventfd`` doorbell."""

    spins = True
    runs_freely = True
    bell = Bell
    poller = staticmethod(select.poll)
    block = staticmethod(block)
    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def wait_on_loop(fut: Future[Any]) -> Awaitable[None]:
        return fut.wait_on_loop()


OS_POLLING = OsPolling()


class _Reading:
    """What one thread keeps between the waits in which it reads: its doorbell, and the
    poll set of the connections it led last time with that bell (kept while the same
    connections are led again, which is the common case: a wait costs no poll set).
    A plain object, one per thread (``Leader._reading``): a wait reads the thread-local
    once, then these fields as plain attributes (each field of a ``threading.local`` costs
    a per-thread dictionary lookup)."""

    __slots__ = ("bell", "callee_spinner", "fanned_out", "poller", "sets", "spinner")

    def __init__(self) -> None:
        self.bell: Bell | None = None
        #: How this thread spins before it sleeps when it waits as a caller (``Future.get``;
        #: core/_spin.py).
        self.spinner: SpinPolicy | None = None
        #: How it spins waiting for its next call as an actor thread (``callee``): a
        #: policy of its own, so that the waits of the endpoint's own calls, which sleep at
        #: once on a crowded machine and count as misses, do not stop it.
        self.callee_spinner: SpinPolicy | None = None
        #: The poll set this thread used last (tests look at it).
        self.poller: Any = None
        #: Poll sets by the connections they poll (besides the bell): (poller, its fd map).
        #: A few are kept: a thread that calls several procs in turn leads one connection
        #: for each call (:meth:`Leader.wait`), and reuses that connection's set.
        self.sets: dict[tuple[Any, ...], tuple[Any, dict[int, Any]]] = {}
        #: This thread's last fan-out set its connections aside and no wait has come
        #: since: that wait (its ``get()``, mostly) sets them aside again for the next
        #: fan-out.
        self.fanned_out = False


class _Threads(threading.local):
    reading: _Reading | None = None


class Leader:
    """One runtime's side of leader/follower: the :class:`~regency.core._waiting.Waiter`
    of its threads, and of the process's other threads while it serves (production's; the
    simulator's, on lockstep I/O, serves only the simulation's threads)."""

    def __init__(self, runtime: Runtime, polling: Polling = OS_POLLING) -> None:
        self._rt = runtime
        self._polling = polling
        self._monotonic = polling.monotonic
        #: (The Waiter's: core/_waiting.py.)
        self.runs_freely = self.serves_any_thread = polling.runs_freely
        self._threads = _Threads()
        #: False: threads wait as before, the loop reads everything (``thread_reads=False``
        #: sets it at start; benchmarks/bench_actors.py flips it to compare in one run).
        self.enabled = True
        #: How many waits read on their own thread, and how many could not (for tests).
        self.led = 0
        self.declined = 0
        #: How many waits polled without sleeping first (core/_spin.py; for tests).
        self.spun = 0
        #: How many waits led only the connection their reply was to come on (for tests).
        self.led_one = 0
        #: Called on a thread that has taken over its connections, before it polls (tests
        #: use it to act while a thread is the reader).
        self.on_lead: Callable[[], None] | None = None
        #: Seconds a waiting thread polls before it sleeps (``spin_us``, core/_spin.py).
        self.spin = spin_limit(runtime.config.spin_us) if polling.spins else 0.0
        self._gauge = cpu_gauge()
        #: proc address -> (its key in ``runtime.inbound.leadable``, the inbound connection its
        #: replies came on), learned by waiting threads (:meth:`_lead`'s ``via``).
        self._from: dict[str, tuple[int, Any]] = {}
        #: A fan-out's sender sets its connections aside for its ``get()``, and that wait
        #: for the next fan-out, instead of giving them back (``_hold``). False: they go
        #: back at once (benchmarks compare both in one run: bench_actors --compare-hold,
        #: bench_fanout --callgrind-mesh).
        self.holding = True
        #: Times threads set connections aside so far, and whether a loop task is watching
        #: to take them back (:meth:`_reclaim`).
        self.holds = 0
        #: Per connection (by id): the value of ``holds`` when a thread last set it aside.
        self._held_in: dict[int, int] = {}
        self._reclaiming = False
        #: Threads waiting for the loop to read for them (on a lock, or awaiting a future):
        #: while there are any, nothing is set aside.
        self._loop_waiters = 0
        self._waiters_lock = threading.Lock()

    def _reading(self) -> _Reading:
        """This thread's :class:`_Reading` (made on its first wait)."""
        reading = self._threads.reading
        if reading is None:
            reading = self._threads.reading = _Reading()
        return reading

    @property
    def _local(self) -> _Reading:
        """This thread's :class:`_Reading` (tests look at it)."""
        return self._reading()

    def _spinner(self, local: _Reading, callee: bool) -> SpinPolicy:
        if callee:
            if local.callee_spinner is None:
                local.callee_spinner = SpinPolicy()
            return local.callee_spinner
        if local.spinner is None:
            local.spinner = SpinPolicy()
        return local.spinner

    def _bell(self, local: _Reading) -> Bell:
        bell = local.bell
        if bell is None:
            bell = local.bell = self._polling.bell()
        return bell

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        """Wait for ``fut``, reading this runtime's inbound connections on this thread
        where it can, else on the future's lock while the loop reads."""
        here.waited = True  # what this thread sends next answers this (core/_waiting.py)

        def arm(bell: Bell | None) -> bool:
            with fut._lock:
                if bell is None:
                    if fut._bell is not None and fut._bell.owner == threading.get_ident():
                        fut._bell = None
                    return True
                if fut._bell is not None:
                    return False  # another thread reads for this future already
                fut._bell = bell
                return True

        def rest(left: float | None) -> None:
            try:
                self._polling.block(fut, left)
            except TimeoutError:
                raise TimeoutError(f"future not resolved within {timeout} s") from None

        # A call to one rank: its reply comes on the connection from that proc.
        via = fut.addresses[0] if type(fut) is OneReply else None
        local = self._threads.reading or self._reading()
        after_fan_out, local.fanned_out = local.fanned_out, False
        if self._lead(fut.done, arm, timeout, rest, via, hold=after_fan_out):
            return
        with self.loop_waiting():
            rest(timeout)

    async def wait_async(self, fut: Future[Any]) -> None:
        """``await fut`` on this thread's loop: the loop reads for it meanwhile, so what
        threads set aside goes back to the loop (:meth:`loop_waiting`)."""
        with self.loop_waiting():
            await self._polling.wait_on_loop(fut)

    def mailbox(self) -> LeadingMailbox:
        """An actor thread's mailbox whose ``get`` reads the sockets while it is empty."""
        return LeadingMailbox(self)

    def _poll_set(
        self, taken: list[Any], bell: Bell, local: _Reading
    ) -> tuple[Any, dict[int, Any]]:
        """A poll set of ``taken`` and ``bell``: the one this thread (``local``) made when
        it last polled the same connections (a thread that unregisters from one, below,
        forgets it)."""
        polled = tuple(taken)
        kept = local.sets.get(polled)
        if kept is not None:
            local.poller = kept[0]
            return kept
        poller = self._polling.poller()
        by_fd = {}
        for conn in taken:
            by_fd[conn.fileno()] = conn
            poller.register(conn.fileno(), select.POLLIN)
        poller.register(bell.fd, select.POLLIN)
        sets = local.sets
        # A kept set holds its connections (and their receive buffers): those with a
        # closed one go, and all go beyond _POLL_SETS.
        for stale in [k for k in sets if any(conn.closed for conn in k)]:
            del sets[stale]
        if len(sets) >= _POLL_SETS:
            sets.clear()
        sets[polled] = (poller, by_fd)
        local.poller = poller
        return poller, by_fd

    def _may_lead(self) -> bool:
        """Whether this thread may read the runtime's sockets itself at all."""
        if not self.enabled or _here.declined or threading.get_ident() == self._rt.thread_id:
            return False  # (the last: the runtime's own thread, Runtime.on_runtime_thread)
        # In a Jupyter kernel, interrupts and faults arrive on the main thread as signals
        # that may unwind it anywhere, also while it hands sockets back to the loop: there
        # it waits on its lock and the loop reads, as with thread_reads=False.
        return served.notebook is None or threading.current_thread() is not threading.main_thread()

    def sending(self, send: Callable[[], None]) -> None:
        """Run ``send()`` (a call's fan-out to several ranks) leading this runtime's
        inbound connections, read on this thread what came meanwhile, and set them aside
        for the ``get()`` that usually follows (:meth:`_hold`). The first ranks' replies
        can come before the last rank's frame is sent, and the rest while the caller is on
        its way to ``get()``: the loop would wake up to read them (at about twice a waiting
        thread's cost), where the caller reads them itself."""
        taken = self._take() if self._may_lead() else []
        try:
            send()
            if taken:
                local = self._threads.reading or self._reading()
                bell = local.bell or self._bell(local)
                poller, by_fd = self._poll_set(taken, bell, local)
                self._read(poller.poll(0), poller, by_fd, taken, bell)
                self._hold(taken)
                taken = []
                local.fanned_out = self.holding
        finally:
            for conn in taken:
                conn.give_back()

    def _hold(self, taken: list[Any]) -> None:
        """Done reading ``taken`` for now (after a fan-out, its ``get()``, or a wait for one
        rank's reply): set them aside (``SocketConnection.hold``) for this thread's next wait,
        which leads them again without a syscall
        (giving them back re-arms the loop's interest in each, an ``epoll_ctl``, and leading
        them silences it again, another), and the loop is not woken by frames that come
        in between: the next wait reads them. Any thread may lead them meanwhile. A thread
        that does not come back soon loses them to the loop (:meth:`_reclaim`); while a
        thread waits for the loop to read for it they go back at once."""
        if not self.holding:
            for conn in taken:
                conn.give_back()
            return
        for conn in taken:
            conn.hold()
        # After the holds: a thread that starts waiting for the loop counts itself, then
        # takes back what is held (loop_waiting); one of the two sees the other.
        if self._loop_waiters:
            for conn in taken:
                conn.reclaim()
            return
        self.holds = count = self.holds + 1
        stamps = self._held_in
        for conn in taken:
            stamps[id(conn)] = count
        if not self._reclaiming:  # (read after the count: see _reclaim)
            self._reclaiming = True
            try:
                self._rt.call_soon(self._start_reclaiming)
            except trio.RunFinishedError:  # the runtime is gone, and its connections
                pass

    def _start_reclaiming(self) -> None:
        try:
            self._rt.nursery.start_soon(self._reclaim)
        except RuntimeError:  # the runtime is closing: its connections close with it
            self._reclaiming = False

    async def _reclaim(self) -> None:
        """On the loop: every ``HOLD`` seconds, take back each connection no thread has set
        aside again since the last look (one a thread leads is left to it): a thread that
        goes on waiting for one proc's replies keeps only that proc's connection, not the
        others it set aside earlier. Ends when nothing was set aside meanwhile."""
        rt = self._rt
        stamps = self._held_in
        while True:
            seen = self.holds
            await trio.sleep(HOLD)
            conns = list(rt.inbound.leadable.values())
            for conn in conns:
                if stamps.get(id(conn), 0) <= seen:
                    conn.reclaim()
            if len(stamps) > len(conns):  # forget closed connections
                live = {id(conn) for conn in conns}
                for key in [key for key in stamps if key not in live]:
                    del stamps[key]
            if self.holds != seen:  # threads still hold: look again later
                continue
            # Cleared before the last look at the count, which a holder bumps before it
            # reads the flag: a hold after that look starts a new task (never none).
            self._reclaiming = False
            if self.holds == seen:
                return
            self._reclaiming = True

    @contextlib.contextmanager
    def loop_waiting(self) -> Iterator[None]:
        """Around a wait in which the loop must read for this thread (it could lead no
        connection, the ones it led went back, or it awaits the future on an event loop:
        :meth:`wait_async`): connections set aside go back to the loop now, and none
        is set aside until the wait ends."""
        with self._waiters_lock:
            self._loop_waiters += 1
        try:
            for conn in list(self._rt.inbound.leadable.values()):
                conn.reclaim()
            yield
        finally:
            with self._waiters_lock:
                self._loop_waiters -= 1

    def _take(self) -> list[Any]:
        """Lead this runtime's inbound connections whose reader is idle: those taken ([]
        when there are none, or more than ``MAX_LED``)."""
        conns = list(self._rt.inbound.leadable.values())
        if len(conns) > MAX_LED:
            return []
        taken = []
        for conn in conns:  # (a loop, not a comprehension: no frame of its own on 3.11)
            if conn.lead():
                taken.append(conn)
        return taken

    def _take_from(self, address: str) -> list[Any] | None:
        """Lead only the inbound connection from the proc at ``address`` (learned from an
        earlier reply of that proc that this thread read): ``[conn]``, ``[]`` when its
        reader is busy, None when none is known (lead them all, and learn it)."""
        known = self._from.get(address)
        if known is None:
            return None
        key, conn = known
        leadable = self._rt.inbound.leadable
        if key not in leadable or leadable[key] is not conn:  # closed, or replaced
            self._from.pop(address, None)
            return None
        return [conn] if conn.lead() else []

    def _learn(self, address: str, conn: Any) -> None:
        """A reply from the proc at ``address`` came on ``conn``: the next wait for one
        leads only that connection."""
        for key, leadable in self._rt.inbound.leadable.items():
            if leadable is conn:
                if len(self._from) >= _KNOWN_PROCS:
                    self._from.clear()
                self._from[address] = (key, conn)
                return

    def _read(
        self,
        events: list[tuple[int, int]],
        poller: Any,
        by_fd: dict[int, Any],
        taken: list[Any],
        bell: Bell,
        done: Callable[[], bool] | None = None,
    ) -> Any:
        """Read what ``poll`` found on the led connections; a connection whose frame this
        thread declines is handed back to the loop and dropped from ``taken``. Returns the
        connection whose frames made ``done()`` true, if any (None without ``done``)."""
        resolver = None
        for fd, _ in events:
            if fd == bell.fd:
                bell.drain()
                continue
            conn = by_fd.get(fd)
            if conn is not None:
                kept = conn.read_led()
                if done is not None and resolver is None and done():
                    resolver = conn
                if not kept:  # handed back to the loop
                    self._unpoll(poller, by_fd, fd)
                    taken.remove(conn)
            error = deferred.error
            if error is not None:  # raised handling a frame it took (see _inbound)
                deferred.error = None
                raise error
        return resolver

    def _unpoll(self, poller: Any, by_fd: dict[int, Any], fd: int) -> None:
        """Stop polling ``fd`` (a connection handed back): the kept poll set is forgotten."""
        sets = self._reading().sets
        for polled, kept in list(sets.items()):
            if kept[1] is by_fd:
                del sets[polled]
        poller.unregister(fd)
        del by_fd[fd]

    def _lead(
        self,
        done: Callable[[], bool],
        arm: Callable[[Bell | None], bool],
        timeout: float | None,
        rest: Callable[[float | None], None],
        via: str | None = None,
        *,
        hold: bool = False,
        callee: bool = False,
    ) -> bool:
        """Read the runtime's inbound connections on this thread until ``done()``;
        ``arm(bell)`` has resolvers ring ``bell`` (False: someone else reads for it),
        ``arm(None)`` undoes that; ``rest(time_left)`` waits on once nothing is left to
        read here. With ``hold``, or when only ``via``'s connection was led, the connections
        are set aside when done (:meth:`_hold`), else given back. False when no connection
        could be led (nothing was waited for).

        ``via``: the address of the one proc whose frame will make ``done()`` true (a
        call to one rank). Once a reply from it has been read here, later waits lead only
        the connection it came on (fewer ``epoll_ctl``, a smaller poll, the other
        connections left to the loop); a wait on that one connection that was ended by
        another reader (the bell) forgets it, so the next wait leads all and learns again.
        The bell wakes the thread whoever resolves, so a wrong guess costs time, never a
        reply.

        ``callee``: an actor thread waiting for its next call (:class:`LeadingMailbox`),
        which spins also when every CPU is taken (core/_spin.py, "callees")."""
        if not self._may_lead():
            return False
        taken = None if via is None else self._take_from(via)
        only_via = taken is not None
        if taken is None:
            taken = self._take()
        if not taken:
            self.declined += 1
            return False
        local = self._threads.reading or self._reading()
        bell = local.bell or self._bell(local)
        mine = arm(bell)
        try:
            if not mine:
                self.declined += 1
                for conn in taken:
                    conn.give_back()
                taken = []
                return False
            self.led += 1
            if only_via:
                self.led_one += 1
            monotonic = self._monotonic
            deadline = None if timeout is None else monotonic() + max(timeout, 0.0)
            poller, by_fd = self._poll_set(taken, bell, local)
            on_lead = self.on_lead
            if on_lead is not None:
                on_lead()
            ms: int | None = None
            spinner = (local.callee_spinner if callee else local.spinner) or self._spinner(
                local, callee
            )
            spin = spinner.budget(self.spin)
            spin_until = 0.0
            if spin:
                if not callee and self._gauge.crowded():
                    spinner.missed()  # no CPU to spare: reads the gauge less from now on
                else:
                    self.spun += 1
                    spin_until = time.perf_counter() + spin
            learn = done if via is not None else None
            waited = False
            read_by = None
            while not done():
                waited = True
                if deadline is not None:
                    left = deadline - monotonic()
                    if left <= 0:
                        raise TimeoutError(f"future not resolved within {timeout} s")
                    ms = math.ceil(left * 1000)
                if spin_until:
                    # Poll without sleeping for a while (core/_spin.py), yielding the CPU
                    # between polls; then sleep in poll as before.
                    events = poller.poll(0)
                    if events:
                        spinner.caught()
                        spin_until = 0.0
                    elif time.perf_counter() < spin_until:
                        os.sched_yield()
                        continue
                    else:
                        spinner.missed()
                        spin_until = 0.0
                        events = poller.poll(ms)
                else:
                    events = poller.poll(ms)
                resolver = self._read(events, poller, by_fd, taken, bell, learn)
                if resolver is not None:
                    read_by = resolver
                if not taken and not done():
                    # Nothing left to read here: wait as any thread does, for the time left.
                    with self.loop_waiting():
                        rest(None if deadline is None else deadline - monotonic())
                    break
            if via is not None:
                if read_by is not None:
                    if not only_via:
                        self._learn(via, read_by)
                elif only_via and waited:
                    self._from.pop(via, None)  # it came another way: lead all next time
            if (hold or only_via) and taken:
                # A fan-out's wait sets its connections aside for the next fan-out; a
                # wait for one rank's reply sets that proc's connection aside for the next
                # call's reply: it leads it again without a syscall, and the loop cannot
                # read that reply in between (a caller preempted right after its write
                # would leave it to the loop: a loop wake-up and a hop).
                self._hold(taken)
                taken = []
            return True
        finally:
            if mine:
                arm(None)
            for conn in taken:
                conn.give_back()


class LeadingMailbox:
    """A production actor thread's mailbox (``ThreadExecutor.mailbox``): ``put`` on the
    loop (or on a thread that read the message), ``get`` on the actor's thread, which reads
    the runtime's sockets itself while the mailbox is empty, so a call to an idle actor
    reaches it without a hop from the loop."""

    __slots__ = (
        "_bell", "_clock", "_get", "_lead", "_leader", "_nonempty", "_queue", "get_nowait",
        "qsize",
    )

    def __init__(self, leader: Leader) -> None:
        self._leader = leader
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._get = self._queue.get
        self.get_nowait = self._queue.get_nowait
        self.qsize = self._queue.qsize
        self._clock = leader._rt.env.clock
        self._bell: Bell | None = None
        # What ``get`` hands ``Leader._lead``, made once (not three closures per wait).
        self._lead = leader._lead
        empty = self._queue.empty
        self._nonempty = lambda: not empty()

    #: ``put`` stamps each call with the time it was queued (the flight recorder's), as
    #: ``ActorCell._accept_threaded`` does for other mailboxes: no call frame more per call.
    stamps_calls = True

    def put(self, item: Any) -> None:
        if type(item) is _Call:
            item.queued_at = self._clock()
        self._queue.put(item)
        bell = self._bell  # after the put: a getter that armed sees the item, or is rung
        # (Not the getter's own bell when the getter put it, reading for itself, the common
        # case: it is awake, and ``ring`` would only check that.)
        if bell is not None and bell.owner != _get_ident():
            bell.ring()

    def _arm(self, bell: Bell | None) -> bool:
        self._bell = bell
        return True

    def get(self) -> Any:
        if self._queue.empty():
            here.waited = True  # its reply goes out at once (core/_waiting.py)
            self._lead(self._nonempty, self._arm, None, _rest_nowhere, callee=True)
        return self._get()


def _rest_nowhere(_left: float | None) -> None:
    """A mailbox's ``get`` waits on its queue once ``Leader._lead`` gives up."""


blocked_in.add(Leader._lead.__code__)  # a thread that reads while it waits blocks here
