"""Back-pressure in log forwarding: a proc that prints faster than the controller's output
takes it is held back (its writes block, as on a slow terminal), and neither the sink's
queue nor the proc's in-flight text grows past the window; output printed on a proc's loop
thread never deadlocks it. Real controllers whose stdout is a pipe the test does not read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from regency._logs._tee import WINDOW

from .test_forwarding import PROLOGUE, ROOT

T = 60

CONTROLLER = """
import sys, time
import regency
regency.configure(enable_log_forwarding=True)
from regency.actor import this_host
from regency._logs import sink_of
from regency.core import current_runtime
from tests.logs.actors import Flooder, Pinger

mode, n = sys.argv[3], int(sys.argv[4])
pm = this_host().spawn_procs(per_host={"gpus": 1})
pm.logging_option(stream_to_client=True, aggregate_window_sec=None).get(30)
flooder = pm.spawn("flooder", Flooder)
pinger = pm.spawn("pinger", Pinger)
sink = sink_of(current_runtime())
fut = (flooder.flood if mode == "sync" else flooder.aflood).call_one(n)
err = sys.stderr
while not fut.done():
    err.write(f"PENDING {sink.pending}\\n")
    err.write(f"PING {pinger.ping.call_one().get(30)}\\n")
    err.flush()
    time.sleep(0.05)
err.write(f"DONE {fut.get(30)}\\n")
err.flush()
pm.stop().get(30)
"""


class Controller:
    """A controller process whose stdout the test reads only when told to."""

    def __init__(self, mode: str, n: int, tmp: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable, "-c", PROLOGUE + textwrap.dedent(CONTROLLER),
                os.path.join(tmp, "host.out"), os.path.join(tmp, "host.err"), mode, str(n),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        self.err: list[str] = []
        self.out = ""
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        self._out_reader: threading.Thread | None = None

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def read_stdout(self) -> None:
        def read() -> None:
            assert self.proc.stdout is not None
            self.out = self.proc.stdout.read()

        self._out_reader = threading.Thread(target=read, daemon=True)
        self._out_reader.start()

    def wait_for(self, prefix: str, timeout: float = T) -> None:
        deadline = time.monotonic() + timeout
        while not any(line.startswith(prefix) for line in self.err):
            assert self.proc.poll() is None or any(x.startswith(prefix) for x in self.err), (
                "the controller exited:\n" + "\n".join(self.err[-30:])
            )
            assert time.monotonic() < deadline, f"no {prefix!r} within {timeout} s:\n" + "\n".join(
                self.err[-30:]
            )
            time.sleep(0.02)

    def pending(self) -> list[int]:
        return [int(line.split()[1]) for line in self.err if line.startswith("PENDING ")]

    def finish(self) -> None:
        if self._out_reader is None:
            self.read_stdout()
        assert self.proc.wait(T) == 0, "the controller failed:\n" + "\n".join(self.err[-30:])
        assert self._out_reader is not None
        self._out_reader.join(T)
        self._err_reader.join(T)

    def flood_lines(self) -> list[int]:
        return [int(m[1]) for m in re.finditer(r"\] flood (\d{8}) x+$", self.out, re.M)]


@contextmanager
def controller(mode: str, n: int, tmp: str) -> Iterator[Controller]:
    c = Controller(mode, n, tmp)
    try:
        yield c
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


@pytest.mark.slow
def test_a_proc_that_outprints_the_controller_is_held_back(tmp_path: object) -> None:
    """50,000 lines (about 5.7 MB) from a sync endpoint while the controller's stdout is
    not read: the endpoint does not finish, the sink's queue stays within the window (about
    0.6 MB of text with prefixes; without back-pressure it took the whole flood), the proc's
    loop goes on answering; once the output is read, every line arrives, in order."""
    n = 50_000
    with controller("sync", n, str(tmp_path)) as c:
        c.wait_for("PENDING")
        time.sleep(2.0)  # the flood meets the full pipe and the window
        assert not any(line.startswith("DONE") for line in c.err), "the flood was not held back"
        assert max(c.pending()) <= 2 * WINDOW, c.pending()
        pings = sum(line == "PING pong" for line in c.err)
        c.read_stdout()
        c.finish()
        assert any(line == f"DONE {n}" for line in c.err)
        assert sum(line == "PING pong" for line in c.err) > pings  # and during the flood
        assert c.flood_lines() == list(range(n))


@pytest.mark.slow
def test_output_printed_on_the_procs_loop_does_not_deadlock_it(tmp_path: object) -> None:
    """An async endpoint prints (on the proc's loop thread) past the window while the
    controller's stdout is not read. Only the loop takes the sink's answers, so the reader
    reads on while the loop is in a write to its pipe: the endpoint finishes and an async
    actor on the same proc keeps answering (a reader that held back would leave the loop
    blocked in write forever). Every line arrives once the output is read."""
    n = 20_000  # about 2.3 MB: past the window and both pipes
    with controller("async", n, str(tmp_path)) as c:
        c.wait_for("DONE")  # while nobody reads the controller's stdout
        assert sum(line == "PING pong" for line in c.err) >= 1
        c.finish()
        assert c.flood_lines() == list(range(n))
