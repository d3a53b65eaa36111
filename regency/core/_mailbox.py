"""An actor's mailbox and the executor that handles its messages one at a time.

One mailbox loop (``ActorCell._main`` and the generators it delegates to: ``_call``,
``_supervise``, ``_die``, ``_stop``, ``_wind_down``), written once, and two drivers, chosen per
actor class:

* **thread** (any sync endpoint): the actor's thread drives the loop and runs sync endpoints
  directly, so an endpoint may block, including on another actor's ``.get()``. Async
  endpoints of such an actor run on the proc's trio loop while the thread waits, so handling
  stays one at a time. The thread and its blocking primitives come from the runtime's
  executor (:mod:`._executor`): a real thread in production, a lockstep thread in the
  simulator, which thus runs this very code.
* **trio** (only async endpoints): a trio task on the proc's loop drives the same loop; no
  thread hop per message.

Replies are written from wherever the handler ran (``Connection.send_nowait`` is
thread-safe), without a hop back to the trio thread.

Mailbox items are records from :mod:`._messages` (``MailboxItem``): ``Call``, ``StopActor``,
``Supervise``, ``Escalate`` and ``Abandon``.

Failure (see docs/supervision.md): an endpoint that raises with no caller waiting, a
``BaseException`` out of an endpoint, a failed ``__init__`` or an unhandled failure of a mesh
this actor owns make the actor *die*: its proc is poisoned (refuses new actors; not the
controller's own process, see ``Runtime.poison``), its owner
gets a FAILED report, what it owns is stopped, ``__cleanup__(exc)`` runs, and queued messages
bounce. Stopping does the same without the report.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import queue
import threading
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, assert_never

import attrs
import trio

from .. import supervision as S
from .. import transports
from . import _codec
from . import _extensions as _ext
from . import _messages as M
from ._context import ActorInstance, Context, current
from ._endpoint import Actor, EndpointSpec, endpoints_of
from ._errors import RemoteFailure, SupervisionError
from ._executor import Mailbox
from ._future import Future
from ._metrics import actor_stats, frame_bytes
from ._shape import Extent, Point
from ._spin import SpinPolicy, spin_limit
from ._stacks import RECENT, handled, outcome_of, stall_ended
from ._trace import actor_track

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.actor")
_ABANDON = M.Abandon()
#: A handled call's outcome when it returned (the flight recorder's common case).
_RETURNED = "returned"
_NEVER = -math.inf  # Call.queued_at of a call not stamped
#: ``ActorCell._call``'s default: look the endpoint up by the call's method.
_LOOKUP: Any = object()

#: What the mailbox loop's generators ask their driver for (see ActorCell._thread_main).
_NEXT = object()  # the next mailbox item
_Coroutine = types.CoroutineType  # cannot be subclassed: a type test is iscoroutine


class _Await(NamedTuple):
    """Run ``fn()`` (it returns an awaitable) on the loop to completion; its result."""

    fn: Callable[[], Awaitable[Any]]


class _OnLoop(NamedTuple):
    """Call ``fn()`` on the loop; its result."""

    fn: Callable[[], Any]


class _Wait(NamedTuple):
    """Wait for ``fut`` for at most ``timeout`` seconds (``TimeoutError``); its result."""

    fut: Future[Any]
    timeout: float | None


class _Bounded(NamedTuple):
    """Run blocking ``fn()`` off the loop for at most ``timeout`` seconds; whether it
    finished (it is abandoned otherwise)."""

    fn: Callable[[], None]
    timeout: float


class Handling:
    """What an actor handles now: written by its driver (its thread, or the loop for an
    all-async actor), read from other threads (stacks, the stall watch, a trace). Slots: the
    mailbox loop writes them for each call."""

    __slots__ = ("call", "outcome", "started", "watched")

    def __init__(self, watched: bool) -> None:
        #: The call being handled, None while idle. Written after ``started``: a reader
        #: that sees a call, then reads ``started``, reads its start (or a later call's).
        self.call: M.Call | None = None
        self.started = 0.0
        #: How the call being handled ended, when not by returning (set where it raised,
        #: with ``watched``).
        self.outcome = _RETURNED
        #: Whether the mailbox loop must look at the call when it ends
        #: (``ActorCell._handled``): it did not return, a trace is on, or the stall watch
        #: warned. Set by any of them (a trace's and the watch's from the loop:
        #: ``ActorCell.watch``), cleared by the actor's driver.
        self.watched = watched


def _point(spec: tuple[int, Sequence[str], Sequence[int]]) -> Point:
    rank, labels, sizes = spec
    return Point(rank, Extent(labels, sizes))


def _exception_cause(what: str, exc: BaseException) -> S.FailureCause:
    failure = RemoteFailure.capture(exc)
    summary = f"{failure.type_name}: {failure.message}"
    return S.FailureCause(f"{what} {summary}" if what else summary, failure.traceback)


class ActorCell:
    def __init__(
        self,
        runtime: Runtime,
        key: str,
        name: str,
        point: tuple[int, Sequence[str], Sequence[int]],
        payload: Any,
        init_port: tuple[str, int] | None,
        owner: tuple[str, str, str],
    ) -> None:
        self.rt = runtime
        self.key = key
        self.name = name
        self.point = _point(point)
        self._payload = payload
        self._init_port = init_port
        #: (address, actor key, name) of the actor that spawned this mesh.
        self.owner = owner
        cls = payload[0] if isinstance(payload, tuple) else None
        self.instance: ActorInstance = ActorInstance(
            name,
            key,
            self.point,
            runtime.proc_id,
            runtime.address,
            f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else "?",
        )
        self.obj: Any = None
        self.endpoints: dict[str, EndpointSpec[..., Any]] = {}
        table = endpoints_of(cls) if isinstance(cls, type) else {}
        # An actor with sync endpoints (or none) gets its own thread, in production and in
        # the simulator alike; only the executor's blocking primitives differ.
        self.threaded = not table or any(not e.is_async for e in table.values())
        self._executor = runtime.executor
        self._queue: Mailbox = self._executor.mailbox()
        self._deque: deque[M.MailboxItem] = deque()
        self._wakeup = trio.Event()
        #: Queue a call or a StopActor (a message from a peer: what ``enqueue`` does for
        #: them, without its test for a ``Supervise``): the mailbox's own ``put`` for an
        #: actor with a thread (on the loop, or on a thread that read the message), one
        #: call per message less; the deque for an all-async actor (on the loop).
        self._put = self._queue.put
        # A mailbox that stamps calls itself (the leader's) takes them directly.
        stamps = getattr(self._queue, "stamps_calls", False)
        self.accept: Callable[[M.MailboxItem], None] = (
            (self._put if stamps else self._accept_threaded)
            if self.threaded
            else self._accept_on_loop
        )
        # What introspection reads (core/_stacks.py): the runtime's clock (virtual in the
        # simulator), the call being handled and when it started, the last calls handled
        # (the flight recorder), the actor thread, the coroutine of a running async call.
        self._clock = runtime.env.clock
        #: The call being handled, when it started, how it ended (see ``busy``).
        self.now = Handling(runtime.trace is not None)
        #: With metrics on (``config.metrics``), this actor's statistics per endpoint
        #: (core/_metrics.py); None while off.
        self._metrics = actor_stats(runtime, self, table)
        #: The flight recorder: the last RECENT calls handled, oldest first, as raw tuples
        #: (endpoint, reply port, queued, started, finished, outcome): the mailbox loop
        #: builds one tuple per call; readers make records of them (core/_stacks.py).
        #: ``queued`` is -inf for a call that was not stamped (then read as ``started``).
        #: With metrics on, the statistics are this deque: they count each call as it is
        #: recorded (no test per call while metrics are off).
        self.recent: deque[tuple[str, Any, float, float, float, str]] = (
            deque(maxlen=RECENT) if self._metrics is None else self._metrics
        )
        if self._metrics is not None:  # replies whose bytes are counted
            self.__dict__["_succeeded"] = self._succeeded_metered
        #: The ident of the actor's thread (an actor with a thread), once it runs.
        self.thread_ident: int | None = None
        #: The coroutine of the async endpoint running now, if any (its await chain).
        self.coro: Any = None
        #: The DEAD replies to the call this actor dies of, held until ``_fail`` has told
        #: the owner: (port, rank, failure, endpoint). An owner that called it hears of the
        #: failure (its ``__supervise__`` queued) before its call fails, as in Monarch.
        self._held_dead: list[tuple[M.PortRef, int, RemoteFailure, str]] = []
        #: Calls of concurrent endpoints running now: scope -> (call, started, coroutine).
        self.concurrent: dict[trio.CancelScope, list[Any]] = {}
        #: Stall warnings given for the call being handled (core/_stacks.StallWatch).
        self.stall_warned = 0
        #: This actor's track in a trace (core/_trace.py).
        self.track = actor_track(self)
        #: Async endpoints of this actor now running on the loop (0 or 1, but counted).
        self._in_async_endpoint = 0
        #: The cancel scope of the (non-concurrent) async endpoint running now, if any, and
        #: why it was cancelled: the actor failed (an ``Escalate``) while it was suspended.
        self._endpoint_scope: trio.CancelScope | None = None
        self._failed_at_await: S.FailureCause | None = None
        # Set by context().actor_instance.stop() inside a handler: StopActor is queued when
        # that handler ends, before its reply is sent.
        self.stop_when_handled = False
        #: Calls of concurrent endpoints still running (cancelled when the actor retires).
        self._running: set[trio.CancelScope] = set()
        #: Set when ``_running`` empties while the actor winds down (_cancel_concurrent).
        self._running_idle: trio.Event | None = None
        #: The context of the last call (see _context).
        self._last_context: Context | None = None
        #: An all-async actor's spin before it waits for its next call (_spin_for_next):
        #: seconds at most (0: never; an actor with a thread spins there instead, and the
        #: simulator's runtimes never do), and its back-off, made on its first spin.
        self._spin_limit = (
            spin_limit(runtime.config.spin_us)
            if not self.threaded and self._executor.runs_freely
            else 0.0
        )
        self._spinner: SpinPolicy | None = None

    @property
    def busy(self) -> tuple[M.Call, float] | None:
        """(call, started) of the call being handled; None while idle."""
        now = self.now
        call = now.call
        return None if call is None else (call, now.started)

    def watch(self) -> None:
        """Have the mailbox loop tell each handled call to ``_handled`` (a trace began, or
        the stall watch warned about the call running): any thread."""
        self.now.watched = True

    # -- mailbox -------------------------------------------------------------------------

    def start(self) -> None:
        if self.threaded:
            self._executor.start_thread(self._thread_main, f"actor {self.name}[{self.point.rank}]")
        else:
            self.rt.nursery.start_soon(self._task_main, name=f"actor {self.name}")

    def enqueue(self, item: M.MailboxItem) -> None:
        """Called on the runtime's trio thread.

        A failure report for an owner that is inside an async endpoint, suspended at an
        await, is not queued behind it: ``__supervise__`` runs at once on the loop, i.e. at
        the endpoint's next await point, as in Monarch (an endpoint may be waiting for exactly
        that news). Sync ``__supervise__`` of an actor with a thread still queues.

        """
        if (
            type(item) is M.Supervise
            and self._in_async_endpoint
            and (not self.threaded or inspect.iscoroutinefunction(self._supervise_fn()))
        ):
            self.rt.nursery.start_soon(self._supervise_now, item.failure)
            return
        self.accept(item)

    def fail_unhandled(self, cause: S.FailureCause) -> None:
        """This owner did not handle a failure of a mesh it owns (its ``__supervise__``
        answered falsy, or raised): it dies (on the trio thread). Inside an async endpoint,
        suspended at an await, it dies there, as in Monarch: the endpoint is cancelled at
        that await point, its caller gets the actor's death, and the actor dies now instead
        of after the endpoint returns (which may be never: the endpoint may be waiting for
        exactly that news). Otherwise the death is queued, as other failures are (an
        ``abort()``, a concurrent endpoint that failed with no caller: after the current
        message)."""
        scope = self._endpoint_scope
        if scope is not None and self._failed_at_await is None:
            self._failed_at_await = cause
            scope.cancel()  # the endpoint's driver dies of it (_call_async)
            return
        self.enqueue(M.Escalate(cause))

    def _accept_threaded(self, item: M.MailboxItem) -> None:
        """``accept`` of an actor with a thread: stamp a call with the time it was queued
        (the flight recorder's), then the mailbox's own ``put``."""
        if type(item) is M.Call:
            item.queued_at = self._clock()
        self._put(item)

    def _accept_on_loop(self, item: M.MailboxItem) -> None:
        """``accept`` of an all-async actor (on the loop)."""
        if type(item) is M.Call:
            item.queued_at = self._clock()
        self._deque.append(item)
        self._wakeup.set()

    def abandon(self) -> None:
        """The runtime is going away: stop popping the mailbox."""
        self.enqueue(_ABANDON)

    # -- the executor: one mailbox loop, two drivers --------------------------------------
    #
    # What an actor does is written once, as generators (_main, _call, _supervise, _die,
    # _stop, _wind_down) that yield what they need done: the next message (_NEXT), an
    # awaitable run to completion (_Await), a call on the loop (_OnLoop), a future waited on
    # (_Wait), blocking code bounded in time (_Bounded). A driver performs those: the thread
    # driver by blocking its actor thread (through the executor: a real thread in
    # production, a lockstep thread in the simulator), the loop driver by awaiting.

    def _thread_main(self) -> None:
        """An actor thread: drive the mailbox loop, blocking."""
        from ._current import _runtime_var

        _runtime_var.set(self.rt)
        self.thread_ident = threading.get_ident()
        executor, gen = self._executor, self._main()
        send, throw, get = gen.send, gen.throw, self._queue.get
        value: Any
        try:
            effect = send(None)
            while True:
                if effect is _NEXT:  # the common case first: the next message
                    try:
                        value = get()
                    except BaseException as exc:
                        effect = throw(exc)
                    else:
                        effect = send(value)
                        # Handled, or held by the mailbox loop's generators while needed:
                        # this thread keeps no reference of its own while it waits in get()
                        # for the next (a call's arguments may be hundreds of megabytes).
                        value = None
                    continue
                try:
                    if type(effect) is _Await:
                        value = executor.to_loop(effect.fn)
                    elif type(effect) is _OnLoop:
                        value = executor.to_loop_sync(effect.fn)
                    elif type(effect) is _Wait:
                        value = effect.fut.get(effect.timeout)
                    else:
                        assert type(effect) is _Bounded
                        value = executor.run_bounded(effect.fn, effect.timeout)
                except BaseException as exc:
                    effect = throw(exc)
                else:
                    effect = send(value)
                    value = None  # (an awaited result, or a future's: as above)
        except (StopIteration, trio.RunFinishedError):
            return  # done, or the runtime is gone

    async def _spin_for_next(self) -> None:
        """An all-async actor about to wait for its next call keeps the loop polling its
        sockets without sleeping for a while first (``core/_spin.py``, "Callees", as an
        actor thread does): a call that lands meanwhile is read without the loop's wake-up
        (on a VM whose idle vCPUs halt, about 30 us of a 100 us round trip). Each pass
        yields the CPU, then checkpoints: the loop polls with a zero timeout and runs
        whatever is ready. The same back-off after misses. Production only (a runtime on
        the ThreadExecutor): in the simulator, how many scheduling rounds a spin took
        would depend on the wall clock, and its runs must replay."""
        spinner = self._spinner
        if spinner is None:
            spinner = self._spinner = SpinPolicy()
        budget = spinner.budget(self._spin_limit)
        if not budget:
            return
        leader = self.rt.leader
        if leader is not None:
            leader.spun += 1
        until = time.perf_counter() + budget
        checkpoint, yield_cpu = trio.lowlevel.checkpoint, os.sched_yield
        while not self._deque:
            if time.perf_counter() >= until:
                spinner.missed()
                return
            # The CPU to any thread waiting for it, and the GIL with it (this proc's actor
            # threads: the loop's zero-timeout polls release the GIL too, but take it back
            # before a waiting thread wakes), as the threads' spin does between its polls.
            yield_cpu()
            await checkpoint()
        spinner.caught()

    async def _task_main(self) -> None:
        """An all-async actor: drive the same mailbox loop as a trio task."""
        gen = self._main()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                effect = gen.send(sent) if thrown is None else gen.throw(thrown)
            except StopIteration:
                return
            sent, thrown = None, None
            try:
                if effect is _NEXT:
                    if not self._deque and self._spin_limit:
                        await self._spin_for_next()
                    while not self._deque:
                        await self._wakeup.wait()
                        self._wakeup = trio.Event()
                    sent = self._deque.popleft()
                elif type(effect) is _Await:
                    sent = await effect.fn()
                elif type(effect) is _OnLoop:
                    sent = effect.fn()
                elif type(effect) is _Wait:
                    with trio.move_on_after(
                        math.inf if effect.timeout is None else effect.timeout
                    ) as scope:
                        sent = await effect.fut
                    if scope.cancelled_caught:
                        raise TimeoutError(f"future not resolved within {effect.timeout} s")
                else:
                    assert type(effect) is _Bounded
                    with trio.move_on_after(effect.timeout):
                        await self._executor.run(effect.fn)
                        sent = True
                    sent = bool(sent)
            except BaseException as exc:
                thrown = exc

    def _main(self) -> Generator[Any, Any, None]:
        """The mailbox loop: construct, then handle one message at a time until death or
        stop.

        The flight recorder costs a call one clock read (when it ended), its queued stamp
        (``Call.queued_at``, put by the mailbox), two slot writes and one tuple: its start
        is when the actor could take it, the later of its queueing and the end of what the
        actor handled before (``free``), read from no clock; its endpoint and reply port
        are read once, for the handler and the recorder alike. Nothing is formatted here:
        readers make records of the tuples (core/_stacks.py)."""
        # On the thread the actor's endpoints run on (an all-async actor's: the proc's loop),
        # so thread-local state ``__init__`` sets is what its endpoints see, as in Monarch.
        alive = self._init()
        clock, record, now = self._clock, self.recent.append, self.now
        free = clock()  # when the actor last became free to take a message
        while alive:
            item: M.MailboxItem = yield _NEXT
            match item:
                case M.Call():
                    method, port, queued = item.method, item.port, item.queued_at
                    started = queued if queued > free else free
                    now.started = started
                    now.call = item
                    rest = self._call(item, method, port)  # None: handled (most calls)
                    if rest is not None:
                        alive = yield from rest
                        if self._metrics is not None:  # (a call of a concurrent endpoint
                            # is counted when its own task ends, not as it is handed over)
                            self._metrics.handed_over(method, started)
                    free = clock()
                    now.call = None
                    record((method, port, queued, started, free, now.outcome))
                    if now.watched:
                        self._handled(item, queued, started, free)
                    del item, rest  # idle until the next message: keep nothing of this one
                case M.Supervise():
                    yield from self._supervise(item.failure)
                    free = clock()
                case M.Escalate():
                    yield from self._die(item.cause, None)
                    return
                case M.StopActor():
                    yield from self._stop(item.port)
                    return
                case M.Abandon():
                    return
                case _:
                    assert_never(item)

    def _handled(self, item: M.Call, queued: float, started: float, end: float) -> None:
        """A call handled while watched (``Handling.watched``): it did not return, a trace
        is on, or the stall watch warned about it. The rare cases."""
        now = self.now
        outcome = now.outcome
        now.outcome = _RETURNED
        now.watched = False  # (before the tests: a watch() meanwhile is not lost)
        trace = self.rt.trace
        if trace is not None:
            now.watched = True
            trace.handled(self, item, queued if queued > _NEVER else started, started, end, outcome)
        if self.stall_warned:
            self.stall_warned = 0
            stall_ended(self, item.method, end - started)

    def queued(self) -> int:
        """How many messages wait in this actor's mailbox."""
        return self._queue.qsize() if self.threaded else len(self._deque)

    def _retire(self, failure: RemoteFailure) -> None:
        """Leave the runtime's actor table; bounce whatever is still queued with ``failure``.

        Runs on the trio thread, where enqueues happen, so nothing slips in after the drain.
        """
        from ._runtime import bounce

        def retire() -> None:
            # Under the dispatch lock: a thread that read a call for this actor queues it
            # either before the drain (bounced here) or after (bounced as for a dead actor).
            with self.rt.dispatch_lock:
                self.rt.actor_gone(self, failure)
                for scope in list(self._running):  # concurrent calls still running
                    scope.cancel()
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    bounce(self.rt, item, failure)
                while self._deque:
                    bounce(self.rt, self._deque.popleft(), failure)

        self.rt.call_soon(retire)

    # -- __init__ ------------------------------------------------------------------------

    def _init(self) -> bool:
        """Construct the actor. On failure the actor dies (also on the trio executor:
        ``__init__`` is synchronous and owns nothing yet, so no waiting is involved)."""
        payload = self._payload
        self._payload = None
        token = current.set(Context(self.instance, self.point))
        try:
            if isinstance(payload, BaseException):
                raise payload
            cls, args, kwargs = payload
            if not (isinstance(cls, type) and issubclass(cls, Actor)):
                raise TypeError(f"spawn needs an Actor subclass (got {cls!r})")
            self.endpoints = endpoints_of(cls)
            self.obj = cls(*args, **kwargs)
        except BaseException as exc:
            cause = _exception_cause("__init__ raised", exc)
            if self._init_port is not None:
                self._reply(self._init_port, self.point.rank, M.ERROR, RemoteFailure.capture(exc))
            self._retire(self._fail(cause))
            return False
        finally:
            current.reset(token)
        if self._init_port is not None:
            self._reply(self._init_port, self.point.rank, M.OK, None)
        return True

    # -- calls ---------------------------------------------------------------------------

    def _prepare(
        self, item: M.Call, spec: EndpointSpec[..., Any] | None
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any], bool]:
        """Return (function, args, kwargs, explicit_port) or raise what the caller should see."""
        method, payload, port, index = item.method, item.payload, item.port, item.rank
        if type(payload) is M.Undecodable:
            raise payload.error
        args, kwargs = payload
        if spec is None:
            # A plain method called through as_endpoint().
            fn = getattr(type(self.obj), method, None)
            if method.startswith("_") or not callable(fn):
                raise AttributeError(
                    f"{type(self.obj).__name__} has no endpoint {method!r}; "
                    f"endpoints: {sorted(self.endpoints)}"
                )
            return fn, args, kwargs, False
        if spec.explicit_response_port:
            from ._channel import Port

            args = (Port(port, index), *args)
        return spec.fn, args, kwargs, spec.explicit_response_port

    def _context(self, item: M.Call) -> Context:
        """The context of a call: the last call's when it went to the same slice (the
        common case: one caller's calls of an endpoint share their labels and sizes, from
        its cached route), so a burst of calls builds one."""
        spec = (item.rank, item.labels, item.sizes)
        ctx = self._last_context
        if ctx is None or ctx._spec != spec:
            ctx = self._last_context = Context(self.instance, spec=spec)
        return ctx

    def _call(
        self, item: M.Call, method: str, port: M.PortRef | None, spec: Any = _LOOKUP
    ) -> Generator[Any, Any, bool] | None:
        """Handle one call (``method`` and ``port``: its own, read once by the mailbox
        loop; ``spec``: the endpoint to run, looked up by ``method`` unless given). A sync
        endpoint runs here, to its reply: None. What must wait or await (an async or
        concurrent endpoint, a coroutine to await, deferred arguments, the actor's death)
        goes on in the generator returned, whose result says whether the actor lives.

        The common case (a sync endpoint that returns) is a plain call, not a generator of
        its own: it costs each message of a pipelined burst no generator, no delegation."""
        if spec is _LOOKUP:
            spec = self.endpoints.get(method)
        if spec is not None and (spec.is_async or spec.concurrent):
            return self._call_async(item, spec)
        ctx = self._context(item)
        token = current.set(ctx)
        explicit = False
        try:
            payload = item.payload
            if spec is not None and not spec.explicit_response_port and type(payload) is tuple:
                fn = spec.fn  # the common case, without _prepare's tuple
                args, kwargs = payload
            else:
                if isinstance(payload, _ext.DeferredArguments):
                    return self._call_deferred(item, payload, spec)
                fn, args, kwargs, explicit = self._prepare(item, spec)
                if spec is None and inspect.iscoroutinefunction(fn):  # a plain method, async
                    return self._call_async(item, spec)
            result = fn(self.obj, *args, **kwargs)
            if type(result) is _Coroutine:  # an async plain method via as_endpoint
                return self._await_result(item, ctx, result, explicit)
            if _ext.debug_sessions:  # the endpoint returned: its debug session ends
                _ext.debugger.call_ended(None)
            if not explicit:
                self._succeeded(item, result, port)
        except (trio.Cancelled, trio.RunFinishedError):
            raise  # the runtime is shutting down, or gone
        except BaseException as exc:
            cause = self._call_failed(item, exc, explicit)
            if cause is not None:
                return self._die_of_call(ctx, cause, exc)
        finally:
            current.reset(token)
        if self.stop_when_handled:  # a handler that replied through an explicit port
            self._queue_requested_stop()
        return None

    def _call_deferred(
        self,
        item: M.Call,
        deferred: _ext.DeferredArguments,
        spec: EndpointSpec[..., Any] | None,
    ) -> Generator[Any, Any, bool]:
        """A call whose arguments are completed here (:class:`~._extensions.DeferredArguments`):
        awaited on the loop, in mailbox order, then the call handled as any other, the
        endpoint being the one ``deferred.around`` gives. What resolving raises, the caller
        gets (as for arguments that could not be unpickled)."""
        rt = self.rt
        try:
            payload: Any = yield _Await(lambda: deferred.resolve(rt))
            spec = deferred.around(spec)
        except (trio.Cancelled, trio.RunFinishedError):
            raise
        except Exception as exc:
            payload = M.Undecodable(exc)
        call = M.Call(item.actor, item.method, item.port, item.rank, item.labels, item.sizes, payload)
        call.queued_at = item.queued_at
        rest = self._call(call, call.method, call.port, spec)
        if rest is None:
            return True
        return (yield from rest)

    def _call_failed(
        self, item: M.Call, exc: BaseException, explicit: bool
    ) -> S.FailureCause | None:
        """A call's handler raised ``exc``: why the actor must die, or None (see
        :meth:`_raised`)."""
        self.now.outcome = outcome_of(exc)
        self.now.watched = True
        if _ext.debug_sessions:  # post-mortem, if this call was at a breakpoint
            _ext.debugger.call_ended(exc)
        return self._raised(item, exc, explicit)

    def _die_of_call(
        self, ctx: Context, cause: S.FailureCause, exc: BaseException
    ) -> Generator[Any, Any, bool]:
        """The actor dies of a call (in that call's context, as its handler ran)."""
        token = current.set(ctx)
        try:
            yield from self._die(cause, exc)
        finally:
            current.reset(token)
        return False

    def _await_result(
        self, item: M.Call, ctx: Context, coro: Any, explicit: bool
    ) -> Generator[Any, Any, bool]:
        """A sync handler returned a coroutine (an async plain method called through
        ``as_endpoint``): await it on the loop, then reply."""
        token = current.set(ctx)
        self.coro = coro
        try:
            result = yield _Await(lambda: self.rt.run_coroutine(coro))
            if _ext.debug_sessions:
                _ext.debugger.call_ended(None)
            if not explicit:
                self._succeeded(item, result, item.port)
        except (trio.Cancelled, trio.RunFinishedError):
            raise
        except BaseException as exc:
            cause = self._call_failed(item, exc, explicit)
            if cause is not None:
                yield from self._die(cause, exc)
                return False
        finally:
            self.coro = None
            current.reset(token)
        self._queue_requested_stop()
        return True

    def _call_async(
        self, item: M.Call, spec: EndpointSpec[..., Any] | None
    ) -> Generator[Any, Any, bool]:
        """A call to an async endpoint (run on the loop, awaited by this driver) or to a
        concurrent one (started as its own task; the mailbox moves on)."""
        if isinstance(item.payload, _ext.DeferredArguments):
            return (yield from self._call_deferred(item, item.payload, spec))
        if spec is not None and spec.concurrent:
            yield _OnLoop(lambda: self._start_concurrent(item, spec))
            return True  # the mailbox moves on; the call runs as its own task
        token = current.set(self._context(item))
        explicit = False
        try:
            fn, args, kwargs, explicit = self._prepare(item, spec)
            obj = self.obj

            async def run_and_reply() -> None:
                coro = fn(obj, *args, **kwargs)
                self.coro = coro
                self._in_async_endpoint += 1
                # Cancelled by enqueue when the actor fails while the endpoint is suspended.
                with trio.CancelScope() as scope:
                    self._endpoint_scope = scope
                    try:
                        # trio and asyncio both work in it (run_coroutine), and its steps
                        # run in a greenlet: a breakpoint() in it waits without stopping
                        # the loop.
                        result = await _ext.debugger.drive(self.rt.run_coroutine(coro))
                    finally:
                        self._in_async_endpoint -= 1
                        self._endpoint_scope = None
                        self.coro = None
                        coro.close()  # cancelled before it started: no "never awaited"
                if scope.cancelled_caught or self._failed_at_await is not None:
                    # The actor failed meanwhile (also when the endpoint caught the
                    # cancellation and returned): _call_async answers DEAD and dies.
                    return
                if not explicit:
                    # From the loop, before an actor thread waiting on it wakes: the
                    # reply does not wait for that hop.
                    self._succeeded(item, result, item.port)

            yield _Await(run_and_reply)
        except (trio.Cancelled, trio.RunFinishedError):
            raise  # the runtime is shutting down, or gone
        except BaseException as exc:
            if self._failed_at_await is None:  # (else: what the cancel turned into)
                cause = self._call_failed(item, exc, explicit)
                if cause is not None:
                    yield from self._die(cause, exc)
                    return False
        finally:
            current.reset(token)
        failed = self._failed_at_await
        if failed is not None:
            self.now.outcome = "cancelled: the actor failed while it ran"
            self.now.watched = True
            # The actor failed while this endpoint was suspended: its caller gets the
            # actor's death (as a message queued behind it would), and it dies now.
            if item.port is not None:
                dead = self._dead_failure(failed)
                self._held_dead.append((item.port, item.rank, dead, item.method))
            yield from self._die(failed, None)
            return False
        self._queue_requested_stop()  # a handler that replied through an explicit port
        return True

    def _start_concurrent(self, item: M.Call, spec: EndpointSpec[..., Any]) -> None:
        """On the loop: start a concurrent endpoint's call as its own task. Its cancel scope
        is registered now: the actor may retire before the task starts."""
        scope = trio.CancelScope()
        self._running.add(scope)
        self.rt.nursery.start_soon(self._concurrent, item, scope, spec)

    async def _concurrent(
        self, item: M.Call, scope: trio.CancelScope, spec: EndpointSpec[..., Any]
    ) -> None:
        """A concurrent endpoint's call, cancelled when the actor retires (its caller then
        gets DEAD, as for a message still queued). With no caller waiting, its failure is
        queued as an Escalate: the actor dies in mailbox order."""
        token = current.set(self._context(item))
        explicit = False
        record: list[Any] = [item, self._clock(), None]
        outcome = _RETURNED
        self.concurrent[scope] = record
        try:
            with scope:
                try:
                    if scope.cancel_called:
                        await trio.lowlevel.checkpoint()  # retired before we started: raises
                    fn, args, kwargs, explicit = self._prepare(item, spec)
                    coro = record[2] = fn(self.obj, *args, **kwargs)
                    try:
                        result = await _ext.debugger.drive(self.rt.run_coroutine(coro))
                    finally:
                        coro.close()
                    if not explicit:
                        self._succeeded(item, result, item.port)
                except trio.Cancelled:
                    outcome = "cancelled: the actor stopped"
                    raise
                except BaseException as exc:
                    outcome = outcome_of(exc)
                    cause = self._raised(item, exc, explicit, hold=False)
                    if cause is not None:
                        self.enqueue(M.Escalate(cause))
                finally:
                    self.concurrent.pop(scope, None)
                    queued, started, now = item.queued_at, record[1], self._clock()
                    self.recent.append((item.method, item.port, queued, started, now, outcome))
                    trace = self.rt.trace
                    if trace is not None:
                        queued = queued if queued > _NEVER else started
                        trace.handled(self, item, queued, started, now, outcome)
                    self._running.discard(scope)
                    if not self._running and self._running_idle is not None:
                        self._running_idle.set()
            if scope.cancelled_caught and item.port is not None:
                self._reply(item.port, item.rank, M.DEAD, self._stopped_failure(), item.method)
        finally:
            current.reset(token)

    def _queue_requested_stop(self) -> None:
        """The handler that just ended asked its actor to stop: queue StopActor now, from
        the thread that ran it, so it is ahead of anything sent after the reply."""
        if self.stop_when_handled:
            self.stop_when_handled = False
            stop = M.StopActor(self.key, None)
            if self.threaded:
                self._queue.put(stop)
            else:
                self._deque.append(stop)
                self._wakeup.set()

    def _raised(
        self, item: M.Call, exc: BaseException, explicit: bool = False, hold: bool = True
    ) -> S.FailureCause | None:
        """An endpoint raised. Return why the actor must die, or None when the caller just
        gets the error (an ``Exception`` with a caller waiting). A body that answers through
        an explicit response port (``explicit``) and raises fails the actor, as in Monarch:
        it may have answered already, so no caller is sure to see the error otherwise.

        The caller of a call the actor dies of gets DEAD once the owner has been told
        (``_fail`` sends the held reply); with ``hold`` False (a concurrent call, whose
        actor dies later, in mailbox order) it gets it now."""
        self._queue_requested_stop()
        port, index, method = item.port, item.rank, item.method
        what = f"endpoint {self.name}.{method}"
        if isinstance(exc, Exception) and port is not None and not explicit:
            self._reply(port, index, M.ERROR, RemoteFailure.capture(exc), method)
            return None
        if isinstance(exc, Exception) and explicit:
            cause = _exception_cause(
                f"{what} raised (it answers through its response port, so the error has "
                "no caller to go to):",
                exc,
            )
            if port is not None:
                self._dead_reply(port, index, cause, method, hold)
            return cause
        if isinstance(exc, Exception):
            return _exception_cause(f"{what} raised with no caller waiting:", exc)
        cause = _exception_cause(f"{what} raised", exc)
        if port is not None:
            self._dead_reply(port, index, cause, method, hold)
        return cause

    def _dead_reply(
        self, port: M.PortRef, index: int, cause: S.FailureCause, method: str, hold: bool
    ) -> None:
        """DEAD to the caller of the call this actor dies of: held for ``_fail`` to send
        (``hold``), or now."""
        if hold:
            self._held_dead.append((port, index, self._dead_failure(cause), method))
        else:
            self._reply(port, index, M.DEAD, self._dead_failure(cause), method)

    def _succeeded(self, item: M.Call, result: Any, port: M.PortRef | None) -> None:
        """Reply ``result`` to ``port`` (``item``'s own)."""
        if self.stop_when_handled:
            self._queue_requested_stop()
        if port is None:
            return
        index = item.rank
        try:
            # Runtime.send_port, written out: three calls less per reply.
            address, port_id = port
            rt = self.rt
            box = rt.outboxes.get(address) or rt.outbox(address)
            box.send(_codec.encode_reply(port_id, index, M.OK, result))
        except transports.TransportError as exc:
            log.info("could not reply to %s: %s", port, exc)
        except SupervisionError as exc:
            log.info("could not reply to %s: %s", port, exc)  # the caller's proc is gone
        except Exception as exc:
            error = TypeError(
                f"endpoint {self.name}.{item.method} returned a value that cannot be sent: {exc}"
            )
            self._reply(port, index, M.ERROR, RemoteFailure.capture(error), item.method)

    def _succeeded_metered(self, item: M.Call, result: Any, port: M.PortRef | None) -> None:
        """:meth:`_succeeded` with metrics on (made the actor's own when it is made): the
        reply's bytes are counted."""
        if self.stop_when_handled:
            self._queue_requested_stop()
        if port is None:
            return
        try:
            address, port_id = port
            frame = _codec.encode_reply(port_id, item.rank, M.OK, result)
            self._metrics.replied(  # type: ignore[union-attr]
                item.method, len(frame) if type(frame) is bytes else frame_bytes(frame)
            )
            rt = self.rt
            box = rt.outboxes.get(address) or rt.outbox(address)
            box.send(frame)
        except transports.TransportError as exc:
            log.info("could not reply to %s: %s", port, exc)
        except SupervisionError as exc:
            log.info("could not reply to %s: %s", port, exc)  # the caller's proc is gone
        except Exception as exc:
            error = TypeError(
                f"endpoint {self.name}.{item.method} returned a value that cannot be sent: {exc}"
            )
            self._reply(port, item.rank, M.ERROR, RemoteFailure.capture(error), item.method)

    def _reply(
        self,
        port: tuple[str, int],
        index: int,
        status: int,
        value: Any,
        endpoint: str | None = None,
    ) -> None:
        """Send a reply (an error, a death, an acknowledgement); ``endpoint``: the call's,
        whose reply bytes count with metrics on."""
        try:
            if endpoint is None or self._metrics is None:
                self.rt.send_port(port, index, status, value)
                return
            address, port_id = port
            frame = _codec.encode_reply(port_id, index, status, value)
            self._metrics.replied(endpoint, frame_bytes(frame))
            self.rt.send(address, frame)
        except Exception:
            log.exception("could not reply to %s for actor %s", port, self.name)

    # -- supervision ---------------------------------------------------------------------

    def _supervise_fn(self) -> Any:
        return getattr(self.obj, "__supervise__", None)

    def _supervised(
        self, failure: S.MeshFailure, result: Any, error: BaseException | None
    ) -> None:
        # The exception alone: the supervisor's cause says "__supervise__ raised <it> while
        # handling <the failure>".
        cause = None if error is None else _exception_cause("", error)
        handled = error is None and bool(result)
        self.rt.call_soon(
            lambda: self.rt.oversight.feed(S.SuperviseDone(self.key, failure, handled, cause))
        )

    async def _supervise_now(self, failure: S.MeshFailure) -> None:
        """Run ``__supervise__`` on the loop beside a suspended async endpoint (see
        :meth:`enqueue`); only awaitables are yielded on this path."""
        gen = self._supervise(failure)
        try:
            effect = gen.send(None)
            while True:
                assert type(effect) is _Await
                try:
                    value = await effect.fn()
                except BaseException as exc:
                    effect = gen.throw(exc)
                else:
                    effect = gen.send(value)
        except StopIteration:
            return

    def _supervise(self, failure: S.MeshFailure) -> Generator[Any, Any, None]:
        fn = self._supervise_fn()
        result, error = None, None
        token = current.set(Context(self.instance, self.point))
        try:
            if fn is not None:
                result = fn(failure)
                if inspect.iscoroutine(result):
                    coro = result
                    result = yield _Await(lambda: self.rt.run_coroutine(coro))
        except (trio.Cancelled, trio.RunFinishedError):
            raise
        except BaseException as exc:  # a SystemExit in __supervise__ fails the owner too
            error = exc
        finally:
            current.reset(token)
        self._supervised(failure, result, error)

    # -- dying and stopping --------------------------------------------------------------

    def _with_recent(self, cause: S.FailureCause) -> S.FailureCause:
        """The report of this actor's death ends with the calls it handled last (the flight
        recorder), the one it died of included."""
        busy = self.busy
        if busy is not None:  # the call it dies of, recorded now
            item, started = busy
            now = self._clock()
            entry = (item.method, item.port, item.queued_at, started, now, self.now.outcome)
            recent = [*self.recent, entry]
        else:
            recent = list(self.recent)
        if not recent:
            return cause
        lines = [f"last {len(recent)} call(s) {self.name} rank {self.point.rank} handled, newest last:"]
        lines += [f"  {handled(entry)}" for entry in recent[-RECENT:]]
        text = "\n".join(lines)
        trace = f"{cause.traceback.rstrip()}\n\n{text}" if cause.traceback else text
        return attrs.evolve(cause, traceback=trace)

    def _dead_failure(self, cause: S.FailureCause) -> RemoteFailure:
        # Names the actor as Monarch's supervision errors do: <module.Class name{'gpus': 1/2}>.
        return RemoteFailure(
            "regency.SupervisionError",
            f"The actor {self.instance} and all its descendants have failed: {cause.summary}",
            cause.traceback,
        )

    def _fail(self, cause: S.FailureCause) -> RemoteFailure:
        """The bookkeeping of a death: log, poison the proc (``Runtime.poison``: not the
        controller's), report to the owner."""
        failure = self._dead_failure(cause)
        log.error("%s\n%s", failure.message, cause.traceback)
        if self.rt.trace is not None:
            self.rt.trace.instant(actor_track(self), "actor failed", {"cause": cause.summary})
        rt = self.rt
        rt.call_soon(lambda: rt.poison(failure))
        address, _owner_key, _ = self.owner
        try:
            rt.post(address, M.Failed(self.key, self.point.rank, cause))
        except Exception as exc:
            log.warning("could not report the failure of %s to its owner: %s", self.name, exc)
        self._send_held_dead()
        return failure

    def _send_held_dead(self) -> None:
        """Send the DEAD replies held back until the owner was told (see ``_held_dead``)."""
        held, self._held_dead = self._held_dead, []
        for port, index, dead, method in held:
            self._reply(port, index, M.DEAD, dead, method)

    def _die(self, cause: S.FailureCause, exc: BaseException | None) -> Generator[Any, Any, None]:
        failure = self._fail(self._with_recent(cause))
        yield from self._wind_down(exc)
        self._retire(failure)

    def _stopped_failure(self) -> RemoteFailure:
        # Monarch's wording (``Supervision event: actor <...> has status: stopped``), then
        # Regency's.
        return RemoteFailure(
            "regency.SupervisionError",
            f"Supervision event: actor {self.instance} has status: stopped "
            f"(actor {self.name} rank {self.point.rank} was stopped)",
            "",
        )

    def _stop(self, port: tuple[str, int] | None) -> Generator[Any, Any, None]:
        yield from self._wind_down(None)
        self._retire(self._stopped_failure())
        if port is not None:
            self._reply(port, self.point.rank, M.OK, None)

    def _wind_down(self, exc: BaseException | None) -> Generator[Any, Any, None]:
        """Stop what this actor owns (children first), then run ``__cleanup__(exc)``."""
        owned = yield _OnLoop(lambda: self.rt.oversight.stop_owned(self.key))
        try:
            yield _Wait(owned, self.rt.config.stop_timeout + 1)
        except (trio.Cancelled, trio.RunFinishedError):
            raise
        except Exception as error:
            log.warning("stopping what %s owns: %s", self.name, error)
        if self._running:  # concurrent calls still running end before __cleanup__
            yield _Await(self._cancel_concurrent)
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is None:
            return
        timeout = self.rt.config.cleanup_timeout
        if inspect.iscoroutinefunction(cleanup):

            async def bounded() -> bool:
                with trio.move_on_after(timeout) as scope:
                    await self.rt.run_coroutine(self._as_actor(cleanup, exc))
                return not scope.cancelled_caught

            try:
                finished = yield _Await(bounded)
            except (trio.Cancelled, trio.RunFinishedError):
                raise
            except Exception:
                log.exception("__cleanup__ of %s raised", self.name)
                return
        else:
            finished = yield _Bounded(
                lambda: self._guard(lambda: self._as_actor(cleanup, exc)), timeout
            )
        if not finished:
            log.warning("__cleanup__ of %s took over %s s; abandoned", self.name, timeout)

    async def _cancel_concurrent(self) -> None:
        """Cancel the calls of concurrent endpoints still running and wait until they have
        finished (asyncio code in them sees ``CancelledError``), at most ``cleanup_timeout``."""
        if not self._running:
            return
        self._running_idle = trio.Event()
        for scope in list(self._running):
            scope.cancel()
        with trio.move_on_after(self.rt.config.cleanup_timeout):
            await self._running_idle.wait()

    def _in(self, context: Context, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn`` on another thread as this actor: its context and runtime."""
        from ._runtime import _runtime_var

        _runtime_var.set(self.rt)
        token = current.set(context)
        try:
            return fn(*args)
        finally:
            current.reset(token)

    def _as_actor(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn`` as this actor, outside any message (``__cleanup__``)."""
        return self._in(Context(self.instance, self.point), fn, *args)

    def _guard(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            log.exception("__cleanup__ of %s raised", self.name)
