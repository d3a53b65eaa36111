"""Security and robustness on one host: the secret stays out of procs'
environments, a value that fails to unpickle fails one call only, long C calls are not hangs,
and large frames leave no memory behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from regency.actor import ActorError, ActorMesh, this_host

from .hardening_actors import EnvProbe, ExitOnUnpickle, Returner

T = 30


def test_the_secret_never_reaches_a_proc_or_the_zygote_environment() -> None:
    assert os.environ.get("REGENCY_SECRET"), "the test suite sets REGENCY_SECRET (conftest)"
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        seen = pm.spawn("env", EnvProbe).secret_seen.call_one().get(T)
        assert seen["os.environ"] is False
        assert seen["/proc/self/environ"] is False
        if seen["parent"] != os.getpid():  # forked by the zygote: it must not hold it either
            assert seen["/proc/parent/environ"] is False
    finally:
        pm.stop().get(T)


def test_the_secret_never_reaches_a_fresh_interpreter() -> None:
    """Without the zygote, and even when the caller passes it in ``env``."""
    from regency.core import current_runtime
    from regency.core._launcher import LocalLauncher

    rt = current_runtime()
    saved = rt.launcher
    rt.launcher = LocalLauncher(rt.nursery)
    try:
        pm = this_host().spawn_procs(per_host={"gpus": 1}, env={"REGENCY_SECRET": "x" * 20})
        seen = pm.spawn("env", EnvProbe).secret_seen.call_one().get(T)
        assert seen["os.environ"] is False and seen["/proc/self/environ"] is False
        pm.stop().get(T)
    finally:
        rt.launcher = saved


# -- decode failures fail one call ----------------------------------------------------------


@pytest.fixture(scope="module")
def returner() -> Iterator[ActorMesh[Returner]]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm.spawn("ret", Returner)
    pm.stop().get(T)


@pytest.mark.parametrize(
    ("what", "raised"),
    [
        ("systemexit", "SystemExit: 3"),
        ("valueerror", "ValueError: bad state in __setstate__"),
        ("baseexception", "GeneratorExit: "),
    ],
)
def test_a_reply_that_fails_to_unpickle_fails_that_call_only(
    returner: ActorMesh[Returner], what: str, raised: str
) -> None:
    from regency.core import DecodeError

    pid = returner.pid.call_one().get(T)
    with pytest.raises(
        DecodeError,
        match=rf"cannot unpickle the reply of ret\.give from rank 0: unpickling raised {raised}",
    ):
        returner.give.call_one(what).get(T)
    # The same through call(): the mesh call fails, naming the rank.
    with pytest.raises(ValueError, match=r"the reply of ret\.give from rank 0"):
        returner.give.call(what).get(T)
    # The controller's runtime and the proc go on.
    assert returner.give.call_one("fine").get(T) == "fine"
    assert returner.pid.call_one().get(T) == pid


def test_arguments_that_fail_to_unpickle_fail_that_call_and_not_the_proc(
    returner: ActorMesh[Returner],
) -> None:
    pid = returner.pid.call_one().get(T)
    for exc, shown in ((SystemExit(3), "SystemExit: 3"), (GeneratorExit(), "GeneratorExit")):
        with pytest.raises(
            ActorError,
            match=rf"Actor call ret\.take failed on rank 0: \S*DecodeError: unpickling raised {shown}",
        ):
            returner.take.call_one(ExitOnUnpickle(exc)).get(T)
    assert returner.take.call_one(5).get(T) == "took 5"
    assert returner.pid.call_one().get(T) == pid


RUNTIME_DIES = textwrap.dedent(
    """
    import sys, time
    from regency.actor import this_host
    from regency.core import current_runtime
    from tests.core.actors import Mixed
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    slow = pm.spawn("slow", Mixed)
    slow.slow_sync.call_one(0).get(30)
    pending = slow.slow_sync.call_one(20)
    def boom():
        raise RuntimeError("boom for the test")
    current_runtime().call_soon(boom)
    started = time.monotonic()
    try:
        pending.get(15)
    except Exception as exc:
        print("PENDING", type(exc).__name__, exc, flush=True)
    try:
        slow.slow_sync.call_one(0).get(15)
    except Exception as exc:
        print("LATER", type(exc).__name__, exc, flush=True)
    print("WAITED", round(time.monotonic() - started), flush=True)
    """
)


@pytest.mark.slow
def test_a_runtime_thread_that_dies_fails_pending_and_later_calls_saying_why() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-c", RUNTIME_DIES], capture_output=True, text=True, cwd=root, timeout=60
    )
    out = done.stdout
    why = "the Regency runtime thread died: RuntimeError: boom for the test"
    assert f"PENDING SupervisionError Endpoint call slow.slow_sync() failed, {why}" in out, (
        out,
        done.stderr[-2000:],
    )
    assert f"LATER SupervisionError {why}" in out, out
    assert "WAITED 0" in out, out
    assert f"regency: {why}; failing 1 pending call(s)" in done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


# -- a long C call is not a hang; a stopped proc is --------------------------------------------

BUSY_OR_STUCK = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import regency
    import regency.actor
    _lock = threading.Lock()
    def say(*what):  # one write per line: the fault hook runs on another thread
        with _lock:
            sys.stdout.write(" ".join(map(str, what)) + "\\n")
            sys.stdout.flush()
    regency.actor.unhandled_fault_hook = lambda failure: say("FAULT", failure.mesh_name)
    regency.configure(heartbeat_interval=0.1, heartbeat_timeout=0.5)
    from regency.actor import this_host
    from tests.core.hardening_actors import Busy
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    busy = pm.spawn("busy", Busy)
    pids = busy.pid.call().get(30).values()
    # About 2 s of one C call holding the GIL (more under load): four heartbeat timeouts.
    seconds = busy.slice(gpus=0).crunch.call_one(2.0).get(120)
    say("CRUNCHED", seconds)
    os.kill(pids[1], signal.SIGSTOP)
    # A stop takes effect when a thread of the proc dequeues it, which on a loaded machine
    # can be milliseconds later; meanwhile an idle actor thread that reads its own calls may
    # still answer one. Wait until the kernel says the proc is stopped.
    deadline = time.monotonic() + 30
    while open(f"/proc/{pids[1]}/stat").read().rsplit(") ", 1)[1][0] != "T":
        assert time.monotonic() < deadline, "SIGSTOP never took effect"
        time.sleep(0.001)
    started = time.monotonic()
    try:
        busy.slice(gpus=1).pid.call_one().get(30)
    except Exception as exc:
        say("STOPPED", round(time.monotonic() - started), type(exc).__name__, exc)
    else:
        say("ANSWERED (not stopped?)")
    os.kill(pids[1], signal.SIGCONT)
    """
)


