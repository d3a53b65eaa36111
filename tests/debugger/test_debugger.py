"""The debugger through real procs and its TCP protocol, and its command language."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator

import pytest

from regency._debugger._commands import (
    Attach,
    Cast,
    Continue,
    Detach,
    Help,
    ListSessions,
    Quit,
    parse,
    parse_ranks,
    selects,
)
from regency._debugger._controller import SessionInfo, render_table, token_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "regency_dbg> "
PDB = "(Pdb) "


# -- the command language ---------------------------------------------------------------------


def test_commands_and_their_short_forms() -> None:
    assert parse("help") == parse("h") == Help()
    assert parse(" list ") == parse("l") == ListSessions()
    assert parse("attach trainer 3") == parse("a trainer 3") == Attach("trainer", 3)
    assert parse("detach") == Detach()
    assert parse("continue") == parse("c") == Continue()
    assert parse("quit") == parse("q") == Quit()
    assert parse("cast trainer ranks(3) p x + 1") == Cast("trainer", 3, "p x + 1")


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("3", 3),
        ("1,3,5", (1, 3, 5)),
        ("1:10:2", range(1, 10, 2)),
        (":4", range(0, 4)),
        ("2:", range(2, sys.maxsize)),
        ("::3", range(0, sys.maxsize, 3)),
        ("dp=(1,3), tp=2:8", {"dp": (1, 3), "tp": range(2, 8)}),
        ("dp=1, tp=(2)", {"dp": 1, "tp": (2,)}),
        ("dp=(0:4:2)", {"dp": range(0, 4, 2)}),
    ],
)
def test_ranks_grammar(text: str, ranks: object) -> None:
    assert parse_ranks(text) == ranks
    assert parse(f"cast m ranks({text}) n") == Cast("m", ranks, "n")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("frobnicate", "unknown command 'frobnicate'; expected one of help, list"),
        ("attach trainer", "expected 'attach <actor> <rank>'"),
        ("cast trainer ranks(1)", "expected 'cast <actor> ranks(...) <pdb command>'"),
        ("cast t ranks(x) n", "expected a rank, a list like 1,3,5 or a slice like 1:10:2"),
        ("cast t ranks(1:5:0) n", "a rank slice's step must not be 0"),
        ("cast t ranks(dp=) n", "expected dims like dp=(1,3), tp=2:8"),
    ],
)
def test_bad_commands_say_what_was_expected(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(line)


def test_selection_by_rank_list_slice_and_dims() -> None:
    coords = {"dp": 1, "tp": 4}
    assert selects(5, 5, coords) and not selects(4, 5, coords)
    assert selects((1, 5), 5, coords) and selects(range(1, 10, 2), 5, coords)
    assert not selects(range(0, 10, 2), 5, coords)
    assert selects({"dp": (1, 3), "tp": range(2, 8)}, 5, coords)
    assert not selects({"dp": 0}, 5, coords)
    assert not selects({"pp": 0}, 5, coords)  # a dim the session does not have


def test_an_empty_list_is_the_headers() -> None:
    assert render_table([]).splitlines()[1] == (
        "| Actor Name | Rank | Coords | Hostname | Function | Line No. |"
    )


def test_list_is_a_grid_table() -> None:
    rows = [
        SessionInfo("trainer", 0, (("gpus", 0),), "h1", "train.step", 12),
        SessionInfo("trainer", 1, (("gpus", 1),), "h1", None, None),
    ]
    assert render_table(rows) == textwrap.dedent(
        """\
        +------------+------+-------------+----------+------------+----------+
        | Actor Name | Rank | Coords      | Hostname | Function   | Line No. |
        +============+======+=============+==========+============+==========+
        | trainer    | 0    | {'gpus': 0} | h1       | train.step | 12       |
        +------------+------+-------------+----------+------------+----------+
        | trainer    | 1    | {'gpus': 1} | h1       |            |          |
        +------------+------+-------------+----------+------------+----------+
        """
    )


def test_client_says_where_it_could_not_connect(capsys: pytest.CaptureFixture[str]) -> None:
    from regency._debugger._client import run_client

    port = _free_port()
    assert run_client("127.0.0.1", port, token="x") == 2
    err = capsys.readouterr().err
    assert f"cannot connect to the debug server at 127.0.0.1:{port}" in err
    assert "REGENCY_DEBUG_SERVER_HOST/_PORT" in err


# -- through real procs ---------------------------------------------------------------------------

CONTROLLER = """
import sys
import regency.actor
regency.actor.unhandled_fault_hook = lambda failure: None
from regency.actor import get_or_spawn_controller, this_host
from regency._debugger._controller import DebugController
from tests.debugger.actors import Bystander, Debugee

