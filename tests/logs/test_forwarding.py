"""Log forwarding through real procs: formats, streams, levels, aggregation, flushes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from regency.actor import this_proc
from regency.core._config import overridden

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = socket.gethostname()


#: Runs first in each controller: procs inherit fds 1 and 2 from the zygote, started with
#: the runtime, so starting it while those fds point at files gives the procs a "host
#: output" of their own, and the controller's stdout holds only what the sink prints.
PROLOGUE = """
import os, sys
host_out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
host_err = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
saved = os.dup(1), os.dup(2)
os.dup2(host_out, 1); os.dup2(host_err, 2)
from regency.core import current_runtime
current_runtime()
os.dup2(saved[0], 1); os.dup2(saved[1], 2)
"""


def _run(
    script: str, tmp: str, *, env: dict[str, str] | None = None
) -> tuple[str, str, str, str]:
    """Run a controller; its stdout and stderr, then its procs' host stdout and stderr."""
    host_out, host_err = os.path.join(tmp, "host.out"), os.path.join(tmp, "host.err")
    proc = subprocess.run(
        [sys.executable, "-c", PROLOGUE + textwrap.dedent(script), host_out, host_err],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        timeout=120,
    )
    assert proc.returncode == 0, f"controller failed:\n{proc.stdout}\n{proc.stderr}"
    with open(host_out) as f, open(host_err) as g:
        return proc.stdout, proc.stderr, f.read(), g.read()


def _forwarded(text: str) -> list[tuple[str, int, str]]:
    """(proc, rank, line) of every forwarded line in ``text``."""
    pattern = re.compile(rf"^\[{re.escape(HOST)} (\S+)\] \[(\d+)\] (.*)$")
    return [(m[1], int(m[2]), m[3]) for m in map(pattern.match, text.splitlines()) if m]


STREAMING = """
import logging, sys
import regency
regency.configure(enable_log_forwarding=True)
from regency.actor import this_host
from tests.logs.actors import Printer, announce

pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=announce)
p = pm.spawn("p", Printer)
pm.logging_option(stream_to_client=True, aggregate_window_sec=None).get()
p.say.call("A").get()
p.long_line.call(5000).get()
pm.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.WARNING).get()
p.log.call("W").get()
pm.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.INFO).get()
p.log.call("I").get()
# Changes apply in order with later calls, awaited or not.
pm.logging_option(stream_to_client=False, aggregate_window_sec=None)
p.lines.call("hidden", 3).get()
pm.logging_option(stream_to_client=True, aggregate_window_sec=None)
p.lines.call("visible", 3).get()
# A proc spawned by an actor forwards to the job's controller too.
p.slice(gpus=0).nested.call_one("N").get()
print("NESTED DONE", flush=True)
# Everything printed before stop() is at the controller when stop() returns. (The call is
# waited for: a proc told to stop does not finish the endpoints still queued on it.)
p.lines.call("bulk", 400).get()
pm.stop().get()
print("STOPPED", flush=True)
"""


