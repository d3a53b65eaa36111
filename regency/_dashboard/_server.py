"""The dashboard's server: a starlette app under uvicorn, on an asyncio loop of its own in a
daemon thread of the controller process.

Every request must carry the dashboard's token, as ``?token=`` or as the cookie the page sets
(anything else: 403). Nothing reads the job until the page polls: each poll of the state asks
every proc for its stacks (on the runtime's loop, through ``_introspect.gather``, at most
every ``STATE_MAX_AGE`` seconds whoever asks), and while someone polls, a recorder task keeps
the trace rings on and drains them every second (``_trace.collect(stop=False)``) into the
last minutes of the timeline. A minute without a poll and the rings are stopped.

The runtime's state is read only on its own loop: :func:`on_runtime` runs a coroutine there
(``rt.start_soon``) and awaits its outcome from the dashboard's loop, which never blocks.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core import _trace
from ..core._introspect import gather, targets_of
from ..core._stacks import JobStacks, ProcStacks
from . import _model
from ._page import PAGE

if TYPE_CHECKING:
    from ..core._runtime import Runtime

log = logging.getLogger("regency.dashboard")

T = TypeVar("T")

#: Seconds each proc has to answer a poll's stacks request.
STACKS_TIMEOUT = 2.0
#: A state younger than this is shared by the polls that ask for it.
STATE_MAX_AGE = 0.9
#: Events each proc's ring holds between two drains of the recorder.
TRACE_CAPACITY = 50_000
#: The recorder drains the rings this often while the page polls.
DRAIN_EVERY = 1.0
#: Seconds without a poll after which the recorder stops the rings.
IDLE_STOP = 60.0
#: How much of the timeline the dashboard keeps (seconds).
TIMELINE_KEEP = 300.0


class RuntimeUnavailable(RuntimeError):
    """The controller's runtime did not answer (stopping, gone, or its loop is blocked)."""


