"""The proc's side of the debugger: ``breakpoint()`` in an endpoint opens a remote pdb.

In a proc, ``sys.breakpointhook`` starts a :class:`RemotePdb` whose input and output are
calls to the job's :class:`~regency._debugger._controller.DebugController` (in the
controller process). A session lasts until its endpoint returns; an endpoint that raises
after a breakpoint first opens a post-mortem session at the raise.

Waiting for input must never block the proc's trio loop, which async endpoints of every actor
in the proc share. A sync endpoint waits on its actor's own thread. An async endpoint runs on
the loop itself, so its coroutine is driven inside a greenlet (:func:`drive`): when its pdb
waits, the greenlet switches back to the loop's task, which awaits the answer like any other
await while the loop serves everyone else, then switches back into pdb.
"""

from __future__ import annotations

import bdb
import inspect
import os
import pdb
import socket
import sys
import threading
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

import trio

from ..core import _extensions
from ..core._context import Context
from ..core._context import current as current_context
from ..core._future import Future

try:
    import greenlet
except ImportError:  # an interpreter without it (HostMesh.with_python_executable)
    greenlet = None

R = TypeVar("R")

#: The remote pdb of each endpoint call being debugged, by the call's Context (one object
#: per call, seen alike by its thread, its task and a greenlet driving it).
_by_call: dict[Context, RemotePdb] = {}
# How many sessions are open in this process is core's ``_extensions.debug_sessions``: the
# mailbox tests it after every call, and calls call_ended only when it is not 0.

_CONTROLLER_NAME = "debug_controller"
_controller: Any = None


def _debug_controller() -> Any:
    global _controller
    if _controller is None:
        from ..core._singletons import get_or_spawn_controller
        from ._controller import DebugController

        _controller = wait(get_or_spawn_controller(_CONTROLLER_NAME, DebugController))
    return _controller


# -- waiting without blocking the loop -----------------------------------------------------------


_Driven: Any = None
if greenlet is not None:

    class _Driven(greenlet.greenlet):  # type: ignore[no-redef,misc]
        """A greenlet running an async endpoint's coroutine steps (see :func:`drive`)."""


def wait(awaitable: Future[R]) -> R:
    """Wait for a regency ``Future`` from pdb's code: on an actor thread by blocking; inside a
    driven coroutine by switching to the loop's task, which awaits it."""
    current = greenlet.getcurrent() if greenlet is not None else None
    if _Driven is not None and isinstance(current, _Driven):
        tracer = sys.gettrace()
        sys.settrace(None)  # the loop's other tasks must not run under pdb's tracer
        try:
            ok, value = current.parent.switch(("wait", awaitable))
        finally:
            sys.settrace(tracer)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]
    from ..core._controller import current_runtime

    if current_runtime().on_runtime_thread():
        raise RuntimeError(
            "breakpoint() on the proc's trio loop outside a driven endpoint cannot wait for "
            "the debugger without stopping the loop"
        )
    return awaitable.get()


def _steps(coro: Coroutine[Any, Any, Any]) -> tuple[str, Any]:
    """In a driving greenlet: step ``coro``, handing each trap to the driver."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            trap = coro.throw(error) if error is not None else coro.send(value)
        except StopIteration as stop:
            if _extensions.debug_sessions:
                call_ended(None)
            return ("done", stop.value)
        except BaseException as exc:
            if _extensions.debug_sessions:
                call_ended(exc)  # a post-mortem here, where pdb can wait off the loop
            return ("raise", exc)
        tracer = sys.gettrace()
        if tracer is not None:
            sys.settrace(None)  # trio's other tasks must not run under pdb's tracer
        value, error = greenlet.getcurrent().parent.switch(("yield", trap))
        if tracer is not None:
            sys.settrace(tracer)


def _serve_steps(coro: Coroutine[Any, Any, Any]) -> None:
    """A driving greenlet's life: drive one coroutine after another (starting a greenlet
    costs tens of microseconds; switching into an idle one, one or two)."""
    while True:
        outcome = _steps(coro)
        coro = greenlet.getcurrent().parent.switch(outcome)


class _Idle(threading.local):
    """Driving greenlets between calls, per thread (a greenlet lives on one thread; a
    process may run several loops: a controller's and a simulation's)."""

    def __init__(self) -> None:
        self.greenlets: list[Any] = []


_idle = _Idle()


@types.coroutine
def _drive(coro: Coroutine[Any, Any, R]) -> Generator[Any, Any, R]:
    idle = _idle.greenlets
    child = idle.pop() if idle else _Driven(_serve_steps)
    here = greenlet.getcurrent()
    if child.parent is not here:
        child.parent = here
    # The task's own context, not a copy: what the coroutine sets stays visible to code that
    # reads the task's context directly (trio-asyncio finds its loop there), as it would be
    # without the driver. Only one of the two greenlets runs at a time.
    child.gr_context = trio.lowlevel.current_task().context
    message = child.switch(coro)
    try:
        while True:
            kind = message[0]
            if kind == "yield":
                try:
                    sent = yield message[1]
                except BaseException as exc:
                    message = child.switch((None, exc))
                else:
                    message = child.switch((sent, None))
            elif kind == "wait":
                try:
                    result = yield from message[1].__await__()
                except BaseException as exc:
                    message = child.switch((False, exc))
                else:
                    message = child.switch((True, result))
            elif kind == "done":
                return message[1]  # type: ignore[no-any-return]
            else:
                raise message[1]
    finally:
        if message[0] in ("done", "raise") and len(idle) < 64:
            idle.append(child)  # finished cleanly: ready for the next call


def _undriven(coro: Coroutine[Any, Any, R]) -> Coroutine[Any, Any, R]:
    return coro


#: ``await drive(coro)`` awaits ``coro`` with its steps in a greenlet, so that a pdb inside
#: it can wait for the debugger without stopping the loop. Without greenlet installed it
#: awaits ``coro`` as it is (and a breakpoint in an async endpoint says it cannot wait).
drive = _drive if greenlet is not None else _undriven


# -- pdb ------------------------------------------------------------------------------------------


class _Output:
    """pdb's stdout: text collects until pdb flushes or reads, then goes in one message."""

    def __init__(self, owner: RemotePdb) -> None:
        self._owner = owner
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        return len(text)

    def flush(self) -> None:
        if not self._pending:
            return
        text, self._pending = "".join(self._pending), []
        owner = self._owner
        function, lineno = owner.where()
        owner.controller.write.call_one(owner.name, owner.rank, text, function, lineno)

    def writable(self) -> bool:
        return True


