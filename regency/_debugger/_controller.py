"""The debug controller: one actor in the job's controller process that every remote pdb
talks to, and a TCP server (``regency debug`` connects to it) for the person debugging.

Procs reach it with ``get_or_spawn_controller("debug_controller", DebugController)``. Its
endpoints run on the controller's trio loop; ``read`` is concurrent, so a pdb waiting for
input never holds up the others. The server starts with the first session, on
``REGENCY_DEBUG_SERVER_HOST``:``REGENCY_DEBUG_SERVER_PORT`` (localhost:27000); one client at
a time (a new one replaces the old). A client's first line must be the server's token, which
the server writes to ``~/.regency/debug-<port>.token`` (mode 0600): pdb runs any Python in the
procs, so only this user may attach.
"""

from __future__ import annotations

import builtins
import logging
import math
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any

import attrs
import trio

from ..core._endpoint import Actor, concurrent_endpoint, endpoint
from ..core._ports import PortBase
from . import _commands as C

log = logging.getLogger("regency.debugger")

PROMPT = "regency_dbg> "
BANNER = (
    "\n\n************************ REGENCY DEBUGGER ************************\n"
    "Enter 'help' for a list of commands.\n"
    "Enter 'list' to show all active breakpoints.\n\n"
)
HELP = (
    "regency_dbg commands:\n"
    "\tattach <actor_name> <rank> - attach to a debug session (then 'detach' to leave it)\n"
    "\tlist - list all debug sessions\n"
    "\tquit - exit the debugger, leaving all sessions in place\n"
    "\tcast <actor_name> ranks(...) <command> - send a pdb command to a set of ranks of the\n"
    "\t\tactor mesh: one rank (ranks(1)), a list (ranks(1,4,6)), a slice\n"
    "\t\t(ranks(start?:stop?:step?)) or dims (ranks(dp=1:5:2, tp=3, pp=(3,6))).\n"
    "\tcontinue - clear all breakpoints and tell all ranks to continue\n"
    "\thelp - print this help message\n"
)


def token_path(port: int) -> str:
    """Where the server of ``port`` leaves its token: readable by this user only."""
    return os.path.join(os.path.expanduser("~"), ".regency", f"debug-{port}.token")


def _write_token(port: int, token: str) -> str:
    path = token_path(port)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def server_address() -> tuple[str, int]:
    host = os.environ.get("REGENCY_DEBUG_SERVER_HOST", "localhost")
    raw = os.environ.get("REGENCY_DEBUG_SERVER_PORT", "27000")
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(
            f"REGENCY_DEBUG_SERVER_PORT must be a port number (got {raw!r})"
        ) from None
    if not 0 <= port <= 65535:
        raise ValueError(f"REGENCY_DEBUG_SERVER_PORT must be within 0..65535 (got {port})")
    return host, port


@attrs.frozen(order=True)
class SessionInfo:
    """One row of ``list``."""

    actor_name: str
    rank: int
    coords: tuple[tuple[str, int], ...]
    hostname: str
    function: str | None
    lineno: int | None


