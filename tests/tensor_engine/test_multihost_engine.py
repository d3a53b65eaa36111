"""The tensor engine across hosts (Linux network namespaces): gloo between real hosts, the
store reached over TCP, environments per host."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import regency  # noqa: E402
from regency.actor import attach_to_workers  # noqa: E402
from regency.testing import virtual_hosts, virtual_hosts_available  # noqa: E402

from ..conftest import TEST_SECRET  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        virtual_hosts_available() is not None, reason=str(virtual_hosts_available())
    ),
]
T = 60


@pytest.fixture(scope="module")
def procs() -> Iterator[Any]:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden: the test workers would not match")
    with virtual_hosts(2) as hosts:
        for host in hosts:
            # Not the default port: tests/multihost used the same addresses in this process,
            # and a link to an address that went away stays broken.
            host.start_worker(TEST_SECRET, port=7714)
        mesh = attach_to_workers([h.worker_address for h in hosts], lease=5.0)
        pm = mesh.spawn_procs(per_host={"gpus": 1})  # each proc imports torch: keep it to 2
        yield pm
        pm.stop().get(T)
        mesh.shutdown().get(T)


def test_reduce_to_mesh_and_environment_across_hosts(procs: Any) -> None:
    with procs.activate():
        x = torch.ones(3) * (1 + procs.rank_tensor("hosts"))  # 1, 2
        across = x.reduce("hosts", "sum")
        stacked = x.reduce("hosts", "stack")
    moved = x.slice_mesh(hosts=1).to_mesh(procs.slice(hosts=0))
    assert regency.inspect(across, hosts=1).tolist() == [3.0] * 3
    assert regency.inspect(stacked, hosts=0).tolist() == [[1.0] * 3, [2.0] * 3]
    assert regency.inspect(moved).tolist() == [2.0] * 3  # from the other host
    getenv = regency.remote("os.getenv", propagate="inspect")
    with procs.activate():
        local = [int(v) for v in getenv.call("LOCAL_RANK").get(T).values()]
        world = {int(v) for v in getenv.call("WORLD_SIZE").get(T).values()}
    assert local == [0, 0] and world == {2}