class _Input:
    """pdb's stdin: each line is a call to the controller."""

    def __init__(self, owner: RemotePdb) -> None:
        self._owner = owner

    def readline(self) -> str:
        owner = self._owner
        owner.stdout.flush()
        try:
            line: str = wait(owner.controller.read.call_one(owner.name, owner.rank))
        except Exception as exc:
            raise bdb.BdbQuit(f"the debugger went away: {exc}") from exc
        return line

    def readable(self) -> bool:
        return True


_MACHINERY = [
    "regency.*",
    "trio",
    "trio.*",
    "trio_asyncio",
    "trio_asyncio.*",
    "outcome",
    "outcome.*",
    "asyncio",
    "asyncio.*",
    "greenlet",
    "greenlet.*",
]


class RemotePdb(pdb.Pdb):
    """pdb whose terminal is the controller's debug server."""

    def __init__(self, name: str, rank: int, coords: dict[str, int]) -> None:
        self.name, self.rank, self.coords = name, rank, coords
        self.controller = _debug_controller()
        super().__init__(
            stdin=_Input(self),  # type: ignore[arg-type]
            stdout=_Output(self),  # type: ignore[arg-type]
            # Stepping never stops in the machinery between the user's frames (the driver,
            # the asyncio bridge, trio) when a coroutine suspends and resumes.
            skip=_MACHINERY,
        )
        self.use_rawinput = False
        self.prompt = "(Pdb) "
        self._started = False

    def start(self) -> None:
        if self._started:
            return
        from ..core._controller import current_runtime

        wait(
            self.controller.session_start.call_one(
                self.name, self.rank, self.coords, socket.gethostname(),
                current_runtime().address,
            )
        )
        self._started = True
        _extensions.debug_sessions += 1

    def where(self) -> tuple[str | None, int | None]:
        frame = self.curframe
        if frame is None:
            return None, None
        module = inspect.getmodulename(frame.f_code.co_filename) or "?"
        return f"{module}.{frame.f_code.co_name}", frame.f_lineno

    def dispatch_exception(self, frame: types.FrameType, arg: Any) -> Any:
        # bdb stops at a StopIteration in any frame after a `next` at a coroutine's last
        # statement, even in a skipped module: the machinery's own StopIterations are not
        # the user's business.
        if self.skip and self.is_skipped_module(frame.f_globals.get("__name__", "")):
            return self.trace_dispatch
        return super().dispatch_exception(frame, arg)

    def do_clear(self, arg: str) -> bool | None:
        if not arg:  # plain pdb would ask for confirmation on stdin
            self.clear_all_breaks()
            return None
        return super().do_clear(arg)

    def end(self) -> None:
        """The endpoint returned: tell the controller and stop tracing."""
        sys.settrace(None)
        self.stdout.flush()
        if self._started:
            self._started = False
            _extensions.debug_sessions -= 1
            try:
                wait(self.controller.session_end.call_one(self.name, self.rank))
            except Exception:
                pass


def remote_breakpointhook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` in procs: a remote pdb for the actor running now."""
    ctx = current_context.get()
    frame = sys._getframe(1)
    if ctx is None:  # not inside an endpoint: no session to attach to, and no terminal
        print(
            f"regency: breakpoint() at {frame.f_code.co_filename}:{frame.f_lineno} ignored: "
            "in a proc, breakpoints work inside actor endpoints",
            file=sys.stderr,
            flush=True,
        )
        return
    debugger = _by_call.get(ctx)
    if debugger is None:
        point = ctx.actor_instance.rank
        debugger = RemotePdb(ctx.actor_instance.name, point.rank, dict(point))
        _by_call[ctx] = debugger
    debugger.start()
    debugger.set_trace(frame)


def call_ended(exc: BaseException | None) -> None:
    """Called by the mailbox after an endpoint (only while sessions are open): post-mortem
    at the raise if this call was being debugged, then the end of its session."""
    ctx = current_context.get()
    debugger = _by_call.pop(ctx, None) if ctx is not None else None
    if debugger is None:
        return
    try:
        quit_ = isinstance(exc, bdb.BdbQuit)  # the person typed `quit`: no post-mortem of it
        if isinstance(exc, Exception) and not quit_ and exc.__traceback__ is not None:
            debugger.message(
                f"Post-mortem: the endpoint raised {type(exc).__name__}: {exc}"
            )
            debugger.reset()
            debugger.interaction(None, exc.__traceback__)
    except bdb.BdbQuit:
        pass
    finally:
        debugger.end()


def install_breakpoint_hook() -> None:
    """In a proc: ``breakpoint()`` opens a remote session (``PYTHONBREAKPOINT`` still wins)."""
    if os.environ.get("PYTHONBREAKPOINT") is None:
        sys.breakpointhook = remote_breakpointhook
