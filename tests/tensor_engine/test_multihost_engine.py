"""The tensor engine across hosts (Linux network namespaces): gloo between real hosts, the
store reached over TCP, environments per host.

The controller is a fresh process: a test process that attached to other virtual hosts
before (tests/multihost) keeps the address it took then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from regency.testing import virtual_hosts, virtual_hosts_available  # noqa: E402

from ..conftest import TEST_SECRET  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        virtual_hosts_available() is not None, reason=str(virtual_hosts_available())
    ),
]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONTROLLER = textwrap.dedent(
    """
    import json, sys
    import torch
    import regency
    from regency.actor import attach_to_workers

    mesh = attach_to_workers(sys.argv[1:], lease=5.0)
    procs = mesh.spawn_procs(per_host={"gpus": 1})  # each proc imports torch: keep it to 2
    with procs.activate():
        x = torch.ones(3) * (1 + procs.rank_tensor("hosts"))  # 1, 2
        across = x.reduce("hosts", "sum")
        stacked = x.reduce("hosts", "stack")
    moved = x.slice_mesh(hosts=1).to_mesh(procs.slice(hosts=0))
    getenv = regency.remote("os.getenv", propagate="inspect")
    with procs.activate():
        local = [int(v) for v in getenv.call("LOCAL_RANK").get(60).values()]
        world = [int(v) for v in getenv.call("WORLD_SIZE").get(60).values()]
    print(json.dumps({
        "across": regency.inspect(across, hosts=1).tolist(),
        "stacked": regency.inspect(stacked, hosts=0).tolist(),
        "moved": regency.inspect(moved).tolist(),
        "local": local,
        "world": world,
    }))
    procs.stop().get(60)
    mesh.shutdown().get(60)
    """
)


def test_reduce_to_mesh_and_environment_across_hosts() -> None:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden: the test workers would not match")
    with virtual_hosts(2) as hosts:
        for host in hosts:
            host.start_worker(TEST_SECRET, port=7714)
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", CONTROLLER] + [h.worker_address for h in hosts],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["across"] == [3.0] * 3
    assert got["stacked"] == [[1.0] * 3, [2.0] * 3]
    assert got["moved"] == [2.0] * 3  # from the other host
    assert got["local"] == [0, 0] and got["world"] == [2, 2]