pm = this_host().spawn_procs(per_host={"gpus": 2})
debugee = pm.spawn("debugee", Debugee)
bystander = pm.spawn("bystander", Bystander)
pending = getattr(debugee, sys.argv[1]).call(1)
controller = get_or_spawn_controller("debug_controller", DebugController).get(30)
controller.wait_pending_session.call_one(2).get(60)
print("READY", flush=True)
# Both ranks sit at breakpoints; the other actors of their procs still serve.
print("BYSTANDER", bystander.ping.call().get(30).values(), flush=True)
sys.stdin.readline()  # the test says when to collect the results (and so exit)
try:
    print("RESULT", pending.get(120).values(), flush=True)
except Exception as exc:
    print("ERROR", type(exc).__name__, str(exc).splitlines()[0], flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Session:
    """The debugging person, speaking the server's text protocol."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buffer = b""
        if token is None:
            with open(token_path(port)) as f:
                token = f.read().strip()
        self.sock.sendall(token.encode() + b"\n")

    def until(self, token: str) -> str:
        while token.encode() not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"server closed before {token!r}; got {self.buffer!r}")
            self.buffer += chunk
        end = self.buffer.index(token.encode()) + len(token)
        text, self.buffer = self.buffer[:end], self.buffer[end:]
        return text.decode()

    def send(self, line: str, until: str = PROMPT) -> str:
        self.sock.sendall(line.encode() + b"\n")
        return self.until(until)


Starter = Callable[[str], "subprocess.Popen[str]"]


@pytest.fixture
def debugging() -> Iterator[tuple[Starter, int]]:
    """(start, port): ``start(endpoint)`` runs a controller whose two ranks call ``endpoint``
    and sit at its breakpoint; ``port`` is where its debug server listens."""
    procs: list[subprocess.Popen[str]] = []
    port = _free_port()
    errors.clear()

    def start(endpoint: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(CONTROLLER), endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONPATH": ROOT,
                "REGENCY_DEBUG_SERVER_HOST": "127.0.0.1",
                "REGENCY_DEBUG_SERVER_PORT": str(port),
            },
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.kill()
            raise AssertionError(f"controller said {line!r}: {proc.communicate()[1]}")
        # stdout is read on through its buffer (communicate() would skip what readline()
        # buffered); stderr drains meanwhile so the controller never blocks on it.
        assert proc.stderr is not None
        stderr = proc.stderr
        errors[proc.pid] = []
        threading.Thread(target=lambda: errors[proc.pid].append(stderr.read()), daemon=True).start()
        return proc

    yield start, port
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: The stderr of each controller the fixture started, by pid (read by a thread).
errors: dict[int, list[str]] = {}


def _finish(proc: subprocess.Popen[str]) -> str:
    """Let the controller collect its results and exit; its stdout."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.close()
    out = proc.stdout.read()
    assert proc.wait(60) == 0, errors.get(proc.pid)
    return out


@pytest.mark.slow
def test_two_ranks_list_attach_cast_replay_and_continue(debugging: tuple[Starter, int]) -> None:
    start, port = debugging
    proc = start("compute")
    me = _Session(port)
    banner = me.until(PROMPT)
    assert "REGENCY DEBUGGER" in banner
    # Without the token (only this user can read its file) the server says no and hangs up,
    # and the connected person is not displaced.
    stranger = _Session(port, token="guess")
    with pytest.raises(EOFError, match="wrong or missing token"):
        stranger.until(PROMPT)
    table = me.send("list")
    rows = [line for line in table.splitlines() if line.startswith("| debugee")]
    assert len(rows) == 2
    for rank, row in enumerate(rows):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:3] == ["debugee", str(rank), f"{{'gpus': {rank}}}"]
        assert cells[4:] == ["actors.compute", "15"]
    assert "Actor Name | Rank | Coords      | Hostname | Function" in table
    # Attach: the output since the last input is replayed, then pdb is live.
    text = me.send("attach debugee 0", PDB)
    assert "Attached to debug session for debugee 0" in text
    assert "<last pdb output for debugee 0 follows>" in text
    assert "-> z = y + 1" in text
    assert me.send("p y", PDB).strip().startswith("2")
    assert "Detached from debug session for debugee 0" in me.send("detach")
    # Re-attaching replays the output since the last input.
    replay = me.send("attach debugee 0", PDB)
    assert replay.endswith("<last pdb output for debugee 0 follows>\n2\n(Pdb) ")
    me.send("detach")
    # cast runs a pdb command without showing its output; attaching shows it.
    assert me.send("cast debugee ranks(1) p y * 10") == PROMPT
    assert me.send("attach debugee 1", "20\n(Pdb) ")
    me.send("detach")
    assert "Error parsing input: unknown command 'bogus'" in me.send("bogus")
    assert (
        "Error processing command: no debug session for debugee rank 7 "
        "(open: debugee 0, debugee 1)" in me.send("attach debugee 7")
    )
    assert "cast <actor_name> ranks(...)" in me.send("help")
    # quit leaves the sessions in place for the next connection.
    me.send("quit", "Quitting debug session...\n")
    again = _Session(port)
    again.until(PROMPT)
    assert again.send("list").count("| debugee ") == 2
    again.send("continue")
    out = _finish(proc)
    assert "BYSTANDER ['pong', 'pong']" in out
    assert "RESULT [3, 3]" in out


