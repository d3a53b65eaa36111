"""Seeing inside a running job with real procs: stacks of every rank, timeouts that name the
late ranks, stall warnings, the flight recorder, procs that cannot answer, the CLI."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import regency
from regency.actor import ActorError, ProcMesh
from regency.introspection import CallTimeoutError, JobStacks

from ..conftest import SpawnProcs, stop_and_wait
from .actors import AsyncioStuck, Stuck, TrioStuck

T = 30


@pytest.fixture
def release(tmp_path: Path) -> Iterator[str]:
    """A path whose existence lets every stuck rank go (created at the end in any case)."""
    path = tmp_path / "release"
    yield str(path)
    path.touch()


@pytest.fixture
def procs(spawn_procs: SpawnProcs) -> ProcMesh:
    pm = spawn_procs({"gpus": 4})
    pm.initialized.get(T)
    return pm


def test_stacks_name_the_stuck_rank_its_endpoint_and_line(procs: ProcMesh, release: str) -> None:
    stuck = procs.spawn("stuck", Stuck)
    assert stuck.ping.call().get(T).values() == ["pong"] * 4
    fut = stuck.hang.call(release, 2)
    # Ranks 0, 1, 3 answer at once; rank 2 hangs, and a second message waits behind it.
    queued = stuck.slice(gpus=2).ping.call_one()
    deadline = time.monotonic() + T
    while True:
        stacks = regency.stacks(procs)
        found = stacks.actor("stuck", 2)
        others_idle = all(
            (a := stacks.actor("stuck", rank)) is not None and a[1].endpoint is None
            for rank in (0, 1, 3)
        )
        # (at the stuck line: a capture may land in the loop's os.path.exists instead)
        at_wait = any("the stuck line" in f.source for f in stacks.frames_of("stuck", 2))
        if found is not None and found[1].endpoint == "hang" and found[1].queued == 1 and (
            others_idle and at_wait
        ):
            break
        assert time.monotonic() < deadline, str(stacks)
        time.sleep(0.05)
    assert isinstance(stacks, JobStacks)
    assert [p.answered for p in stacks.procs] == [True] * 4
    assert [dict(p.coords) for p in stacks.procs] == [{"gpus": i} for i in range(4)]
    assert all(p.pid > 0 and p.pid != os.getpid() for p in stacks.procs)
    _, actor = found
    assert actor.cls.endswith("actors.Stuck") and actor.running_for is not None
    frames = stacks.frames_of("stuck", 2)
    assert any(f.function == "hang" and "the stuck line" in f.source for f in frames), frames
    assert frames[0].function == "hang"  # the mailbox loop below the endpoint is left out
    for rank in (0, 1, 3):
        assert stacks.actor("stuck", rank)[1].endpoint is None
    text = str(stacks)
    assert "Stuck 'stuck' ranks 0-1, 3: same stack: idle" in text
    assert "Stuck 'stuck' rank 2: in endpoint hang for" in text
    assert "1 message(s) queued" in text and "the stuck line" in text
    Path(release).touch()
    assert fut.get(T).values() == [0, 1, 2, 3]
    assert queued.get(T) == "pong"


@pytest.mark.parametrize("cls", [TrioStuck, AsyncioStuck], ids=["trio", "asyncio"])
def test_async_endpoints_show_their_await_chain(
    procs: ProcMesh, release: str, cls: type[Any]
) -> None:
    mesh = procs.spawn("waiter", cls)
    fut = mesh.hang.call(release)
    deadline = time.monotonic() + T
    while True:
        stacks = regency.stacks(mesh)
        calls = [c for p in stacks.procs for c in p.calls]
        # (A call's coroutine shows its first line until the loop has started it.)
        if len(calls) == 4 and all("await" in c.frames[0].source for c in calls):
            break
        assert time.monotonic() < deadline, str(stacks)
        time.sleep(0.05)
    library = "trio" if cls is TrioStuck else "asyncio"
    for call in calls:
        assert call.endpoint == "hang"
        assert call.frames[0].function == "hang"
        assert f"the {library} await" in call.frames[0].source
    assert "ranks 0-3: same stack: in endpoint hang (async)" in str(stacks)
    Path(release).touch()
    assert fut.get(T).values() == ["done"] * 4


def test_a_timed_out_call_names_the_late_rank_and_what_it_does(
    procs: ProcMesh, release: str
) -> None:
    stuck = procs.spawn("late", Stuck)
    stuck.ping.call().get(T)
    fut = stuck.hang.call(release, 1)
    with pytest.raises(TimeoutError) as info:
        fut.get(timeout=1.0)
    error = info.value
    assert isinstance(error, CallTimeoutError)
    assert error.ranks == (1,)
    message = str(error)
    assert "late.hang did not finish within 1.0 s: 1 of 4 rank(s) did not answer" in message
    assert "rank 1 on proc" in message and "in endpoint hang for" in message
    assert "the stuck line" in message and "actors.py" in message
    assert isinstance(error.stacks, JobStacks)
    # A one-rank call says the same; the call goes on and answers once released.
    one = stuck.slice(gpus=1).hang.call_one(release, 1)
    with pytest.raises(CallTimeoutError, match=r"rank 1 on proc .*1 queued behind it"):
        one.get(timeout=0.5)
    Path(release).touch()
    assert fut.get(T).values() == [0, 1, 2, 3]
    assert one.get(T) == 1


def test_the_flight_recorder_keeps_the_last_calls(procs: ProcMesh) -> None:
    mesh = procs.spawn("recorded", Stuck)
    for _ in range(70):
        mesh.ping.call().get(T)
    with pytest.raises(ActorError, match="bad value 42"):
        mesh.fail.call().get(T)
    # A reply goes out before its call is recorded: wait until every rank has recorded it.
    deadline = time.monotonic() + T
    while True:
        stacks = regency.stacks(mesh)
        lasts = [stacks.actor("recorded", rank)[1].recent[-1].endpoint for rank in range(4)]
        if lasts == ["fail"] * 4:
            break
        assert time.monotonic() < deadline, lasts
        time.sleep(0.02)
    for rank in range(4):
        _, actor = stacks.actor("recorded", rank)
        assert len(actor.recent) == 64
        last = actor.recent[-1]
        assert last.endpoint == "fail" and last.outcome == "raised ValueError: bad value 42"
        assert actor.recent[-2].endpoint == "ping" and actor.recent[-2].outcome == "returned"
        assert last.queued <= last.started <= last.finished
        assert last.sender.startswith("unix://")


def test_paused_and_killed_procs_are_listed_with_the_reason(spawn_procs: SpawnProcs) -> None:
    pm = spawn_procs({"gpus": 3})
    mesh = pm.spawn("victims", Stuck)
    mesh.ping.call().get(T)
    pids = [p.pid for p in regency.stacks(pm).procs]
    stop_and_wait(pids[1])
    try:
        os.kill(pids[2], signal.SIGKILL)
        deadline = time.monotonic() + T
        while True:
            stacks = regency.stacks(pm, timeout=1.0)
            if "exited" in stacks.procs[2].reason:
                break
            assert time.monotonic() < deadline, str(stacks)
        assert stacks.procs[0].answered
        assert not stacks.procs[1].answered and "paused" in stacks.procs[1].reason
        assert f"pid {pids[1]}" in stacks.procs[1].reason
        assert not stacks.procs[2].answered
        text = str(stacks)
        assert "paused" in text and "exited" in text
    finally:
        os.kill(pids[1], signal.SIGCONT)


def test_stall_warnings_at_the_controller(
    spawn_procs: SpawnProcs,
    configured: Callable[..., None],
    release: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    configured(stall_warning_s=0.5, heartbeat_interval=0.25)
    pm = spawn_procs({"gpus": 2})
    mesh = pm.spawn("stalls", Stuck)
    mesh.ping.call().get(T)
    caplog.set_level(logging.INFO, logger="regency.stall")
    fut = mesh.hang.call(release, 0)
    deadline = time.monotonic() + T

    def stall_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "regency.stall"]

    while sum("has run for" in m for m in stall_lines()) < 2:  # 0.5 s, then 1 s
        assert time.monotonic() < deadline, stall_lines()
        time.sleep(0.05)
    first = next(m for m in stall_lines() if "has run for" in m)
    assert "Stuck 'stalls' rank 0" in first and "endpoint hang" in first
    assert "pid" in first and "host" in first and "the stuck line" in first
    Path(release).touch()
    assert fut.get(T).values() == [0, 1]
    while not any("ended after" in m for m in stall_lines()):
        assert time.monotonic() < deadline, stall_lines()
        time.sleep(0.05)
    warnings = [r for r in caplog.records if r.name == "regency.stall" and "has run" in r.message]
    assert all(r.levelno == logging.WARNING for r in warnings)
    assert all("rank 0" in r.getMessage() for r in warnings)  # rank 1 never stalled


def test_stall_warning_s_is_validated(configured: Callable[..., None]) -> None:
    with pytest.raises(ValueError, match="stall_warning_s must be zero or more"):
        configured(stall_warning_s=-1)


def test_stacks_refuses_a_bad_target_or_timeout() -> None:
    with pytest.raises(TypeError, match="stacks\\(\\) takes a ProcMesh, an ActorMesh"):
        regency.stacks("procs")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        regency.stacks(timeout=0)


CONTROLLER = textwrap.dedent(
    """
    import sys, time
    from regency.actor import this_host
    from tests.introspection.actors import Stuck
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("cli", Stuck)
    mesh.ping.call().get(30)
    fut = mesh.hang.call(sys.argv[1], 1)
    print("ready", flush=True)
    fut.get(60)
    """
)


def test_the_cli_prints_a_running_controllers_stacks(tmp_path: Path) -> None:
    release = tmp_path / "release"
    root = Path(__file__).resolve().parents[2]
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(release)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert controller.stdout is not None
        assert controller.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        command = [sys.executable, "-m", "regency", "stacks", "--pid", str(controller.pid)]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "stacks of 2 proc(s), 2 answered" in shown.stdout
        assert "Stuck 'cli' rank 1: in endpoint hang" in shown.stdout
        assert "the stuck line" in shown.stdout
        as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60)
        data = json.loads(as_json.stdout)
        assert [p["answered"] for p in data["procs"]] == [True, True]
        missing = subprocess.run(
            [sys.executable, "-m", "regency", "stacks", "--pid", "1"],
            capture_output=True, text=True, timeout=60,
        )
        assert missing.returncode == 2 and "no running controller with pid 1" in missing.stderr
    finally:
        release.touch()
        try:
            controller.wait(T)
        finally:
            controller.kill()
    assert controller.returncode == 0
    record = Path.home() / ".regency" / f"controller-{controller.pid}.json"
    assert not record.exists()


def test_a_dead_actors_report_ends_with_its_last_calls(
    spawn_procs: SpawnProcs, roots: Any
) -> None:
    pm = spawn_procs({"gpus": 2})
    mesh = pm.spawn("dying", Stuck)
    for _ in range(3):
        mesh.ping.call().get(T)
    mesh.slice(gpus=1).fail.broadcast()  # no caller waiting: the actor dies of it
    failure = roots.wait_for("dying")
    trace = failure.cause.traceback
    assert "ValueError: bad value 42" in trace
    tail = trace[trace.index("last 4 call(s) dying rank 1 handled, newest last:") :]
    assert tail.count("ping from unix://") == 3
    assert "fail (no reply): raised ValueError: bad value 42" in tail.splitlines()[-1]


def test_stream_and_accumulator_timeouts_explain_too(procs: ProcMesh, release: str) -> None:
    from regency.actor import Accumulator

    mesh = procs.spawn("folded", Stuck)
    mesh.ping.call().get(T)
    streamed = list(mesh.hang.stream(release, 3))
    answered = sorted(f.get(T) for f in streamed[:3])  # the first three to answer
    assert answered == [0, 1, 2]
    with pytest.raises(CallTimeoutError, match=r"(?s)folded\.hang did not finish .*rank 3 on proc"):
        streamed[3].get(timeout=0.5)
    total = Accumulator(mesh.hang, 0, lambda acc, rank: acc + rank).accumulate(release, 3)
    with pytest.raises(CallTimeoutError) as info:
        total.get(timeout=0.5)
    assert info.value.ranks == (3,)
    assert "1 queued behind it" in str(info.value)
    Path(release).touch()
    assert streamed[3].get(T) == 3
    assert total.get(T) == 6