@pytest.mark.slow
def test_streaming_formats_streams_levels_order_and_stop_flush(tmp_path: Path) -> None:
    out, err, host_out, host_err = _run(STREAMING, str(tmp_path))
    fwd_out, fwd_err = _forwarded(out), _forwarded(err)
    procs = {rank: proc for proc, rank, _ in fwd_out}
    assert sorted(procs) == [0, 1] and procs[0] != procs[1]
    lines_out = {(rank, line) for _, rank, line in fwd_out}
    lines_err = {(rank, line) for _, rank, line in fwd_err}
    for rank in (0, 1):
        # Python prints, raw fd writes and a subprocess, each on its own stream.
        for line in (f"out A {rank}", f"raw A {rank}", f"sub A {rank}"):
            assert (rank, line) in lines_out
        assert (rank, f"err A {rank}") in lines_err
        assert (rank, f"err A {rank}") not in lines_out
        assert (rank, f"out A {rank}") not in lines_err
        # The long line is cut at 4 KiB and marked.
        assert (rank, "L" * 4096 + " ... [TRUNCATED]") in lines_out
        # Level: WARNING hides info; INFO shows it (Python logging goes to stderr).
        # (records from inside an actor carry "[actor=...] ": prefix_python_logs_with_actor)
        logged = {line.rsplit("] ", 1)[-1] for r, line in lines_err if r == rank and ": " in line}
        assert {"warning W", "info I", "warning I"} <= logged
        assert "info W" not in logged
        assert not any("hidden" in line for _, line in lines_out)
        assert {(rank, f"visible {rank} line {i}") for i in range(3)} <= lines_out
        bulk = [line for _, r, line in fwd_out if r == rank and line.startswith("bulk")]
        assert bulk == [f"bulk {rank} line {i}" for i in range(400)]
    # The flush is a barrier: every forwarded line precedes the controller's marker.
    assert out.splitlines()[-1] == "STOPPED"
    # The grandchild's lines (rank 0 of its own mesh) came before its spawner's stop returned.
    nested = out[: out.index("NESTED DONE")]
    assert re.search(rf"^\[{re.escape(HOST)} c\d+\.p\d+\.p\d+\] \[0\] out N 0$", nested, re.M)
    assert re.search(r"\.p\d+\.p\d+\] \[0\] err N 0$", err, re.M)
    # Only the sink writes to the controller's output; the host's own output got the raw
    # bytes (the tee: chunks as read, so two procs' lines may interleave there), on the same
    # streams.
    assert not [
        line
        for line in out.splitlines()
        if line not in ("STOPPED", "NESTED DONE") and not line.startswith(("[", "\x1b["))
    ]
    # Lines printed before the proc heard from the controller (its bootstrap) were kept and
    # sent under the default mode (a 3 s window), printed at the latest by stop's flush.
    assert "\x1b[33m[2 similar log lines]\x1b[0m [" in out
    assert "] booting up before serving\n" in out
    for rank in (0, 1):
        for line in (f"out A {rank}", f"raw A {rank}", f"sub A {rank}", "L" * 5000):
            assert line in host_out
        assert f"err A {rank}" in host_err and f"err A {rank}" not in host_out


AGGREGATE = """
import sys
import regency, regency.actor
regency.configure(enable_log_forwarding=True)
regency.actor.unhandled_fault_hook = lambda failure: None  # the crash below is expected
from regency.actor import SupervisionError, this_host
from tests.logs.actors import Printer

pm = this_host().spawn_procs(per_host={"gpus": 2})
p = pm.spawn("p", Printer)
import asyncio, trio
async def option():
    await pm.logging_option(stream_to_client=True, aggregate_window_sec=600)
asyncio.run(option())   # awaitable under asyncio (a notebook) ...
p.lines.call("a training step is done, rank", 3).get()
pm.stop().get()   # the window is far from over: stop's flush prints it
print("STOPPED", flush=True)

crash = this_host().spawn_procs(per_host={"gpus": 1})
c = crash.spawn("c", Printer)
async def crash_option():
    await crash.logging_option(stream_to_client=True, aggregate_window_sec=None)
trio.run(crash_option)  # ... and under trio
try:
    c.die.call_one("sync").get()
except SupervisionError:
    print("DIED", flush=True)

killed = this_host().spawn_procs(per_host={"gpus": 1})
k = killed.spawn("k", Printer)
killed.logging_option(stream_to_client=True, aggregate_window_sec=None).get()
try:
    k.die_unread.call_one("kill").get()
except SupervisionError:
    pass

tail = this_host().spawn_procs(per_host={"gpus": 1})
t = tail.spawn("t", Printer)
tail.logging_option(stream_to_client=True, aggregate_window_sec=600).get()
t.lines.call("the program is about to exit, rank", 2).get()
print("EXITING", flush=True)
"""