@pytest.mark.slow
def test_async_endpoint_breakpoint_leaves_the_loop_serving(debugging: tuple[Starter, int]) -> None:
    start, port = debugging
    proc = start("acompute")
    me = _Session(port)
    me.until(PROMPT)
    assert "actors.acompute" in me.send("list")
    text = me.send("attach debugee 1", PDB)
    assert "-> await trio.sleep(0)" in text
    assert me.send("p y", PDB).strip().startswith("101")
    # Step over an await: the coroutine yields to the loop and comes back under pdb.
    assert "-> return y + 1" in me.send("n", PDB)
    me.send("detach")
    # A proc that dies ends its sessions.
    me.send("cast debugee ranks(0) !import os; os._exit(3)")
    gone = me.send("attach debugee 0")
    assert (
        "Debug session for debugee 0 (" in gone and ") ended" in gone
    ) or "no debug session for debugee rank 0 (open: debugee 1)" in gone
    assert me.send("list").count("| debugee ") == 1
    me.send("continue")
    out = _finish(proc)
    assert "BYSTANDER ['pong', 'pong']" in out
    assert "ERROR SupervisionError" in out


@pytest.mark.slow
def test_asyncio_endpoint_steps_over_an_asyncio_await(debugging: tuple[Starter, int]) -> None:
    start, port = debugging
    proc = start("aio_compute")
    me = _Session(port)
    me.until(PROMPT)
    assert "-> await asyncio.sleep(0)" in me.send("attach debugee 0", PDB)
    assert "-> return y + 1" in me.send("n", PDB)
    assert me.send("p y", PDB).strip().startswith("8")
    me.send("detach")
    me.send("continue")
    out = _finish(proc)
    assert "BYSTANDER ['pong', 'pong']" in out
    assert "RESULT [9, 9]" in out


@pytest.mark.slow
def test_raise_after_breakpoint_opens_post_mortem_and_regency_debug_cli(
    debugging: tuple[Starter, int],
) -> None:
    start, port = debugging
    proc = start("boom")
    me = _Session(port)
    me.until(PROMPT)
    me.send("attach debugee 0", PDB)
    text = me.send("c", PDB)  # runs into the raise
    assert "Post-mortem: the endpoint raised ValueError: boom 41" in text
    assert me.send("p v", PDB).strip().startswith("41")
    me.send("detach")
    # The built-in client: a new connection replaces this one (one person at a time).
    me.sock.close()
    cli = subprocess.run(
        [sys.executable, "-m", "regency", "debug", "--host", "127.0.0.1", "--port", str(port)],
        input="list\nquit\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "| debugee    | 0    | {'gpus': 0} |" in cli.stdout
    assert cli.stdout.endswith("regency_dbg> Quitting debug session...\n")
    # Ending the post-mortem lets the error through to the caller (the first error of a
    # mesh call fails it).
    again = _Session(port)
    again.until(PROMPT)
    again.send("cast debugee ranks(0) c")
    out = _finish(proc)
    assert "ERROR ActorError" in out and "boom 41" in out