async def on_runtime(rt: Runtime, fn: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Run ``fn()`` on the runtime's loop and await its outcome here (an asyncio loop of
    another thread), for at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if waiter.done():
            return
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(value)

    def report(value: Any, exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:  # the dashboard's loop is closed
            pass

    async def run() -> None:
        try:
            value = await fn()
        except Exception as exc:
            report(None, exc)
            return
        report(value, None)

    if rt.died is not None:
        raise RuntimeUnavailable(f"the controller's runtime died: {rt.died}")
    try:
        rt.start_soon(run)
    except (trio.RunFinishedError, RuntimeError) as exc:
        raise RuntimeUnavailable(f"the controller's runtime has stopped ({exc})") from None
    try:
        return await asyncio.wait_for(waiter, timeout)
    except TimeoutError:
        raise RuntimeUnavailable(
            f"the controller's runtime did not answer within {timeout:.3g} s"
        ) from None


class Dashboard:
    """One dashboard of one controller runtime: its socket, token, app and server thread."""

    def __init__(self, rt: Runtime, host: str, port: int) -> None:
        self.rt = rt
        self.token = secrets.token_urlsafe(24)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self.socket = sock
        self.host = host
        self.port: int = sock.getsockname()[1]
        where = f"[{host}]" if ":" in host else host
        self.url = f"http://{where}:{self.port}/?token={self.token}"
        #: The cookie the page sets (per port: two dashboards on one host keep theirs).
        self.cookie = f"regency_dashboard_{self.port}"
        self.timeline = _model.Timeline(TIMELINE_KEEP)
        self.timeline_note = ""
        self._state: tuple[float, _model.Snapshot, JobStacks] | None = None
        self._tree: dict[str, Any] | None = None
        self._state_lock: asyncio.Lock | None = None
        self._drain_lock: asyncio.Lock | None = None
        self._polled = 0.0
        self._recorder: asyncio.Task[None] | None = None
        #: The trace ring the dashboard started in the controller (None: not recording).
        self._ring: _trace.TraceRing | None = None
        #: (controller clock, time.monotonic()) when the timeline was last drained.
        self._drained_at: tuple[float, float] | None = None
        #: When the dashboard's rings were started (local time, for the page).
        self._since = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.app = TokenGuard(self._routes(), self.token, self.cookie)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        import uvicorn

        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,  # the program's logging stays as it is
            log_level="warning",
            access_log=False,
            http="h11",
            ws="none",
            server_header=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="regency-dashboard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
                runner.run(self._server.serve(sockets=[self.socket]))
        except BaseException as exc:  # a daemon thread: say why it ended
            log.warning("the dashboard at %s stopped: %r", self.url.split("?")[0], exc)
        finally:
            self.socket.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (the rings it started stop at their next idle check, or now)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        ring = self._ring
        if ring is not None:
            rt = self.rt

            async def off() -> None:
                if rt.trace is ring and not rt.config.trace_path:
                    await _trace.collect(rt, STACKS_TIMEOUT, stop=True)

            try:
                rt.start_soon(off)
            except Exception:  # the runtime has stopped: so have its rings
                pass

    # -- what the page asks ----------------------------------------------------------------

    def touch(self) -> None:
        """A poll: keep the recorder running while polls come."""
        self._polled = time.monotonic()
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.get_running_loop().create_task(self._record())

    async def read(self) -> tuple[float, _model.Snapshot, JobStacks]:
        """The controller's state and every proc's stacks, at most ``STATE_MAX_AGE`` old."""
        if self._state_lock is None:
            self._state_lock = asyncio.Lock()
        async with self._state_lock:
            cached = self._state
            if cached is not None and time.monotonic() - cached[0] < STATE_MAX_AGE:
                return cached
            rt = self.rt

            async def both() -> tuple[_model.Snapshot, JobStacks]:
                targets, children = targets_of(rt, None)
                procs = await gather(rt, targets, STACKS_TIMEOUT, children=children)
                return _model.snapshot(rt), JobStacks(tuple(procs), STACKS_TIMEOUT)

            snap, stacks = await on_runtime(rt, both, STACKS_TIMEOUT + 5)
            self._state = (time.monotonic(), snap, stacks)
            return self._state

    async def state(self) -> dict[str, Any]:
        _, snap, stacks = await self.read()
        tree = _model.build_state(snap, stacks)
        self._tree = tree
        return {"now": time.time(), **tree}

    async def actor(self, address: str, mesh: str, rank: int) -> dict[str, Any]:
        rt = self.rt

        async def one() -> list[ProcStacks]:
            child = rt.children.get(address)
            coords = tuple(child.coords) if child is not None else ()
            return await gather(rt, [(address, coords)], STACKS_TIMEOUT, children=False)

        if self._tree is None:
            await self.state()
        procs = await on_runtime(rt, one, STACKS_TIMEOUT + 5)
        return _model.actor_detail(JobStacks(tuple(procs), STACKS_TIMEOUT), address, mesh, rank,
                                   self._tree)  # fmt: skip

    async def stacks(self, address: str | None) -> dict[str, Any]:
        _, _, stacks = await self.read()
        return _model.stacks_view(stacks, address)

    async def timeline_view(self, window: float) -> dict[str, Any]:
        if self._drained_at is None:
            await self._drain()  # the first poll: start the rings
        _, snap, stacks = await self.read()  # the calls running now, from fresh stacks
        drained = self._drained_at
        if drained is None:
            now = 0.0
        else:
            now = drained[0] + (time.monotonic() - drained[1])
        running: list[tuple[str, str, str, float]] = []
        if drained is not None:
            running = _model.running_calls(stacks, snap.clock)
        view = self.timeline.view(now, window, running)
        view["note"] = self.timeline_note
        return view

    # -- the recorder ----------------------------------------------------------------------

    async def _record(self) -> None:
        """While the page polls: drain the rings every ``DRAIN_EVERY`` seconds. After
        ``IDLE_STOP`` seconds without a poll: stop them and end."""
        while True:
            if time.monotonic() - self._polled > IDLE_STOP:
                await self._stop_rings()
                return
            try:
                await self._drain()
            except RuntimeUnavailable as exc:
                self.timeline_note = str(exc)
            except Exception:
                log.exception("the dashboard's recorder failed a drain")
            await asyncio.sleep(DRAIN_EVERY)

    async def _drain(self) -> None:
        if self._drain_lock is None:
            self._drain_lock = asyncio.Lock()
        async with self._drain_lock:
            await self._drain_once()

    async def _drain_once(self) -> None:
        rt = self.rt
        ours = self._ring

        async def pull() -> tuple[str, list[_trace.ProcTrace], float]:
            ring = rt.trace
            if rt.config.trace_path or (ring is not None and ring is not ours):
                return "busy", [], rt.env.clock()
            _trace.start(rt, TRACE_CAPACITY)  # and in procs spawned since the last drain
            if ring is None:
                return "started", [], rt.env.clock()
            traces = await _trace.collect(rt, STACKS_TIMEOUT, stop=False)
            return "on", traces, rt.env.clock()

        async def pulled() -> tuple[str, list[_trace.ProcTrace], float, _trace.TraceRing | None]:
            how, traces, clock = await pull()
            return how, traces, clock, rt.trace

        how, traces, clock, ring = await on_runtime(rt, pulled, STACKS_TIMEOUT + 5)
        self._drained_at = (clock, time.monotonic())
        if how == "busy":
            self.timeline_note = (
                "a regency.trace() recording (or trace_path) is on: the timeline waits for it "
                "to end, so as not to take its events"
            )
            return
        if how == "started":
            self._ring = ring
            self._since = time.strftime("%H:%M:%S")
        self.timeline_note = f"recording since {self._since}: calls before it are not shown"
        self.timeline.add(traces, clock)

    async def _stop_rings(self) -> None:
        if self._drain_lock is None:
            self._drain_lock = asyncio.Lock()
        async with self._drain_lock:
            await self._stop_rings_once()

    async def _stop_rings_once(self) -> None:
        ring = self._ring
        if ring is None:
            return
        self._ring = None
        rt = self.rt

        async def off() -> list[_trace.ProcTrace]:
            if rt.trace is not ring or rt.config.trace_path:
                return []
            return await _trace.collect(rt, STACKS_TIMEOUT, stop=True)

        try:
            traces = await on_runtime(rt, off, STACKS_TIMEOUT + 5)
        except RuntimeUnavailable:
            return
        if self._drained_at is not None:
            self.timeline.add(traces, self._drained_at[0])
        self._drained_at = None
        self.timeline_note = ""

    # -- the app ---------------------------------------------------------------------------

    def _routes(self) -> Starlette:
        async def page(request: Request) -> Response:
            response = HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})
            response.set_cookie(
                self.cookie, self.token, httponly=True, samesite="strict", path="/"
            )
            return response

        async def state(request: Request) -> Response:
            self.touch()
            return await _answer(self.state())

        async def actor(request: Request) -> Response:
            self.touch()
            q = request.query_params
            try:
                rank = int(q.get("rank", ""))
            except ValueError:
                return JSONResponse({"error": "rank must be an integer"}, status_code=400)
            return await _answer(self.actor(q.get("address", ""), q.get("mesh", ""), rank))

        async def stacks(request: Request) -> Response:
            self.touch()
            return await _answer(self.stacks(request.query_params.get("proc") or None))

        async def timeline(request: Request) -> Response:
            self.touch()
            try:
                window = float(request.query_params.get("window", "60"))
            except ValueError:
                window = 60.0
            window = min(max(window, 1.0), TIMELINE_KEEP)
            return await _answer(self.timeline_view(window))

        return Starlette(
            routes=[
                Route("/", page),
                Route("/api/state", state),
                Route("/api/actor", actor),
                Route("/api/stacks", stacks),
                Route("/api/timeline", timeline),
            ]
        )


async def _answer(work: Awaitable[dict[str, Any]]) -> Response:
    try:
        return JSONResponse(await work, headers={"Cache-Control": "no-store"})
    except RuntimeUnavailable as exc:
        return JSONResponse({"error": str(exc)}, status_code=503)


class TokenGuard:
    """Refuses (403) every request that carries neither ``?token=`` nor the cookie."""

    def __init__(self, app: ASGIApp, token: str, cookie: str) -> None:
        self.app = app
        self.token = token.encode()
        self.cookie = cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no websockets, no lifespan
        connection = HTTPConnection(scope)
        offered = connection.query_params.get("token") or connection.cookies.get(self.cookie) or ""
        if not secrets.compare_digest(offered.encode(), self.token):
            refusal = PlainTextResponse(
                "403: this dashboard needs its token: open the URL that serve_dashboard() or "
                "`regency dashboard` printed",
                status_code=403,
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
