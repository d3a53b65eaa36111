"""Timelines of real runs (Chrome trace-event JSON): spans per handled call, flows from send
to handling with clocks aligned, failures and stalls as instants, bounded rings; the whole
run through ``trace_path``; the same in the simulator, replayed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import regency
from regency.actor import ActorError
from regency.core import current_runtime
from regency.sim import simulate

from ..conftest import SpawnProcs
from .actors import Forever, Stuck

T = 30


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _names(data: dict[str, Any], kind: str) -> dict[int, str]:
    return {
        e.get("tid", e["pid"]) if kind == "thread_name" else e["pid"]: e["args"]["name"]
        for e in data["traceEvents"]
        if e["ph"] == "M" and e["name"] == kind
    }


def test_a_traced_block_writes_spans_flows_and_instants(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    configured(stall_warning_s=0.3, heartbeat_interval=0.1)
    pm = spawn_procs({"gpus": 2})
    mesh = pm.spawn("traced", Stuck)
    mesh.ping.call().get(T)
    # (A reply leaves before its call is recorded: wait for both records, or the ping
    # above could land in the trace.)
    deadline = time.monotonic() + T
    while not all(
        (found := regency.stacks(pm).actor("traced", rank)) is not None and found[1].recent
        for rank in (0, 1)
    ):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    path = tmp_path / "run.json"
    release = tmp_path / "release"
    with regency.trace(str(path)):
        assert mesh.ping.call().get(T).values() == ["pong", "pong"]
        assert mesh.slice(gpus=1).ping.call_one().get(T) == "pong"
        with pytest.raises(ActorError):
            mesh.fail.call().get(T)
        fut = mesh.hang.call(str(release), 0)
        deadline = time.monotonic() + T
        while True:  # rank 0 stalls: past 0.3 s and 0.6 s, with a watchdog tick every 0.1 s
            found = regency.stacks(pm).actor("traced", 0)
            if found is not None and (found[1].running_for or 0.0) > 1.0:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        release.touch()
        fut.get(T)
    data = _load(path)
    # The trace holds every proc of the controller (other tests' too): keep ours.
    ours = {p.proc_id for p in regency.stacks(pm).procs} | {current_runtime().proc_id}
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"}
    pids = {pid for pid, name in names.items() if name.split(" (")[0] in ours}
    assert len(pids) == 3  # the controller and two procs
    assert all("pid" in names[pid] for pid in pids)
    events = [e for e in data["traceEvents"] if e["pid"] in pids]
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"Stuck traced[0]", "Stuck traced[1]", "thread MainThread"} <= threads
    spans = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in spans) == ["fail", "fail", "hang", "hang", "ping", "ping", "ping"]
    assert {e["args"]["outcome"] for e in spans if e["name"] == "fail"} == {
        "raised ValueError: bad value 42"
    }
    hang0 = next(e for e in spans if e["name"] == "hang" and e["dur"] > 500_000)
    assert hang0["dur"] >= 1_000_000
    # Every handling has its send, and follows it in time (one host: one clock).
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = [e for e in events if e["ph"] == "f"]
    assert len(ends) == 7, ends
    for end in ends:
        assert end["id"] in starts
        assert starts[end["id"]]["ts"] <= end["ts"]
    stalls = [e for e in events if e["ph"] == "i" and e["name"] == "stall"]
    assert stalls and stalls[0]["args"]["endpoint"] == "hang", events
    assert not data["otherData"]["dropped"] and not data["otherData"]["missing"]
    # After the block, nothing is recorded.
    mesh.ping.call().get(T)
    assert current_runtime().trace is None


def test_a_full_ring_drops_the_oldest_and_says_so(
    spawn_procs: SpawnProcs, tmp_path: Path
) -> None:
    pm = spawn_procs({"gpus": 1})
    mesh = pm.spawn("small", Stuck)
    path = tmp_path / "small.json"
    with regency.trace(str(path), capacity=10):
        for _ in range(20):
            mesh.ping.call().get(T)
    data = _load(path)
    dropped = data["otherData"]["dropped"]
    assert dropped and all(n > 0 for n in dropped.values())
    assert any("dropped (ring full)" in e["name"] for e in data["traceEvents"])


def test_trace_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="trace\\(\\) needs a file path"), regency.trace(""):
        pass
    missing = str(tmp_path / "no" / "such" / "run.json")
    with pytest.raises(FileNotFoundError, match="does not exist"), regency.trace(missing):
        pass
    bad = str(tmp_path / "x.json")
    with pytest.raises(ValueError, match="capacity must be a positive int"), regency.trace(
        bad, capacity=0
    ):
        pass


WHOLE_RUN = textwrap.dedent(
    """
    import sys
    import regency
    from regency.actor import this_host
    from tests.introspection.actors import Stuck
    regency.configure(trace_path=sys.argv[1])
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("whole", Stuck)
    for _ in range(3):
        mesh.ping.call().get(30)
    """
)


def test_trace_path_records_the_whole_run(tmp_path: Path) -> None:
    path = tmp_path / "whole.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", WHOLE_RUN, str(path)], cwd=root, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = _load(path)
    spans = [e for e in data["traceEvents"] if e["ph"] == "X" and e["name"] == "ping"]
    assert len(spans) == 6


def _program(path: str) -> Callable[[Any], None]:
    def program(hosts: Any) -> None:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        mesh = procs.spawn("simtrace", Forever)
        with regency.trace(path):
            mesh.ok.call().get(10)
            try:
                mesh.wait.call().get(timeout=5.0)
            except TimeoutError:
                pass

    return program


def test_a_simulated_run_traces_in_virtual_time_and_replays(
    configured: Callable[..., None], tmp_path: Path
) -> None:
    configured(stall_warning_s=2)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    simulate(_program(str(first)), seed=7, hosts=2)
    simulate(_program(str(second)), seed=7, hosts=2)
    data = _load(first)
    spans = [e for e in data["traceEvents"] if e["ph"] == "X" and e["name"] == "ok"]
    assert len(spans) == 4
    stalls = [e for e in data["traceEvents"] if e["ph"] == "i" and e["name"] == "stall"]
    assert len(stalls) == 8  # 2 s and 4 s of virtual time, on each of 4 ranks
    assert first.read_text() == second.read_text()


def test_calls_down_a_casting_tree_have_their_arrows(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    """A call cast down a tree whose forwarders gather the replies: each rank's handling
    still ends an arrow from the sender's send (through the tree's id)."""
    configured(cast_tree_min=2, cast_fanout=2)  # every cast to 2+ procs goes down a tree
    pm = spawn_procs({"gpus": 4})
    mesh = pm.spawn("tree_traced", Stuck)
    tree_casts = current_runtime().casting.tree_casts
    path = tmp_path / "tree.json"
    with regency.trace(str(path)):
        assert mesh.ping.call().get(T).values() == ["pong"] * 4
    assert current_runtime().casting.tree_casts > tree_casts, "the call went down no tree"
    events = _load(path)["traceEvents"]
    tracks = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    ours = [
        e for e in events
        if e["ph"] == "X" and tracks[e["pid"], e["tid"]].startswith("Stuck tree_traced[")
    ]
    assert len(ours) == 4
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {
        e["id"]: e for e in events
        if e["ph"] == "f" and tracks[e["pid"], e["tid"]].startswith("Stuck tree_traced[")
    }
    assert len(ends) == 4, ends  # one arrow per rank, however deep in the tree
    for flow, end in ends.items():
        assert flow in starts and starts[flow]["ts"] <= end["ts"]
