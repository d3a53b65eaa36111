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
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from . import _messages as M
from ._context import ActorInstance, Context, current
from ._endpoint import Actor, EndpointSpec, endpoints_of
from ._errors import RemoteFailure
from ._shape import Extent, Point

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.actor")
_STOP = ("abandon",)


def _point(spec: tuple[int, list[str], list[int]]) -> Point:
    rank, labels, sizes = spec
    return Point(rank, Extent(labels, sizes))


class ActorCell:
    def __init__(
        self,
        runtime: Runtime,
        key: str,
        name: str,
        point: tuple[int, list[str], list[int]],
        payload: Any,
        init_port: tuple[str, int] | None,
    ) -> None:
        self.rt = runtime
        self.key = key
        self.name = name
        self.point = _point(point)
        self._payload = payload
        self._init_port = init_port
        self.instance: ActorInstance = ActorInstance(
            name, key, self.point, runtime.proc_id, runtime.address
        )
        self.obj: Any = None
        self.endpoints: dict[str, EndpointSpec[..., Any]] = {}
        self.failure: RemoteFailure | None = None
        cls = payload[0] if isinstance(payload, tuple) else None
        table = endpoints_of(cls) if isinstance(cls, type) else {}
        self.threaded = not table or any(not e.is_async for e in table.values())
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._deque: deque[tuple[Any, ...]] = deque()
        self._wakeup = trio.Event()
        self._done = False

    # -- mailbox -------------------------------------------------------------------------

    def start(self) -> None:
        if self.threaded:
            threading.Thread(
                target=self._thread_main,
                name=f"actor {self.name}[{self.point.rank}]",
                daemon=True,
                # Each actor thread starts from an empty context: no leaking of the spawner's.
                args=(),
            ).start()
        else:
            self.rt.nursery.start_soon(self._task_main, name=f"actor {self.name}")

    def enqueue(self, item: tuple[Any, ...]) -> None:
        """Called on the runtime's trio thread."""
        if self.threaded:
            self._queue.put(item)
        else:
            self._deque.append(item)
            self._wakeup.set()

    def abandon(self) -> None:
        """The runtime is going away: stop popping the mailbox."""
        self.enqueue(_STOP)

    def _thread_main(self) -> None:
        if not self._init_sync():
            return
        get = self._queue.get
        while True:
            item = get()
            kind = item[0]
            if kind == "call":
                spec = self.endpoints.get(item[1])
                if spec is not None and spec.is_async:
                    try:
                        alive = trio.from_thread.run(
                            self._call_async, item, trio_token=self.rt.token
                        )
                    except trio.RunFinishedError:
                        return
                else:
                    alive = self._call_sync(item, spec)
                if not alive:
                    return
            elif kind == "stop":
                self._stop(item[1])
                return
            else:
                return

    async def _task_main(self) -> None:
        if not self._init_sync():
            return
        while True:
            while not self._deque:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
            item = self._deque.popleft()
            kind = item[0]
            if kind == "call":
                if not await self._call_async(item):
                    return
            elif kind == "stop":
                self._stop(item[1])
                return
            else:
                return

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

    # -- handling ------------------------------------------------------------------------

    def _init_sync(self) -> bool:
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
            self.failure = RemoteFailure.capture(exc)
            log.error(
                "actor %s rank %s failed in __init__:\n%s",
                self.name,
                self.point.rank,
                self.failure.traceback,
            )
            self._retire(self._init_failure())
            if self._init_port is not None:
                self._reply(self._init_port, self.point.rank, M.ERROR, self.failure)
            return False
        finally:
            current.reset(token)
        if self._init_port is not None:
            self._reply(self._init_port, self.point.rank, M.OK, None)
        return True

    def _init_failure(self) -> RemoteFailure:
        assert self.failure is not None
        f = self.failure
        return RemoteFailure(
            f.type_name,
            f"actor {self.name} rank {self.point.rank} failed in __init__: {f.message}",
            f.traceback,
            f.pickled,
        )

    def _prepare(
        self, item: tuple[Any, ...], spec: EndpointSpec[..., Any] | None
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any], bool]:
        """Return (function, args, kwargs, explicit_port) or raise what the caller should see."""
        _, method, payload, port, index, _msg_point = item
        if isinstance(payload, BaseException):
            raise payload
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

    def _context(self, item: tuple[Any, ...]) -> Context:
        return Context(self.instance, spec=item[5])

    def _call_sync(self, item: tuple[Any, ...], spec: EndpointSpec[..., Any] | None) -> bool:
        """Handle one call on the actor's thread; False when the actor died of it."""
        token = current.set(self._context(item))
        try:
            fn, args, kwargs, explicit = self._prepare(item, spec)
            result = fn(self.obj, *args, **kwargs)
            if inspect.iscoroutine(result):  # an async plain method via as_endpoint
                coro = result
                result = trio.from_thread.run(lambda: coro, trio_token=self.rt.token)
        except Exception as exc:
            self._failed(item, exc)
        except BaseException as exc:
            self._fatal(item, exc)
            return False
        else:
            if not explicit:
                self._succeeded(item, result)
        finally:
            current.reset(token)
        return True

    async def _call_async(self, item: tuple[Any, ...]) -> bool:
        """Handle one call on the trio loop; False when the actor died of it."""
        spec = self.endpoints.get(item[1])
        token = current.set(self._context(item))
        try:
            fn, args, kwargs, explicit = self._prepare(item, spec)
            result = fn(self.obj, *args, **kwargs)
            if inspect.iscoroutine(result):
                result = await result
        except Exception as exc:
            self._failed(item, exc)
        except trio.Cancelled:
            raise  # the runtime is shutting down
        except BaseException as exc:
            self._fatal(item, exc)
            return False
        else:
            if not explicit:
                self._succeeded(item, result)
        finally:
            current.reset(token)
        return True

    def _fatal(self, item: tuple[Any, ...], exc: BaseException) -> None:
        """A BaseException (SystemExit, KeyboardInterrupt, ...) escaped an endpoint: the
        actor fails, its caller hears why, and later messages bounce. Its proc lives on."""
        failure = RemoteFailure.capture(exc)
        dead = RemoteFailure(
            failure.type_name,
            f"actor {self.name} rank {self.point.rank} failed: "
            f"{failure.type_name}: {failure.message}",
            failure.traceback,
            failure.pickled,
        )
        log.error("actor %s rank %s failed:\n%s", self.name, self.point.rank, failure.traceback)
        port, index = item[3], item[4]
        if port is not None:
            self._reply(port, index, M.DEAD, dead)
        self._retire(dead)

    def _succeeded(self, item: tuple[Any, ...], result: Any) -> None:
        port, index = item[3], item[4]
        if port is None:
            return
        try:
            self.rt.send_port(port, index, M.OK, result)
        except Exception as exc:
            self._failed(
                item,
                TypeError(
                    f"endpoint {self.name}.{item[1]} returned a value that cannot be sent: {exc}"
                ),
            )

    def _failed(self, item: tuple[Any, ...], exc: Exception) -> None:
        port, index = item[3], item[4]
        failure = RemoteFailure.capture(exc)
        if port is None:
            # Nobody waits for this result. Supervision of such failures is issue #3's
            # job; until then the failure is logged with its traceback and the actor goes on.
            log.error(
                "endpoint %s.%s raised with no caller waiting (rank %s):\n%s",
                self.name,
                item[1],
                self.point.rank,
                failure.traceback,
            )
            return
        self._reply(port, index, M.ERROR, failure)

    def _reply(self, port: tuple[str, int], index: int, status: int, value: Any) -> None:
        try:
            self.rt.send_port(port, index, status, value)
        except Exception:
            log.exception("could not reply to %s for actor %s", port, self.name)

    def _stop(self, port: tuple[str, int] | None) -> None:
        failure = RemoteFailure(
            "regency.SupervisionError",
            f"actor {self.name} rank {self.point.rank} was stopped",
            "",
        )
        self._retire(failure)
        if port is not None:
            self._reply(port, self.point.rank, M.OK, None)


