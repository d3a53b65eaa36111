"""Monarch's ``monarch.actor`` names, under ``regency.actor``.

Porting a Monarch program is changing ``monarch`` to ``regency`` in its imports; see
docs/porting.md for every difference.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, final
from urllib.parse import urlsplit

from . import _actor_config as config
from .config import ChannelTransport
from .config import configure as _configure
from .core import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Context,
    Endpoint,
    Extent,
    Future,
    HostMesh,
    Point,
    Port,
    PortReceiver,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    _waiting,
    as_endpoint,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    proc_mesh,
    this_host,
    this_proc,
)
from .core._adverbs import send as _send
from .core._bootstrap_command import BootstrapCommand, default_bootstrap_cmd
from .core._controller import shutdown_context
from .core._hosts import attach_to_workers as _attach_to_workers
from .core._hosts import check_tls_arguments
from .core._oversight import UnhandledFault, default_unhandled_fault_hook
from .core._worker_loop import run_worker_loop_forever as _run_worker_loop
from .supervision import MeshFailure
from .telemetry import get_meter, span, traced

if TYPE_CHECKING:
    import asyncio  # imported where used: it costs 20-30 ms of a start (core/_aio.py)

#: Called with a :class:`MeshFailure` that no owner handled. The default prints the report
#: and stops the program (exit status 1) within a few seconds, also when the main thread
#: sleeps or waits on a future. Assign your own; one that returns drops the fault.
unhandled_fault_hook = default_unhandled_fault_hook

config.install_log_prefix()  # inside actors only: the controller's own logs are untouched

P = ParamSpec("P")
T = TypeVar("T")


# -- identities: Monarch's Uid and ProcId -----------------------------------------------------

#: Monarch's base58 alphabet for instance uids (Flickr's).
_BASE58 = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
#: An RFC 1035-style label: lowercase letter first, lowercase alphanumeric last, ``-``/``_``
#: between; at most 63 characters.
_LABEL = re.compile(r"[a-z](?:[a-z0-9_-]{0,61}[a-z0-9])?")
_UID = re.compile(rf"(?P<label>{_LABEL.pattern})?(?:<(?P<value>[^<>]*)>)?")
_U64 = 1 << 64


def _check_label(label: str) -> str:
    if not isinstance(label, str):
        raise TypeError(f"a uid label must be a str (got {label!r})")
    if _LABEL.fullmatch(label) is None:
        raise ValueError(
            f"invalid uid label {label!r}: 1 to 63 characters, lowercase letters, digits, "
            "'-' or '_', starting with a letter and ending with a letter or digit"
        )
    return label


def _encode58(value: int) -> str:
    if value == 0:
        return _BASE58[0]
    digits = []
    while value:
        value, digit = divmod(value, 58)
        digits.append(_BASE58[digit])
    return "".join(reversed(digits))


def _decode58(text: str) -> int:
    value = 0
    for char in text:
        digit = _BASE58.find(char)
        if digit < 0:
            raise ValueError(f"invalid base58 uid: {text}")
        value = value * 58 + digit
        if value >= _U64:
            raise ValueError(f"invalid base58 uid: {text} (more than 64 bits)")
    if not text:
        raise ValueError("invalid base58 uid: empty")
    return value


@final
class Uid:
    """A unique identifier, as Monarch's: a *singleton* named by its label (``service``), or
    an *instance*: a random 64-bit value with an optional display label (``service<2Mu...>``,
    ``<2Mu...>``). Instances are equal when their values are; their labels are only for
    display. Printed and parsed in Monarch's form; picklable."""

    __slots__ = ("_label", "_value")
    _label: str | None
    _value: int | None

    def __init__(self) -> None:
        raise TypeError(
            "Uid has no constructor: use Uid.anonymous(), Uid.instance(label), "
            "Uid.instance_from_value(value, label) or Uid.from_string(text)"
        )

    @classmethod
    def _make(cls, value: int | None, label: str | None) -> Uid:
        uid = object.__new__(cls)
        uid._value = value
        uid._label = label
        return uid

    @staticmethod
    def anonymous() -> Uid:
        """A fresh instance uid without a label."""
        return Uid._make(secrets.randbits(64), None)

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh instance uid, displayed with ``label`` when given."""
        return Uid._make(secrets.randbits(64), None if label is None else _check_label(label))

    @staticmethod
    def instance_from_value(value: int, label: str | None = None) -> Uid:
        """The instance uid of an explicit 64-bit ``value``."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"a uid value must be an int (got {value!r})")
        if not 0 <= value < _U64:
            raise ValueError(f"a uid value must fit in 64 bits, unsigned (got {value})")
        return Uid._make(value, None if label is None else _check_label(label))

    @staticmethod
    def from_string(uid: str) -> Uid:
        """Parse ``label`` (a singleton), ``label<base58>`` or ``<base58>`` (instances)."""
        if not isinstance(uid, str):
            raise TypeError(f"Uid.from_string takes a str (got {uid!r})")
        match = _UID.fullmatch(uid)
        if match is None or not uid:
            raise ValueError(f"invalid uid: {uid!r} is not label, label<base58> or <base58>")
        label, value = match.group("label"), match.group("value")
        if value is None:
            return Uid._make(None, label)
        try:
            return Uid._make(_decode58(value), label)
        except ValueError as exc:
            raise ValueError(f"invalid uid: {uid!r}: {exc}") from None

    @property
    def label(self) -> str | None:
        """The singleton's name, or the instance's display label (None when it has none)."""
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        return self._value is None

    @property
    def instance_value(self) -> int | None:
        """The instance's 64-bit value (None for a singleton)."""
        return self._value

    def __str__(self) -> str:
        if self._value is None:
            return self._label or ""
        return f"{self._label or ''}<{_encode58(self._value)}>"

    def __repr__(self) -> str:
        return f"Uid({self})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Uid):
            return NotImplemented
        if self._value is None or other._value is None:
            return self._value is None and other._value is None and self._label == other._label
        return self._value == other._value

    def __hash__(self) -> int:
        return hash(("singleton", self._label) if self._value is None else ("instance", self._value))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Uid.from_string, (str(self),))


