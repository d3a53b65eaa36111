"""The tensor engine on real procs: gloo collectives, to_mesh, environment, errors, and
Monarch's distributed_tensors example. Few tests, each one real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import regency  # noqa: E402
from regency.actor import this_host  # noqa: E402
from regency.mesh_controller import RemoteException  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mesh() -> Any:
    procs = this_host().spawn_procs({"dp": 2, "tp": 2})  # no gpu dim
    yield procs
    procs.stop().get(30)


@pytest.mark.slow
def test_gloo_reductions_match_local_math(mesh: Any) -> None:
    with mesh.activate():
        rank = mesh.rank_tensor(("dp", "tp"))  # 0..3
        x = torch.arange(4.0) + rank * 10
        total = x.reduce(("dp", "tp"), "sum")
        mean = x.reduce("tp", "avg")
        biggest = x.reduce("dp", "max")
        bits = (rank + 5).reduce("tp", "bxor")
        stacked = x.reduce("tp", "stack")
        scattered = x.reduce("tp", "sum", scatter=True)
        alltoall = x.reduce("tp", "stack", scatter=True)
        inplace = x.clone()
        inplace.reduce_("dp", "product")
    rows = [torch.arange(4.0) + r * 10 for r in range(4)]
    at = regency.inspect
    assert at(total, dp=1, tp=1).tolist() == sum(rows).tolist()
    assert at(mean, dp=1).tolist() == ((rows[2] + rows[3]) / 2).tolist()
    assert at(biggest, tp=1).tolist() == rows[3].tolist()
    assert at(bits, dp=1).item() == 7 ^ 8
    assert at(stacked, dp=1, tp=0).tolist() == [rows[2].tolist(), rows[3].tolist()]
    assert at(scattered, dp=0, tp=1).tolist() == (rows[0] + rows[1])[2:].tolist()
    assert at(alltoall, dp=0, tp=0).tolist() == [0.0, 1.0, 10.0, 11.0]
    assert at(inplace, dp=0, tp=1).tolist() == (rows[1] * rows[3]).tolist()


@pytest.mark.slow
def test_to_mesh_environment_and_errors_on_real_procs(mesh: Any) -> None:
    first, second = mesh.slice(dp=0), mesh.slice(dp=1)
    with first.activate():
        x = torch.ones(2, 2) * (first.rank_tensor("tp") + 1)
    moved = x.to_mesh(second)
    with second.activate():
        doubled = moved * 2
    assert regency.inspect(doubled, tp=1).tolist() == [[4.0, 4.0], [4.0, 4.0]]

    getenv = regency.remote("os.getenv", propagate="inspect")
    with mesh.activate():
        env = {
            name: [int(v) for v in getenv.call(name).get().values()]
            for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
        }
    assert env == {
        "RANK": [0, 1, 2, 3],
        "LOCAL_RANK": [0, 1, 2, 3],  # no gpu dim: counted per host
        "WORLD_SIZE": [4] * 4,
        "LOCAL_WORLD_SIZE": [4] * 4,
    }

    with mesh.activate():
        huge = torch.empty(1 << 62, dtype=torch.uint8)  # cannot be allocated remotely
        poisoned = huge.sum()
        fine = torch.ones(3).sum()
    with pytest.raises(RemoteException) as caught:
        regency.inspect(poisoned, dp=1, tp=1)
    assert caught.value.rank == 3
    assert "huge = torch.empty(1 << 62" in str(caught.value)
    assert "allocate" in caught.value.worker_error_string
    assert regency.inspect(fine).item() == 3.0  # independent values and the workers go on


@pytest.mark.slow
def test_monarchs_distributed_tensors_example_runs_on_cpu() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(ROOT / "examples" / "distributed_tensors.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "RECOVERED!" in out and out.rstrip().endswith("DONE")
    assert "RemoteException: A remote function has failed asynchronously" in done.stderr
    assert "at least 32 rows work" in out


AT_EXIT = """
import sys, torch, regency
from regency.actor import this_host

def mark(t, path):
    with open(path, "w") as f:
        f.write(str(t.tolist()))

mesh = this_host().spawn_procs({"gpus": 1})
with mesh.activate():
    t = torch.ones(2)
regency.inspect(t)
regency.remote(mark, propagate="inspect")(t + 1, sys.argv[1])  # nothing fetches after this
"""


@pytest.mark.slow
def test_ops_still_pending_when_the_program_ends_are_run(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", AT_EXIT, str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.read_text() == "[2.0, 2.0]"
