"""Pure parts of the tensor engine: groups, environments, tables, errors. No procs."""

from __future__ import annotations

import pickle
import traceback

import pytest

torch = pytest.importorskip("torch")

import regency  # noqa: E402
from regency._tensor_engine._collectives import groups_of  # noqa: E402
from regency._tensor_engine._comm import _combine, finish_avg  # noqa: E402
from regency._tensor_engine._engine import _env_for, _host_of  # noqa: E402
from regency._tensor_engine._records import Failure  # noqa: E402
from regency.core import ProcMesh, Shape  # noqa: E402
from regency.mesh_controller import RemoteException  # noqa: E402


def test_groups_are_the_points_equal_on_every_other_dim() -> None:
    shape = Shape.full(["host", "gpu"], [2, 3])
    assert groups_of(shape, ("gpu",)) == [(0, 1, 2), (3, 4, 5)]
    assert groups_of(shape, ("host",)) == [(0, 3), (1, 4), (2, 5)]
    assert groups_of(shape, ("host", "gpu")) == [(0, 1, 2, 3, 4, 5)]
    sliced = shape.slice(gpu=slice(1, 3))  # global ranks 1, 2, 4, 5
    assert groups_of(sliced, ("host",)) == [(1, 4), (2, 5)]


def test_environment_from_a_gpu_dim_or_per_host() -> None:
    procs = tuple((f"p{i}", f"unix:///tmp/p{i}.sock") for i in range(4))
    with_gpus = _env_for(procs, Shape.full(["host", "gpu"], [2, 2]))
    assert [e["LOCAL_RANK"] for e in with_gpus] == ["0", "1", "0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in with_gpus} == {"2"}
    assert [e["RANK"] for e in with_gpus] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in with_gpus} == {"4"}
    remote = tuple(
        (f"p{i}", f"tcp://10.0.0.{1 + i // 3}:700{i}") for i in range(5)
    )  # 3 procs on one host, 2 on another, no gpu dim
    per_host = _env_for(remote, None)
    assert [e["LOCAL_RANK"] for e in per_host] == ["0", "1", "2", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in per_host] == ["3", "3", "3", "2", "2"]
    assert _host_of("sim://h3/p1") == "h3" and _host_of("tcp://[::1]:80") == "::1"


def test_local_combination_matches_each_reduction() -> None:
    values = [torch.tensor([6, 3]), torch.tensor([5, 9]), torch.tensor([3, 1])]
    assert _combine(values, "sum").tolist() == [14, 13]
    assert _combine(values, "product").tolist() == [90, 27]
    assert _combine(values, "min").tolist() == [3, 1]
    assert _combine(values, "max").tolist() == [6, 9]
    assert _combine(values, "band").tolist() == [6 & 5 & 3, 3 & 9 & 1]
    assert _combine(values, "bor").tolist() == [6 | 5 | 3, 3 | 9 | 1]
    assert _combine(values, "bxor").tolist() == [6 ^ 5 ^ 3, 3 ^ 9 ^ 1]
    total = _combine(values, "avg")
    finish_avg(total, 3)
    assert total.tolist() == [4, 4]  # integers round toward minus infinity
    floats = torch.tensor([1.0, 2.0])
    finish_avg(floats, 4)
    assert floats.tolist() == [0.25, 0.5]


def test_to_table_lists_every_proc_with_its_coordinates() -> None:
    procs = tuple((f"c1.p{i}", f"unix:///tmp/p{i}") for i in range(4))
    mesh = ProcMesh(procs, Shape.full(["host", "gpu"], [2, 2])).slice(gpu=1)
    assert mesh.to_table() == "host  rank  proc\n   0     1  c1.p1\n   1     3  c1.p3"


def test_remote_exception_reads_like_monarchs_and_pickles() -> None:
    failure = Failure(
        7, 2, "ValueError", "bad", "Traceback (most recent call last):\nValueError: bad\n"
    )
    frames = [traceback.FrameSummary("train.py", 12, "step", lookup_line=False, line="y = f(x)")]
    error = RemoteException(failure, frames)
    assert error.rank == 2 and error.seq == 7 and error.exception_type == "ValueError"
    assert str(error) == (
        "A remote function has failed asynchronously on rank 2.\n"
        "Traceback of where the remote function was issued on controller (most recent call "
        'last):\n  File "train.py", line 12, in step\n    y = f(x)\n'
        "Error as reported from worker:\nTraceback (most recent call last):\nValueError: bad"
    )
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error)


def test_names_and_errors_without_a_mesh() -> None:
    assert regency.Stream("x").name == "x" and regency.get_active_stream().name == "main"
    with pytest.raises(TypeError, match="non-empty str"):
        regency.Stream("")
    with pytest.raises(TypeError, match=r"borrow takes a regency\.Tensor"):
        regency.Stream("x").borrow(torch.ones(1))
    assert regency.fetch_shard({"a": 1}).get() == {"a": 1}
    with pytest.raises(ValueError, match="no device mesh is active and no argument"):
        regency.remote("torch.add")(1, 2)
    with pytest.raises(TypeError, match=r"made with regency\.remote"):
        regency.call_on_shard_and_fetch(len)
    with pytest.raises(AttributeError, match="no attribute 'Tensr'"):
        regency.Tensr  # noqa: B018