@final
class ProcId:
    """The identity of a proc, as Monarch's: a :class:`Uid` (``service<2Mu...>`` for a
    worker's host service). Used in ProcAddr strings (``<proc-id>@<address>``, see
    :mod:`regency.job`'s service identity helpers); Regency's own procs are named by the
    strings in ``context().actor_instance.proc_id``."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid) -> None:
        if not isinstance(uid, Uid):
            raise TypeError(f"ProcId takes a Uid (got {uid!r})")
        self._uid = uid

    @staticmethod
    def from_string(proc_id: str) -> ProcId:
        try:
            return ProcId(Uid.from_string(proc_id))
        except ValueError as exc:
            raise ValueError(f"invalid proc id: {exc}") from None

    @property
    def uid(self) -> Uid:
        return self._uid

    @property
    def label(self) -> str | None:
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({self._uid})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcId):
            return NotImplemented
        return self._uid == other._uid

    def __hash__(self) -> int:
        return hash(("proc", self._uid))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (ProcId.from_string, (str(self),))


def _channel_address(address: str) -> str:
    """``address`` without a leading ProcAddr identity (``service<2Mu...>@tcp://h:p`` gives
    ``tcp://h:p``): Regency reaches a worker by its address and authenticates it with the
    job secret, so the identity Monarch routes by has no role here."""
    if not isinstance(address, str):
        return address
    head, sep, rest = address.partition("@")
    if sep and "://" not in head and "://" in rest:
        try:
            ProcId.from_string(head)
        except ValueError:
            return address
        return rest
    return address


# -- transports --------------------------------------------------------------------------------

_TRANSPORT_SHORTCUTS = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}


def enable_transport(transport: ChannelTransport | str) -> None:
    """Use ``transport`` between the procs spawned from now on (Monarch's
    ``enable_transport``): a :class:`ChannelTransport`, Monarch's shortcuts ``"tcp"``,
    ``"ipc"``, ``"tls"``, ``"metatls"``, ``"metatls-hostname"``, one of Regency's transports
    (``"unix"``, ``"nng+tcp"``, ...), or ``"tcp://HOST"`` to have procs listen on HOST (each
    on a free port: ``tcp://HOST:0``). The same as ``configure(default_transport=...)``; it may
    be called again later (Monarch: once, before anything else)."""
    from .core._config import _TRANSPORTS

    settings: dict[str, Any]
    if isinstance(transport, ChannelTransport):
        settings = {"default_transport": transport.regency_transport}
    elif not isinstance(transport, str):
        raise TypeError(f"enable_transport takes a ChannelTransport or a str (got {transport!r})")
    elif transport in _TRANSPORT_SHORTCUTS:
        settings = {"default_transport": _TRANSPORT_SHORTCUTS[transport].regency_transport}
    elif transport in _TRANSPORTS:
        settings = {"default_transport": transport}
    elif "://" in transport:
        parts = urlsplit(transport)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme != "tcp" or not parts.hostname or parts.path or port not in (None, 0):
            raise ValueError(
                "enable_transport: an explicit address must be tcp://HOST or tcp://HOST:0 "
                "(Regency binds each proc to a free port of HOST and picks unix socket paths "
                f"itself) (got {transport!r})"
            )
        settings = {"default_transport": "tcp", "tcp_host": parts.hostname}
    else:
        raise ValueError(
            f"enable_transport: unknown transport {transport!r}; use a ChannelTransport, one "
            f"of {sorted(_TRANSPORT_SHORTCUTS)}, one of {list(_TRANSPORTS)} or tcp://HOST"
        )
    _configure(**settings)


# -- returns_future ----------------------------------------------------------------------------

#: The tasks started by ``await`` on a returns_future Future, until they finish (asyncio
#: holds tasks only weakly).
_running: set[asyncio.Task[Any]] = set()
#: Per thread: its own asyncio loop for ``.get()`` (``loop``), and whether that thread is
#: inside a body it drives (``driving``).
_this_thread = threading.local()


class _ThreadLoop:
    """A thread's own asyncio loop, reused by each ``.get()`` there; closed with the thread."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()

    def __del__(self) -> None:
        if getattr(self, "pid", None) != os.getpid():
            return  # inherited through fork(): the parent's loop is not ours to close
        try:
            if not sys.is_finalizing():
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()


def _thread_loop() -> asyncio.AbstractEventLoop:
    current: _ThreadLoop | None = getattr(_this_thread, "loop", None)
    if current is None or current.pid != os.getpid() or current.loop.is_closed():
        current = _ThreadLoop()
        _this_thread.loop = current
    return current.loop


def _in_running_loop() -> bool:
    """Whether this thread is inside a running asyncio or trio loop."""
    import asyncio

    if asyncio._get_running_loop() is not None:
        return True
    import sniffio

    return bool(sniffio.thread_local.name)


def _hand_back_while_awaiting() -> Any:
    """On a simulator's lockstep thread of an actor (whose waits hand the baton back to the
    simulation, and whose ``await`` would wait on its own loop): make a body's ``await`` of
    a Regency Future on this thread's own loop wait that way too, so the simulation runs
    meanwhile (an asyncio wait would block it). Returns the waiter to restore (None: this
    thread's waiter runs freely, nothing changed)."""

    waiter = _waiting.current()
    if waiter.runs_freely:
        return None
    _waiting.bind(_AwaitByWaiting(waiter))
    return waiter


class _AwaitByWaiting:
    """A waiter whose ``await`` waits as its ``get()`` does (see above)."""

    serves_any_thread = False
    runs_freely = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def wait(self, fut: Future[Any], timeout: float | None) -> None:
        self.inner.wait(fut, timeout)

    async def wait_async(self, fut: Future[Any]) -> None:
        self.inner.wait(fut, None)

    def sending(self, send: Callable[[], None]) -> None:
        self.inner.sending(send)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks a body left on ``loop`` and let them finish, as ``asyncio.run``."""
    import asyncio

    leftovers = asyncio.all_tasks(loop)
    for task in leftovers:
        task.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.wait(leftovers))


def _stepped_in(
    ctx: contextvars.Context, coro: Coroutine[Any, Any, T]
) -> Generator[Any, Any, T]:
    """Run ``coro`` inside the awaiting coroutine, each step in ``ctx``: what it yields goes
    to the awaiter's driver (trio, or Regency's endpoint driver for asyncio futures)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            if error is None:
                yielded = ctx.run(coro.send, value)
            else:
                yielded = ctx.run(coro.throw, error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        try:
            value, error = (yield yielded), None
        except BaseException as exc:
            value, error = None, exc


class _BodyFuture(Future[T]):
    """The Future of a ``@returns_future`` call: the body runs when first observed."""

    __slots__ = ("_body", "_body_lock", "_name")

    def __init__(
        self,
        factory: Callable[[], Coroutine[Any, Any, T]],
        ctx: contextvars.Context,
        name: str,
    ) -> None:
        super().__init__()
        # The coroutine is made when first observed: one never observed never exists (no
        # "never awaited" warning, whatever order the garbage collector finalizes things in).
        self._body: tuple[Callable[[], Coroutine[Any, Any, T]], contextvars.Context] | None = (
            factory,
            ctx,
        )
        self._body_lock = threading.Lock()
        self._name = name

    def _take(self) -> tuple[Coroutine[Any, Any, T], contextvars.Context] | None:
        """The body, made now, for the first observer; None for the others."""
        with self._body_lock:
            body, self._body = self._body, None
        if body is None:
            return None
        factory, ctx = body
        try:
            return ctx.run(factory), ctx
        except BaseException as exc:
            self.set_exception(exc)
            raise

    def _settle_from(self, task: asyncio.Task[Any]) -> None:
        import asyncio

        if task.cancelled():
            self.set_exception(asyncio.CancelledError())
        elif task.exception() is not None:
            self.set_exception(task.exception())  # type: ignore[arg-type]
        else:
            self.set_result(task.result())

    def _start(
        self, taken: tuple[Coroutine[Any, Any, T], contextvars.Context], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Task[T]:
        coro, ctx = taken
        task = loop.create_task(coro, context=ctx)
        task.add_done_callback(self._settle_from)
        _running.add(task)
        task.add_done_callback(_running.discard)
        return task

    # -- observers -----------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T:
        """The first ``.get()`` runs the body on this thread's own asyncio loop until it
        finishes (a thread inside a running loop: on a helper thread); after ``timeout``
        seconds it cancels the body and raises ``TimeoutError``, which every observer then
        sees. Later ``.get()`` calls wait for the outcome, as on any Future."""
        if self.done():
            return super().get()
        if getattr(_this_thread, "driving", False):
            raise RuntimeError(
                "Future.get() cannot block inside a returns_future body; await the Future "
                "instead"
            )
        if _waiting.would_block_loop():
            raise RuntimeError(
                "Future.get() would block the runtime's event loop; "
                "use `await fut` inside async endpoints"
            )
        taken = self._take()
        if taken is None:
            return super().get(timeout)  # another observer runs the body
        if _in_running_loop():
            return self._drive_on_helper(taken, timeout)
        return self._drive(taken, timeout)

    def _timed_out(self, timeout: float | None) -> TimeoutError:
        return TimeoutError(f"returns_future {self._name} did not finish within {timeout} s")

    def _drive(
        self, taken: tuple[Coroutine[Any, Any, T], contextvars.Context], timeout: float | None
    ) -> T:
        import asyncio

        loop = _thread_loop()
        _this_thread.driving = True
        handed_back = _hand_back_while_awaiting()
        try:
            task = self._start(taken, loop)
            try:
                done, _ = loop.run_until_complete(asyncio.wait({task}, timeout=timeout))
            except BaseException:
                self.set_exception(asyncio.CancelledError())
                task.cancel()
                loop.run_until_complete(asyncio.wait({task}))
                raise
            if not done:
                error = self._timed_out(timeout)
                self.set_exception(error)  # first outcome wins: the body's cleanup cannot
                task.cancel()
                loop.run_until_complete(asyncio.wait({task}))
        finally:
            _this_thread.driving = False
            if handed_back is not None:
                _waiting.bind(handed_back)
            _cancel_leftovers(loop)
        return super().get()

    def _drive_on_helper(
        self, taken: tuple[Coroutine[Any, Any, T], contextvars.Context], timeout: float | None
    ) -> T:
        import asyncio

        loop = asyncio.new_event_loop()
        started = threading.Event()
        finished = threading.Event()
        box: dict[str, asyncio.Task[T]] = {}

        def run() -> None:
            _this_thread.driving = True
            try:
                box["task"] = self._start(taken, loop)
                started.set()
                loop.run_until_complete(asyncio.wait({box["task"]}))
                _cancel_leftovers(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                started.set()
                loop.close()
                finished.set()

        threading.Thread(target=run, name=f"returns_future {self._name}", daemon=True).start()
        if not finished.wait(timeout):
            self.set_exception(self._timed_out(timeout))
            started.wait()
            task = box.get("task")
            if task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:
                    pass  # the loop closed meanwhile: the body has finished
            finished.wait()
        return super().get()

    def __await__(self) -> Generator[Any, None, T]:
        taken = self._take()
        if taken is not None:
            import asyncio

            import sniffio

            if sniffio.current_async_library() == "asyncio":
                # A task on the awaiting loop: cancelling this await leaves the body running.
                self._start(taken, asyncio.get_running_loop())
            else:
                # trio, or Regency's driver of an async endpoint (trio and asyncio mixed):
                # the body runs inside this await, so what it awaits is served as the
                # awaiter's own awaits are.
                coro, ctx = taken
                try:
                    value = yield from _stepped_in(ctx, coro)
                except BaseException as exc:
                    if _is_cancellation(exc):
                        self.set_exception(asyncio.CancelledError(f"{self._name} was cancelled"))
                    else:
                        self.set_exception(exc)
                    raise
                self.set_result(value)
                return value
        return (yield from super().__await__())

    def __repr__(self) -> str:
        if self._body is not None:
            return f"<Future of returns_future {self._name}, not started>"
        return super().__repr__()


def _is_cancellation(exc: BaseException) -> bool:
    import asyncio

    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return True
    import trio

    return isinstance(exc, trio.Cancelled)


def returns_future(function: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Future[T]]:
    """Make an ``async def`` return a Regency :class:`Future` (Monarch's
    ``returns_future``), so synchronous callers ``.get()`` it and async ones ``await`` it.

    Calling the function starts nothing: it copies the caller's context variables, in which
    the body later runs. The first observer runs the body, once; every observer gets its
    outcome. ``await`` from asyncio runs it as a task on that loop (cancelling the await
    leaves it running); ``await`` inside a Regency async endpoint, or from trio, runs it
    within that await. ``.get()`` runs it on the calling thread's own asyncio loop, as
    ``asyncio.run`` does (inside a running loop: on a helper thread); its ``timeout``
    cancels the body. Arguments that do not fit raise ``TypeError`` at the call; a Future
    dropped unobserved never runs any of the body. Side effects
    that must happen at call time belong in a synchronous wrapper around the decorated
    function; for class and static methods put ``@classmethod``/``@staticmethod`` above it.
    """
    if not inspect.iscoroutinefunction(function):
        raise TypeError("returns_future requires an async function")
    name = getattr(function, "__qualname__", repr(function))
    try:
        signature: inspect.Signature | None = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(function)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> Future[T]:
        if signature is not None:
            signature.bind(*args, **kwargs)  # a bad call fails now, as calling it would
        factory = functools.partial(function, *args, **kwargs)
        return _BodyFuture(factory, contextvars.copy_context(), name)

    return wrapped


# -- the debugger ------------------------------------------------------------------------------


def debug_controller() -> Any:
    """The job's ``DebugController`` actor (Monarch's ``debug_controller()``): the singleton
    in the controller that holds every ``breakpoint()`` session and serves ``regency debug``
    (docs/debugging.md), spawned on first use. Its endpoints are Regency's: ``list()``,
    ``server_address()``, ``wait_pending_session(count=1)``. Blocks until it is running, so
    call it from the controller's threads or sync endpoints; async endpoints use ``await
    get_or_spawn_controller("debug_controller", DebugController)``."""
    from ._debugger import _remote
    from ._debugger._controller import DebugController

    if _remote._controller is None:
        _remote._controller = get_or_spawn_controller(
            _remote._CONTROLLER_NAME, DebugController
        ).get()
    return _remote._controller


# -- workers ---------------------------------------------------------------------------------


def run_worker_loop_forever(*, address: str, ca: str, private_key: object = None) -> None:
    """Serve this host to one controller at a time at ``address`` (``tcp://HOST:PORT``, or a
    ProcAddr ``<proc-id>@tcp://HOST:PORT``) until a controller shuts the host mesh down, or
    SIGTERM/SIGINT; then return (Monarch's ends the process). The job secret comes from
    ``REGENCY_SECRET`` (docs/jobs.md)."""
    _run_worker_loop(address=_channel_address(address), ca=ca, private_key=private_key)


def run_worker_loop_until_shutdown(*, address: str, ca: str, private_key: object = None) -> None:
    """Serve this host at ``address`` until its controller shuts the host mesh down
    (``HostMesh.shutdown()``), or SIGTERM/SIGINT, then return: Monarch's variant of
    :func:`run_worker_loop_forever` that returns instead of ending the process."""
    _run_worker_loop(address=_channel_address(address), ca=ca, private_key=private_key)


def attach_to_workers(
    workers: Sequence[str | Future[str]] | None = None, *args: Any, **kwargs: Any
) -> Any:
    """Attach to running workers and return a ``HostMesh`` with dim ``hosts`` (see
    :func:`regency.core._hosts.attach_to_workers` for the arguments: Regency's form
    ``attach_to_workers(workers, secret=None, lease=10.0)`` and Monarch's
    ``attach_to_workers(workers=..., ca="trust_all_connections", name=None)``). A worker
    address may be a ProcAddr (``<proc-id>@tcp://HOST:PORT``; the identity is not used),
    ``ipc:///PATH``, ``DIAL@BIND``, or a ``Future`` of any of these (waited for here)."""
    addresses: Any = workers
    if workers is not None and not isinstance(workers, str):
        # A worker address may also be a Future of one (Monarch's ``Future[str]``).
        addresses = [_channel_address(w.get() if isinstance(w, Future) else w) for w in workers]
    return _attach_to_workers(addresses, *args, **kwargs)


def send(
    endpoint: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Send to an endpoint's ranks; replies, if any, go to ``port`` (Monarch's ``send``).
    ``endpoint`` may also be a ``@remote`` function (inside ``mesh.activate()``, or over a
    mesh's tensors): it runs on every proc of the mesh (``selection="all"``) or on one
    (``"choose"``), and each proc's result (or error) goes to ``port``."""
    remote_module = sys.modules.get("regency._tensor_engine._remote")
    if remote_module is None or not isinstance(endpoint, remote_module.Remote):
        _send(endpoint, args, kwargs, port, selection)
        return
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be one of ('all', 'choose') (got {selection!r})")
    if port is None:
        endpoint.broadcast(*args, **kwargs)
        return
    futures = (
        [endpoint.choose(*args, **kwargs)]
        if selection == "choose"
        else list(endpoint.stream(*args, **kwargs))
    )

    def forward(fut: Future[Any]) -> None:
        exc = fut.exception(0)
        if exc is not None:
            port.exception(exc)
        else:
            port.send(fut.result(0))

    for fut in futures:
        fut.add_done_callback(functools.partial(forward, fut))


def hosts_from_config(name: str) -> Any:
    """Monarch's ``hosts_from_config`` (also in ``regency.job``): a host mesh of two workers
    on this machine, named ``name``."""
    from .job import hosts_from_config as _hosts_from_config

    return _hosts_from_config(name)


#: Lines of a starting worker's stderr kept for the error if it fails to start.
_STDERR_TAIL = 40
_WORKER_CHILD = "from regency.actor import _worker_child; _worker_child()"
#: What a worker prints once it listens (core/_worker.py).
_LISTENING = "regency worker listening on"


def _worker_child() -> None:
    """A worker started by :func:`start_worker_loop_forever`: serves until shut down, and
    stops (as on SIGTERM: its procs are killed first) when the process that started it is
    gone."""
    parent, address = int(sys.argv[1]), sys.argv[2]

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_parent, name="watch parent", daemon=True).start()
    _run_worker_loop(address=address, ca="trust_all_connections")


class _Pump(threading.Thread):
    """Copies a worker's output stream to ours, line by line, keeping the last lines; holds
    them back until :meth:`release` (a worker that fails to start shows its error once: in
    the exception)."""

    def __init__(self, stream: Any, to: Any, name: str, marker: str | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.stream = stream
        self.to = to
        self.tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._held: list[str] | None = []
        self._lock = threading.Lock()
        #: Set when a line containing ``marker`` passed (``found``), or the stream ended.
        self.marker = marker
        self.found = False
        self.seen = threading.Event()

    def run(self) -> None:
        try:
            for line in self.stream:
                if self.marker is not None and self.marker in line:
                    self.found = True
                    self.seen.set()
                with self._lock:
                    self.tail.append(line)
                    if self._held is not None:
                        self._held.append(line)
                        continue
                self._write(line)
        finally:
            self.seen.set()

    def _write(self, line: str) -> None:
        try:
            self.to.write(line)
            self.to.flush()
        except (OSError, ValueError):
            pass

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
            for line in held:
                self._write(line)

    def output(self) -> str:
        self.join(5.0)  # the stream ends with the worker
        with self._lock:
            return "".join(self.tail).strip() or "(no output)"


_BUILTIN_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "RuntimeError": RuntimeError,
    "FileNotFoundError": FileNotFoundError,
    "OSError": OSError,
    "PermissionError": PermissionError,
}


def _startup_error(address: str, status: int | None, stderr: _Pump) -> Exception:
    output = stderr.output()
    last = output.splitlines()[-1].strip()
    name, sep, message = last.partition(": ")
    kind = _BUILTIN_ERRORS.get(name.rsplit(".", 1)[-1]) if sep else None
    if kind is not None:
        return kind(message)
    return RuntimeError(f"the worker at {address} exited with status {status}: {output}")


def start_worker_loop_forever(*, address: str, ca: str, private_key: object = None) -> Future[None]:
    """Start a worker serving ``address`` (as :func:`run_worker_loop_forever`) and return a
    Future of its lifetime: ``None`` once a controller shut its host mesh down, an error if
    it failed. The worker runs in a process of its own, started from this one, and is
    listening when this returns; it stops (killing its procs) when this process ends, and
    goes on if the Future is dropped. Errors found at start (a bad address, no job secret)
    are raised here. Its output goes to this process's stdout and stderr."""
    check_tls_arguments(ca, private_key, "start_worker_loop_forever")
    if not isinstance(address, str):
        raise TypeError(
            f"start_worker_loop_forever: address must be a str like 'tcp://HOST:PORT' "
            f"(got {type(address).__name__})"
        )
    return _start_worker(address)[0]


def _start_worker(
    address: str, env: dict[str, str] | None = None
) -> tuple[Future[None], subprocess.Popen[str]]:
    """:func:`start_worker_loop_forever` with the worker's environment ``env`` (default:
    ours); also returns the worker's process."""
    from .core._config import current_config

    child = subprocess.Popen(
        [sys.executable, "-c", _WORKER_CHILD, str(os.getpid()), _channel_address(address)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert child.stdout is not None and child.stderr is not None
    stderr = _Pump(child.stderr, sys.stderr, "worker stderr")
    stdout = _Pump(child.stdout, sys.stdout, "worker stdout", marker=_LISTENING)
    stderr.start()
    stdout.start()
    timeout = current_config().spawn_timeout
    if not stdout.seen.wait(timeout):
        child.kill()
        child.wait()
        raise TimeoutError(f"the worker at {address} did not start listening within {timeout} s")
    if not stdout.found:
        raise _startup_error(address, child.wait(), stderr)
    stdout.release()
    stderr.release()
    lifetime: Future[None] = Future()

    def watch() -> None:
        status = child.wait()
        if status == 0:
            lifetime.set_result(None)
        else:
            lifetime.set_exception(
                RuntimeError(
                    f"the worker at {address} exited with status {status}: {stderr.output()}"
                )
            )

    threading.Thread(target=watch, name=f"worker {address}", daemon=True).start()
    return lifetime, child


__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "SupervisionError",
    "Uid",
    "UnhandledFault",
    "ValueMesh",
    "as_endpoint",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "hosts_from_config",
    "proc_mesh",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "send",
    "shutdown_context",
    "span",
    "start_worker_loop_forever",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]