@pytest.mark.slow
def test_aggregation_stop_flush_crash_and_exit_flush(tmp_path: Path) -> None:
    out, err, _, _ = _run(AGGREGATE, str(tmp_path))
    stopped = out.index("STOPPED")
    block = out[:stopped]
    # Six lines from two ranks, all alike: one group, shown with its first rank.
    assert re.search(r">>> Aggregated Logs \(.+\) >>>", block)
    assert re.search(
        r"\[6 similar log lines\]\x1b\[0m \[[01]\] a training step is done, rank [01] line [0-2]\n",
        block,
    )
    assert "<<< Aggregated Logs" in block
    # A proc that dies still gets its last lines out, on their streams. (Not necessarily
    # before the caller hears of the death: a line still in the pipe at os._exit is read by
    # the controller once the proc is gone, which may come after DIED.)
    assert "DIED" in out[stopped:]
    assert re.search(r"\] \[0\] last words sync\n", out[stopped:])
    assert any(line == "last err sync" for _, _, line in _forwarded(err))
    # Even a SIGKILL with the line still unread in the pipe: the controller reads what is left
    # once the proc is gone.
    assert re.search(r"\] \[0\] unread kill\n", out)
    # Program exit flushes an open window too.
    rest = out[out.index("EXITING") :]
    assert re.search(
        r"\[2 similar log lines\]\x1b\[0m \[0\] the program is about to exit, rank 0 line [01]\n",
        rest,
    )


def test_logging_option_checks_its_arguments() -> None:
    with overridden(enable_log_forwarding=True):
        mesh = this_proc()
        with pytest.raises(ValueError, match="Invalid logging level: 300"):
            mesh.logging_option(level=300)
        with pytest.raises(ValueError, match="Invalid logging level: -1"):
            mesh.logging_option(level=-1)
        with pytest.raises(
            RuntimeError, match=r"^cannot set aggregate window without streaming to client$"
        ):
            mesh.logging_option(stream_to_client=False, aggregate_window_sec=3)


def test_logging_option_warns_when_forwarding_is_off() -> None:
    # Also when it is on now but the procs were not spawned with it (here: this process).
    with overridden(enable_log_forwarding=True), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        this_proc().logging_option(stream_to_client=True).get(5)
    assert any(
        issubclass(w.category, UserWarning) and "enable_log_forwarding=True" in str(w.message)
        for w in seen
    )


def test_env_alias_enables_forwarding(monkeypatch: pytest.MonkeyPatch) -> None:
    from regency.core._config import Config, _from_env

    monkeypatch.setenv("REGENCY_ENABLE_LOG_FORWARDING", "1")
    assert Config(**_from_env()).enable_log_forwarding is True
    monkeypatch.setenv("REGENCY_ENABLE_LOG_FORWARDING", "off")
    assert Config(**_from_env()).enable_log_forwarding is False
    monkeypatch.setenv("REGENCY_ENABLE_LOG_FORWARDING", "perhaps")
    with pytest.raises(ValueError, match="REGENCY_ENABLE_LOG_FORWARDING must be a boolean"):
        _from_env()


STUCK_HOST = """
import logging, os, sys
r, w = os.pipe()
saved = os.dup(1), os.dup(2)
os.dup2(w, 1); os.dup2(w, 2)
from regency.core import current_runtime
current_runtime()  # the zygote (and so every proc) gets the pipe as its stdout and stderr
os.dup2(saved[0], 1); os.dup2(saved[1], 2); os.close(w)
# Nobody ever reads `r`: the procs' own output fills up after 64 KiB and stays full.
import regency
regency.configure(enable_log_forwarding=True)
from regency.actor import this_host
from tests.logs.actors import Printer

pm = this_host().spawn_procs(per_host={"gpus": 1})
p = pm.spawn("p", Printer)
pm.logging_option(stream_to_client=True, aggregate_window_sec=None).get(30)
p.lines.call("flood", 6000).get(60)
pm.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.ERROR).get(30)
pm.stop().get(60)
print("STOPPED", flush=True)
"""


@pytest.mark.slow
def test_a_host_output_nobody_reads_stalls_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(STUCK_HOST)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    flood = [line for _, _, line in _forwarded(proc.stdout) if line.startswith("flood")]
    assert flood == [f"flood 0 line {i}" for i in range(6000)]
    assert proc.stdout.splitlines()[-1] == "STOPPED"