@pytest.mark.slow
def test_a_long_gil_holding_call_is_busy_not_stuck_and_a_stopped_proc_is_stuck() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-c", BUSY_OR_STUCK],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=180,
    )
    out = done.stdout
    assert "CRUNCHED" in out, (out, done.stderr[-3000:])
    assert float(out.split("CRUNCHED ")[1].split()[0]) >= 1.0, out  # held the GIL 2 timeouts
    assert "but its CPU time advances: busy" in done.stderr
    assert "STOPPED " in out, (out, done.stderr[-3000:])
    stopped = out.split("STOPPED ")[1]
    assert "sent no heartbeat" in stopped and "(stuck)" in stopped, out
    assert int(stopped.split()[0]) < 10, out


# -- large frames leave nothing behind, on the real path ------------------------------------


def test_large_arguments_and_results_leave_no_memory_behind() -> None:
    import gc

    from .hardening_actors import Big, rss

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        big = pm.spawn("big", Big)
        big.take.call_one(b"x").get(T)
        big.give.call_one(1).get(T)
        gc.collect()
        here, there = rss(), big.rss.call_one().get(T)
        for _ in range(2):
            data = bytes(64 << 20)
            assert big.take.call_one(data).get(T) == len(data)
            del data
            assert len(big.give.call_one(64 << 20).get(T)) == 64 << 20
        # Before: the writer kept its last batch and the reader its largest buffer (64 MiB
        # each side, for the life of the connection). Now the reader gives its buffer back
        # after a second without big frames.
        import time

        deadline = time.monotonic() + 10
        while True:
            gc.collect()
            kept_here = (rss() - here) >> 20
            kept_there = (big.rss.call_one().get(T) - there) >> 20
            if (kept_here < 32 and kept_there < 32) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert kept_here < 32 and kept_there < 32, (kept_here, kept_there)
    finally:
        pm.stop().get(T)