class Session:
    """One rank at a breakpoint: what pdb wrote since the last input, and lines for it."""

    def __init__(
        self,
        name: str,
        rank: int,
        coords: dict[str, int],
        hostname: str,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.name, self.rank, self.coords, self.hostname = name, rank, coords, hostname
        self._on_change = on_change
        self.function: str | None = None
        self.lineno: int | None = None
        #: pdb's output since the last line it was given (replayed on attach).
        self.output: list[str] = []
        #: How much of ``output`` the attached client has seen.
        self.shown = 0
        #: Reads waiting for a line (pdb asks for one line at a time).
        self.waiting = 0
        self.ended = False
        self.proc_address: str | None = None
        self._lines_in, self._lines_out = trio.open_memory_channel[str](math.inf)
        self._changed = trio.Event()

    def info(self) -> SessionInfo:
        return SessionInfo(
            self.name, self.rank, tuple(self.coords.items()), self.hostname,
            self.function, self.lineno,
        )

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        self._on_change()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def write(self, text: str, function: str | None, lineno: int | None) -> None:
        if function is not None:
            self.function, self.lineno = function, lineno
        self.output.append(text)
        self.changed()

    async def read(self) -> str:
        self.waiting += 1
        self.changed()
        return await self._lines_out.receive()

    def give(self, line: str) -> None:
        """A line for pdb (there is a read waiting for it)."""
        self.waiting -= 1
        self.output.clear()
        self.shown = 0
        self._lines_in.send_nowait(line + "\n")
        self.changed()

    def end(self) -> None:
        self.ended = True
        self.changed()

    async def until_waiting(self) -> bool:
        """Wait for pdb to ask for input; False if the session ends first."""
        while not self.waiting and not self.ended:
            await self.wait_changed()
        return not self.ended


class _ProcWatch(PortBase):
    """A reply port that never gets a reply: the runtime fails it when the link to
    ``address`` is lost, which is how the controller learns a debugged proc died."""

    def __init__(self, address: str, lost: Callable[[str], None]) -> None:
        self.dests = frozenset((address,))
        self._address, self._lost = address, lost

    def deliver(self, index: int, status: int, value: Any) -> bool:
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self._lost(self._address)


class _Client:
    """The connected person: line-based text over one TCP stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    async def write(self, text: str) -> None:
        if text:
            await self.stream.send_all(text.encode())

    async def readline(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self.stream.receive_some(4096)
            if not chunk:
                raise EOFError("the debug client disconnected")
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line.decode(errors="replace").rstrip("\r")


class DebugController(Actor):
    """Sessions by (actor name, rank), and the server for the person debugging them."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[str, int], Session] = {}
        self._server: trio.SocketListener | None = None
        self._server_error: BaseException | None = None
        self._client_scope: trio.CancelScope | None = None
        self._watched: set[str] = set()
        self._token = ""
        self._changed = trio.Event()

    # -- the remote pdbs' side ---------------------------------------------------------------

    @endpoint
    async def session_start(
        self,
        name: str,
        rank: int,
        coords: dict[str, int],
        hostname: str,
        proc_address: str | None = None,
    ) -> tuple[str, int]:
        """A rank reached a breakpoint. Returns where the server listens. A proc that dies
        ends its sessions (``proc_address`` is watched)."""
        address = await self._ensure_server()
        if (name, rank) not in self.sessions:
            session = Session(name, rank, coords, hostname, self._touch)
            session.proc_address = proc_address
            self.sessions[(name, rank)] = session
            self._touch()
            if proc_address is not None and proc_address not in self._watched:
                from ..core._controller import current_runtime

                self._watched.add(proc_address)
                current_runtime().open_port(_ProcWatch(proc_address, self._proc_lost))
        return address

    def _proc_lost(self, address: str) -> None:
        self._watched.discard(address)
        for key, session in list(self.sessions.items()):
            if session.proc_address == address:
                del self.sessions[key]
                session.end()
        self._touch()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @endpoint
    async def write(
        self, name: str, rank: int, text: str, function: str | None, lineno: int | None
    ) -> None:
        session = self.sessions.get((name, rank))
        if session is not None:
            session.write(text, function, lineno)

    @concurrent_endpoint
    async def read(self, name: str, rank: int) -> str:
        session = self.sessions.get((name, rank))
        if session is None:
            raise LookupError(f"no debug session for {name} rank {rank}")
        return await session.read()

    @endpoint
    async def session_end(self, name: str, rank: int) -> None:
        session = self.sessions.pop((name, rank), None)
        if session is not None:
            session.end()

    # -- for programs and tests --------------------------------------------------------------

    @endpoint
    async def list(self) -> list[SessionInfo]:
        return sorted(s.info() for s in self.sessions.values())

    @endpoint
    async def server_address(self) -> tuple[str, int]:
        return await self._ensure_server()

    @concurrent_endpoint
    async def wait_pending_session(self, count: int = 1) -> None:
        """Return once at least ``count`` sessions wait at a pdb prompt."""
        while sum(1 for s in self.sessions.values() if s.waiting) < count:
            await self._changed.wait()

    # -- the server ----------------------------------------------------------------------------

    async def _ensure_server(self) -> tuple[str, int]:
        if self._server is None:
            from ..core._controller import current_runtime

            host, port = server_address()
            try:
                listeners = await trio.open_tcp_listeners(port, host=host)
            except OSError as exc:
                raise OSError(
                    f"the debug server cannot listen on {host}:{port} ({exc}); set "
                    "REGENCY_DEBUG_SERVER_HOST/REGENCY_DEBUG_SERVER_PORT to a free address"
                ) from exc
            self._server = listeners[0]
            for extra in listeners[1:]:
                await extra.aclose()
            bound = self._server.socket.getsockname()
            self._token = secrets.token_hex(16)
            _write_token(bound[1], self._token)
            current_runtime().nursery.start_soon(self._serve, self._server)
            print(
                f"regency: an actor is at a breakpoint; attach with "
                f"`regency debug --host {host} --port {bound[1]}`",
                file=sys.stderr,
                flush=True,
            )
        name = self._server.socket.getsockname()
        return (os.environ.get("REGENCY_DEBUG_SERVER_HOST", "localhost"), int(name[1]))

    def _server_port(self) -> int:
        assert self._server is not None
        port: int = self._server.socket.getsockname()[1]
        return port

    async def _serve(self, listener: trio.SocketListener) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._client, stream)

    async def _admitted(self, client: _Client) -> bool:
        """pdb runs any Python in the procs: only this user (who can read the token file)
        may attach. A client that fails says so and leaves the current one alone."""
        offered = ""
        with trio.move_on_after(10):
            offered = await client.readline()
        if secrets.compare_digest(offered.strip().encode(), self._token.encode()):
            return True
        await client.write(
            "regency debug: wrong or missing token (the first line must be the token in "
            f"{token_path(self._server_port())})\n"
        )
        return False

    async def _client(self, stream: trio.SocketStream) -> None:
        client = _Client(stream)
        scope = trio.CancelScope()
        with scope:
            try:
                if not await self._admitted(client):
                    raise EOFError("refused a client without the token")
                if self._client_scope is not None:
                    self._client_scope.cancel()  # one client at a time: the newest wins
                self._client_scope = scope
                await client.write(BANNER)
                while True:
                    await client.write(PROMPT)
                    line = await client.readline()
                    if not line.strip():
                        continue
                    try:
                        command = C.parse(line)
                    except ValueError as exc:
                        await client.write(f"Error parsing input: {exc}\n")
                        continue
                    if isinstance(command, C.Quit):
                        await client.write("Quitting debug session...\n")
                        break
                    try:
                        await self._run(client, command)
                    except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                        raise
                    except LookupError as exc:
                        await client.write(f"Error processing command: {exc.args[0]}\n")
                    except Exception as exc:
                        await client.write(f"Error processing command: {exc}\n")
            except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        with trio.move_on_after(1):
            await stream.aclose()

    async def _run(self, client: _Client, command: C.Command) -> None:
        if isinstance(command, C.Help):
            await client.write(HELP)
        elif isinstance(command, C.ListSessions):
            await client.write(render_table(sorted(s.info() for s in self.sessions.values())))
        elif isinstance(command, C.Attach):
            session = self.sessions.get((command.actor, command.rank))
            if session is None:
                open_ = ", ".join(f"{n} {r}" for n, r in sorted(self.sessions)) or "none"
                raise LookupError(
                    f"no debug session for {command.actor} rank {command.rank} (open: {open_})"
                )
            await self._attach(client, session)
        elif isinstance(command, C.Detach):
            await client.write("Not attached to a debug session.\n")
        elif isinstance(command, C.Cast):
            await self._cast(command.command, self._select(command.actor, command.ranks))
        elif isinstance(command, C.Continue):
            everyone = list(self.sessions.values())
            await self._cast("clear", everyone)
            await self._cast("c", everyone)

    def _select(self, actor: str, ranks: C.Ranks) -> builtins.list[Session]:
        return [
            s for (name, rank), s in sorted(self.sessions.items())
            if name == actor and C.selects(ranks, rank, s.coords)
        ]

    async def _cast(self, line: str, sessions: builtins.list[Session]) -> None:
        """Give ``line`` to each session once it asks for input (its output is kept for a
        later attach, not shown)."""

        async def one(session: Session) -> None:
            if await session.until_waiting():
                session.give(line)

        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(one, session)

    async def _attach(self, client: _Client, session: Session) -> None:
        label = f"{session.name} {session.rank} ({session.hostname})"
        await client.write(f"Attached to debug session for {label}\n")
        if session.output:
            await client.write(f"<last pdb output for {session.name} {session.rank} follows>\n")
        session.shown = 0
        while True:
            new = session.output[session.shown :]
            session.shown = len(session.output)
            await client.write("".join(new))
            if session.ended:
                await client.write(f"Debug session for {label} ended\n")
                return
            if session.waiting:
                line = await client.readline()
                if line.strip() == "detach":
                    break
                session.give(line)
                continue
            await session.wait_changed()
        await client.write(f"Detached from debug session for {label}\n")


def render_table(rows: list[SessionInfo]) -> str:
    """A grid table (tabulate's "grid" look) of the sessions."""
    headers = ["Actor Name", "Rank", "Coords", "Hostname", "Function", "Line No."]
    cells = [
        [
            r.actor_name,
            str(r.rank),
            "{" + ", ".join(f"'{k}': {v}" for k, v in r.coords) + "}",
            r.hostname,
            r.function or "",
            "" if r.lineno is None else str(r.lineno),
        ]
        for r in rows
    ]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+\n"
    head_rule = "+" + "+".join("=" * (w + 2) for w in widths) + "+\n"

    def row(values: list[str]) -> str:
        return "|" + "|".join(f" {v:<{w}} " for v, w in zip(values, widths, strict=True)) + "|\n"

    out = rule + row(headers) + head_rule
    for c in cells:
        out += row(c) + rule
    return out
