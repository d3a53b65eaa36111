"""Stacks across hosts (two network namespaces with real workers over TCP) and through a
casting tree's forwarders."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import regency
from regency.actor import HostMesh, attach_to_workers
from regency.introspection import CallTimeoutError
from regency.testing import VirtualHost, virtual_hosts, virtual_hosts_available

from ..conftest import TEST_SECRET, SpawnProcs
from .actors import Stuck

T = 30


@pytest.fixture
def release(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "release"
    yield str(path)
    path.touch()


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[HostMesh]:
    why = virtual_hosts_available()
    if why is not None:
        pytest.skip(str(why))
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden: the test workers would not match")
    with virtual_hosts(2) as machines:
        hosts: list[VirtualHost] = machines
        try:
            for host in hosts:
                host.start_worker(TEST_SECRET, scheme="tcp")
            mesh = attach_to_workers([h.worker_address for h in hosts], lease=30.0)
            try:
                yield mesh
            finally:
                mesh.shutdown().get(T)
        finally:
            for host in hosts:
                host.stop_worker()


@pytest.mark.slow
def test_stacks_across_two_hosts(
    two_hosts: HostMesh, spawn_procs: SpawnProcs, release: str
) -> None:
    pm = spawn_procs({"gpus": 2}, on=two_hosts)
    stuck = pm.spawn("remote", Stuck)
    stuck.ping.call().get(T)
    fut = stuck.hang.call(release, 3)  # hosts=1, gpus=1
    deadline = time.monotonic() + T
    while True:
        stacks = regency.stacks(pm)
        found = stacks.actor("remote", 3)
        if found is not None and found[1].endpoint == "hang":
            break
        assert time.monotonic() < deadline, str(stacks)
        time.sleep(0.05)
    assert [dict(p.coords) for p in stacks.procs] == [
        {"hosts": h, "gpus": g} for h in range(2) for g in range(2)
    ]
    assert all(p.answered and p.pid > 0 for p in stacks.procs)
    ips = {p.address.split("://")[1].rsplit(":", 1)[0] for p in stacks.procs}
    assert len(ips) == 2  # two hosts, each with its own address
    assert any("the stuck line" in f.source for f in stacks.frames_of("remote", 3))
    # The default target (every proc the controller owns) and a host slice find them too.
    everything = regency.stacks()
    assert {p.address for p in stacks.procs} <= {p.address for p in everything.procs}
    second = regency.stacks(two_hosts.slice(hosts=1))
    assert {p.address for p in second.procs} == {p.address for p in stacks.procs[2:]}
    with pytest.raises(CallTimeoutError, match=r"rank 3 on proc .* in endpoint hang for"):
        fut.get(timeout=0.5)
    Path(release).touch()
    assert fut.get(T).values() == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_late_rank_behind_a_casting_tree_is_named(
    spawn_procs: SpawnProcs, configured: Callable[..., None], release: str
) -> None:
    configured(cast_tree_min=2, cast_fanout=2)  # every cast to 2+ procs goes down a tree
    pm = spawn_procs({"gpus": 6})
    stuck = pm.spawn("treed", Stuck)
    assert stuck.ping.call().get(T).values() == ["pong"] * 6
    fut = stuck.hang.call(release, 5)
    with pytest.raises(CallTimeoutError) as info:
        fut.get(timeout=1.0)
    # Ranks 3 and 4 answered, but their replies are gathered with rank 5's by a forwarder.
    assert info.value.ranks == (5,)
    message = str(info.value)
    assert "1 of 6 rank(s) did not answer (2 more did;" in message
    assert "rank 5 on proc" in message and "the stuck line" in message
    assert "ranks 3-4 on 2 procs: handled the call" in message
    Path(release).touch()
    assert fut.get(T).values() == list(range(6))
