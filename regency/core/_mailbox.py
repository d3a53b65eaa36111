"""An actor's mailbox and the executor that handles its messages one at a time.

Two executors, chosen per actor class:

* **thread** (any sync endpoint): a dedicated thread pops the mailbox and runs sync endpoints
  directly, so an endpoint may block, including on another actor's ``.get()``. Async
  endpoints of such an actor run on the proc's trio loop while the thread waits, so handling
  stays one at a time.
* **trio** (only async endpoints): a trio task on the proc's loop pops the mailbox; no thread
  hop per message.

Replies are written from wherever the handler ran (``Connection.send_nowait`` is
thread-safe), without a hop back to the trio thread.

Mailbox items are records from :mod:`._messages` (``MailboxItem``): ``Call``, ``StopActor``,
``Supervise``, ``Escalate`` and ``Abandon``.

Failure (see docs/supervision.md): an endpoint that raises with no caller waiting, a
``BaseException`` out of an endpoint, a failed ``__init__`` or an unhandled failure of a mesh
this actor owns make the actor *die*: its proc is poisoned (refuses new actors), its owner
gets a FAILED report, what it owns is stopped, ``__cleanup__(exc)`` runs, and queued messages
bounce. Stopping does the same without the report.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, assert_never

import trio

from .. import supervision as S
from .. import transports
from . import _messages as M
from ._context import ActorInstance, Context, current
from ._endpoint import Actor, EndpointSpec, endpoints_of
from ._errors import RemoteFailure, SupervisionError
from ._future import Future
from ._shape import Extent, Point

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.actor")
_ABANDON = M.Abandon()


def _point(spec: tuple[int, Sequence[str], Sequence[int]]) -> Point:
    rank, labels, sizes = spec
    return Point(rank, Extent(labels, sizes))


def _exception_cause(what: str, exc: BaseException) -> S.FailureCause:
    failure = RemoteFailure.capture(exc)
    return S.FailureCause(f"{what} {failure.type_name}: {failure.message}", failure.traceback)


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
        # With a sync runner (the simulator) every actor is a trio task whose sync code goes
        # through the runner; otherwise an actor with sync endpoints gets its own thread.
        self.threaded = runtime.sync_runner is None and (
            not table or any(not e.is_async for e in table.values())
        )
        self._queue: queue.SimpleQueue[M.MailboxItem] = queue.SimpleQueue()
        self._deque: deque[M.MailboxItem] = deque()
        self._wakeup = trio.Event()

    # -- mailbox -------------------------------------------------------------------------

    def start(self) -> None:
        if self.threaded:
            threading.Thread(
                target=self._thread_main, name=f"actor {self.name}[{self.point.rank}]", daemon=True
            ).start()
        else:
            self.rt.nursery.start_soon(self._task_main, name=f"actor {self.name}")

    def enqueue(self, item: M.MailboxItem) -> None:
        """Called on the runtime's trio thread."""
        if self.threaded:
            self._queue.put(item)
        else:
            self._deque.append(item)
            self._wakeup.set()

    def abandon(self) -> None:
        """The runtime is going away: stop popping the mailbox."""
        self.enqueue(_ABANDON)

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        """From the actor thread: run ``fn`` on the trio thread and return its result."""
        return trio.from_thread.run_sync(fn, trio_token=self.rt.token)

    def _thread_main(self) -> None:
        from ._runtime import _runtime_var

        _runtime_var.set(self.rt)
        try:
            alive = self._init()
            get = self._queue.get
            while alive:
                item = get()
                match item:
                    case M.Call():
                        spec = self.endpoints.get(item.method)
                        if spec is not None and spec.is_async:
                            alive = trio.from_thread.run(
                                self._call_async, item, trio_token=self.rt.token
                            )
                            if self._pending_death is not None:
                                self._die_sync(*self._pending_death)
                        else:
                            alive = self._call_sync(item, spec)
                    case M.Supervise():
                        self._supervise_sync(item.failure)
                    case M.Escalate():
                        self._die_sync(item.cause, None)
                        return
                    case M.StopActor():
                        self._stop_sync(item.port)
                        return
                    case M.Abandon():
                        return
                    case _:
                        assert_never(item)
        except trio.RunFinishedError:
            return

    async def _task_main(self) -> None:
        alive = self._init()
        while alive:
            while not self._deque:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
            item = self._deque.popleft()
            match item:
                case M.Call():
                    alive = await self._call_async(item)
                case M.Supervise():
                    await self._supervise_async(item.failure)
                case M.Escalate():
                    await self._die_async(item.cause, None)
                    return
                case M.StopActor():
                    await self._stop_async(item.port)
                    return
                case M.Abandon():
                    return
                case _:
                    assert_never(item)

    def _retire(self, failure: RemoteFailure) -> None:
        """Leave the runtime's actor table; bounce whatever is still queued with ``failure``.

        Runs on the trio thread, where enqueues happen, so nothing slips in after the drain.
        """
        from ._runtime import bounce

        def retire() -> None:
            self.rt.actor_gone(self, failure)
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
            from ._mesh import Port

            args = (Port(port, index), *args)
        return spec.fn, args, kwargs, spec.explicit_response_port

    def _context(self, item: M.Call) -> Context:
        return Context(self.instance, spec=(item.rank, item.labels, item.sizes))

    def _call_sync(self, item: M.Call, spec: EndpointSpec[..., Any] | None) -> bool:
        """Handle one call on the actor's thread; False when the actor died of it."""
        token = current.set(self._context(item))
        try:
            fn, args, kwargs, explicit = self._prepare(item, spec)
            result = fn(self.obj, *args, **kwargs)
            if inspect.iscoroutine(result):  # an async plain method via as_endpoint
                result = trio.from_thread.run(
                    self.rt.run_coroutine, result, trio_token=self.rt.token
                )
        except BaseException as exc:
            cause = self._raised(item, exc)
            if cause is not None:
                self._die_sync(cause, exc)
                return False
        else:
            if not explicit:
                self._succeeded(item, result)
        finally:
            current.reset(token)
        return True

    async def _call_async(self, item: M.Call) -> bool:
        """Handle one call on the trio loop; False when the actor died of it."""
        spec = self.endpoints.get(item.method)
        context = self._context(item)
        token = current.set(context)
        try:
            fn, args, kwargs, explicit = self._prepare(item, spec)
            runner = self.rt.sync_runner
            if runner is not None and not inspect.iscoroutinefunction(fn):
                result = await runner(lambda: self._in(context, fn, self.obj, *args, **kwargs))
            else:
                result = fn(self.obj, *args, **kwargs)
            if inspect.iscoroutine(result):
                result = await self.rt.run_coroutine(result)
        except trio.Cancelled:
            raise  # the runtime is shutting down
        except BaseException as exc:
            cause = self._raised(item, exc)
            if cause is not None:
                if self.threaded:  # a mixed actor: the thread finishes dying
                    self._pending_death = (cause, exc)
                else:
                    await self._die_async(cause, exc)
                return False
        else:
            if not explicit:
                self._succeeded(item, result)
        finally:
            current.reset(token)
        return True

    def _raised(self, item: M.Call, exc: BaseException) -> S.FailureCause | None:
        """An endpoint raised. Return why the actor must die, or None when the caller just
        gets the error (an ``Exception`` with a caller waiting)."""
        port, index, method = item.port, item.rank, item.method
        what = f"endpoint {self.name}.{method}"
        if isinstance(exc, Exception) and port is not None:
            self._reply(port, index, M.ERROR, RemoteFailure.capture(exc))
            return None
        if isinstance(exc, Exception):
            return _exception_cause(f"{what} raised with no caller waiting:", exc)
        cause = _exception_cause(f"{what} raised", exc)
        if port is not None:
            self._reply(port, index, M.DEAD, self._dead_failure(cause))
        return cause

    def _succeeded(self, item: M.Call, result: Any) -> None:
        port, index = item.port, item.rank
        if port is None:
            return
        try:
            self.rt.send_port(port, index, M.OK, result)
        except transports.TransportError as exc:
            log.info("could not reply to %s: %s", port, exc)
        except SupervisionError as exc:
            log.info("could not reply to %s: %s", port, exc)  # the caller's proc is gone
        except Exception as exc:
            error = TypeError(
                f"endpoint {self.name}.{item.method} returned a value that cannot be sent: {exc}"
            )
            self._reply(port, index, M.ERROR, RemoteFailure.capture(error))

    def _reply(self, port: tuple[str, int], index: int, status: int, value: Any) -> None:
        try:
            self.rt.send_port(port, index, status, value)
        except Exception:
            log.exception("could not reply to %s for actor %s", port, self.name)

    # -- supervision ---------------------------------------------------------------------

    def _supervise_fn(self) -> Any:
        return getattr(self.obj, "__supervise__", None)

    def _supervised(
        self, failure: S.MeshFailure, result: Any, error: BaseException | None
    ) -> None:
        cause = None if error is None else _exception_cause("__supervise__ raised", error)
        handled = error is None and bool(result)
        self.rt.call_soon(
            lambda: self.rt.oversight.feed(S.SuperviseDone(self.key, failure, handled, cause))
        )

    def _supervise_sync(self, failure: S.MeshFailure) -> None:
        fn = self._supervise_fn()
        result, error = None, None
        token = current.set(Context(self.instance, self.point))
        try:
            if fn is not None:
                result = fn(failure)
                if inspect.iscoroutine(result):
                    result = trio.from_thread.run(
                        self.rt.run_coroutine, result, trio_token=self.rt.token
                    )
        except BaseException as exc:  # a SystemExit in __supervise__ fails the owner too
            error = exc
        finally:
            current.reset(token)
        self._supervised(failure, result, error)

    async def _supervise_async(self, failure: S.MeshFailure) -> None:
        fn = self._supervise_fn()
        result, error = None, None
        token = current.set(Context(self.instance, self.point))
        try:
            runner = self.rt.sync_runner
            if fn is not None and runner is not None and not inspect.iscoroutinefunction(fn):
                context = Context(self.instance, self.point)
                result = await runner(lambda: self._in(context, fn, failure))
            elif fn is not None:
                result = fn(failure)
            if inspect.iscoroutine(result):
                result = await self.rt.run_coroutine(result)
        except trio.Cancelled:
            raise
        except BaseException as exc:  # a SystemExit in __supervise__ fails the owner too
            error = exc
        finally:
            current.reset(token)
        self._supervised(failure, result, error)

    # -- dying and stopping --------------------------------------------------------------

    _pending_death: tuple[S.FailureCause, BaseException | None] | None = None

    def _dead_failure(self, cause: S.FailureCause) -> RemoteFailure:
        return RemoteFailure(
            "regency.SupervisionError",
            f"actor {self.name} rank {self.point.rank} failed: {cause.summary}",
            cause.traceback,
        )

    def _fail(self, cause: S.FailureCause) -> RemoteFailure:
        """The bookkeeping of a death: log, poison the proc, report to the owner."""
        failure = self._dead_failure(cause)
        log.error("%s\n%s", failure.message, cause.traceback)
        rt = self.rt
        rt.call_soon(lambda: rt.poison(failure))
        address, _owner_key, _ = self.owner
        try:
            rt.post(address, M.Failed(self.key, self.point.rank, cause))
        except Exception as exc:
            log.warning("could not report the failure of %s to its owner: %s", self.name, exc)
        return failure

    def _die_sync(self, cause: S.FailureCause, exc: BaseException | None) -> None:
        failure = self._fail(cause)
        self._wind_down_sync(exc)
        self._retire(failure)

    async def _die_async(self, cause: S.FailureCause, exc: BaseException | None) -> None:
        failure = self._fail(cause)
        await self._wind_down_async(exc)
        self._retire(failure)

    def _stopped_failure(self) -> RemoteFailure:
        return RemoteFailure(
            "regency.SupervisionError", f"actor {self.name} rank {self.point.rank} was stopped", ""
        )

    def _stop_sync(self, port: tuple[str, int] | None) -> None:
        self._wind_down_sync(None)
        self._retire(self._stopped_failure())
        if port is not None:
            self._reply(port, self.point.rank, M.OK, None)

    async def _stop_async(self, port: tuple[str, int] | None) -> None:
        await self._wind_down_async(None)
        self._retire(self._stopped_failure())
        if port is not None:
            self._reply(port, self.point.rank, M.OK, None)

    def _wind_down_sync(self, exc: BaseException | None) -> None:
        """Stop what this actor owns (children first), then run ``__cleanup__(exc)``."""
        owned: Future[None] = self._on_loop(lambda: self.rt.oversight.stop_owned(self.key))
        try:
            owned.get(self.rt.config.stop_timeout + 1)
        except Exception as error:
            log.warning("stopping what %s owns: %s", self.name, error)
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is None:
            return
        timeout = self.rt.config.cleanup_timeout
        if inspect.iscoroutinefunction(cleanup):

            async def bounded() -> None:
                with trio.move_on_after(timeout):
                    await self.rt.run_coroutine(self._as_actor(cleanup, exc))

            self._guard(lambda: trio.from_thread.run(bounded, trio_token=self.rt.token))
        else:
            worker = threading.Thread(
                target=self._guard, args=(lambda: self._as_actor(cleanup, exc),), daemon=True
            )
            worker.start()
            worker.join(timeout)
            if worker.is_alive():
                log.warning("__cleanup__ of %s took over %s s; abandoned", self.name, timeout)

    async def _wind_down_async(self, exc: BaseException | None) -> None:
        owned = self.rt.oversight.stop_owned(self.key)
        with trio.move_on_after(self.rt.config.stop_timeout + 1):
            try:
                await owned
            except Exception as error:
                log.warning("stopping what %s owns: %s", self.name, error)
        cleanup = getattr(self.obj, "__cleanup__", None)
        if cleanup is None:
            return
        with trio.move_on_after(self.rt.config.cleanup_timeout) as scope:
            try:
                if inspect.iscoroutinefunction(cleanup):
                    await self.rt.run_coroutine(self._as_actor(cleanup, exc))
                elif self.rt.sync_runner is not None:
                    await self.rt.sync_runner(lambda: self._as_actor(cleanup, exc))
                else:
                    await trio.to_thread.run_sync(
                        self._as_actor, cleanup, exc, abandon_on_cancel=True
                    )
            except Exception:
                log.exception("__cleanup__ of %s raised", self.name)
        if scope.cancelled_caught:
            log.warning("__cleanup__ of %s took too long; abandoned", self.name)

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
