"""The tensor engine with CUDA tensors on the workers: factories with ``device="cuda"``,
``.cuda()``, ops, fetches (which arrive on the controller's CPU, as in Monarch), gloo
collectives and ``to_mesh`` of CUDA tensors between procs sharing one GPU (staged through host
memory), and NCCL inside a worker with world size 1. Skips without a GPU."""

from __future__ import annotations

import socket
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import regency  # noqa: E402
from regency.actor import this_host  # noqa: E402

pytestmark = pytest.mark.slow  # and skipped without a GPU (conftest.py)


@pytest.fixture(scope="module")
def mesh() -> Any:
    procs = this_host().spawn_procs({"gpus": 2})  # two procs sharing the one GPU
    yield procs
    procs.stop().get(30)


def test_cuda_factories_ops_and_fetch(mesh: Any) -> None:  # pragma: no cover - needs a GPU
    device_of = regency.remote("tests.gpu.helpers.device_of", propagate="inspect")
    with mesh.activate():
        rank = mesh.rank_tensor("gpus")
        a = torch.ones(3, 4, device="cuda") * (rank + 1).cuda()
        b = torch.arange(4.0).cuda()
        c = a @ b
        where = device_of.call(c).get(60)
    assert a.device.type == "cuda" and c.device.type == "cuda"  # the handles say so
    assert sorted(where.values()) == ["cuda:0", "cuda:0"]
    got = regency.inspect(c, gpus=1)
    assert got.device.type == "cpu"  # fetched to the controller's CPU, as in Monarch
    assert got.tolist() == [12.0, 12.0, 12.0]
    pair = regency.fetch_shard({"a": a, "b": b}, gpus=0).get(60)
    assert pair["a"].device.type == "cpu" and pair["a"].sum().item() == 12.0
    as_cuda = regency.remote("tests.gpu.helpers.as_cuda", propagate=lambda t: t.cuda())
    one = regency.call_on_shard_and_fetch(as_cuda, b, shard={"gpus": 1}).get(60)
    assert one.device.type == "cpu" and one.tolist() == [0.0, 2.0, 4.0, 6.0]


def test_gloo_collectives_of_cuda_tensors(mesh: Any) -> None:  # pragma: no cover
    device_of = regency.remote("tests.gpu.helpers.device_of", propagate="inspect")
    with mesh.activate():
        rank = mesh.rank_tensor("gpus").cuda()
        x = torch.arange(4.0, device="cuda") + rank * 10
        total = x.reduce("gpus", "sum")
        mean = x.reduce("gpus", "avg")
        stacked = x.reduce("gpus", "stack")
        scattered = x.reduce("gpus", "sum", scatter=True)
        alltoall = x.reduce("gpus", "stack", scatter=True)
        inplace = x.clone()
        inplace.reduce_("gpus", "max")
        devices = [device_of.call(t).get(60) for t in (total, stacked, scattered, inplace)]
    for per_rank in devices:
        assert sorted(per_rank.values()) == ["cuda:0", "cuda:0"]
    rows = [torch.arange(4.0) + r * 10 for r in range(2)]
    at = regency.inspect
    assert at(total, gpus=1).tolist() == (rows[0] + rows[1]).tolist()
    assert at(mean, gpus=0).tolist() == ((rows[0] + rows[1]) / 2).tolist()
    assert at(stacked, gpus=1).tolist() == [rows[0].tolist(), rows[1].tolist()]
    assert at(scattered, gpus=1).tolist() == (rows[0] + rows[1])[2:].tolist()
    assert at(alltoall, gpus=0).tolist() == [0.0, 1.0, 10.0, 11.0]
    assert at(inplace, gpus=0).tolist() == rows[1].tolist()
    paths = regency.remote("tests.gpu.helpers.comm_paths", propagate="inspect")
    with mesh.activate():
        used = paths.call(x).get(60)
    # Two procs on one GPU: NCCL would refuse them, so the reductions went through gloo.
    assert list(used.values()) == [{"0.1": "gloo"}] * 2


def test_a_failed_member_of_a_cuda_reduction_does_not_hang_the_others(
    mesh: Any,
) -> None:  # pragma: no cover - needs a GPU
    from regency.mesh_controller import RemoteException

    fail = regency.remote("tests.gpu.helpers.fail_on_rank_one", propagate=lambda t: t.cuda())
    with mesh.activate():
        x = fail(torch.zeros(4))
        total = x.reduce("gpus", "sum")
        after = torch.ones(2, device="cuda") * 3  # the workers go on
    with pytest.raises(RemoteException, match="rank 1 fails on purpose"):
        regency.inspect(total, gpus=1)
    assert regency.inspect(after, gpus=1).tolist() == [3.0, 3.0]
    assert regency.inspect(after, gpus=0).tolist() == [3.0, 3.0]


def test_to_mesh_keeps_cuda_tensors_on_the_gpu(mesh: Any) -> None:  # pragma: no cover
    device_of = regency.remote("tests.gpu.helpers.device_of", propagate="inspect")
    first, second = mesh.slice(gpus=0), mesh.slice(gpus=1)
    with first.activate():
        x = torch.full((2, 3), 7.0, device="cuda")
    moved = x.to_mesh(second)
    with second.activate():
        doubled = moved * 2
        where = device_of.call(doubled).get(60)
    assert list(where.values()) == ["cuda:0"]
    assert regency.inspect(doubled).tolist() == [[14.0] * 3] * 2


def test_reductions_on_a_gpu_of_its_own_use_nccl() -> None:  # pragma: no cover - needs a GPU
    """A group whose members each have a GPU of their own reduces on the GPU with NCCL, as
    Monarch does; with one GPU here that is a one-proc mesh (world size 1)."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    procs = this_host().spawn_procs({"gpus": 1})
    try:
        paths = regency.remote("tests.gpu.helpers.comm_paths", propagate="inspect")
        with procs.activate():
            x = torch.arange(6.0, device="cuda")
            total = x.reduce("gpus", "sum")
            mean = x.reduce("gpus", "avg")
            stacked = x.reduce("gpus", "stack")
            bits = torch.arange(4, device="cuda").reduce("gpus", "bxor")  # gloo: NCCL has none
            x.reduce_("gpus", "max")
            used = paths.call(x).get(60)
        assert list(used.values()) == [{"0": "nccl"}]
        assert regency.inspect(total).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert regency.inspect(mean).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert regency.inspect(stacked).tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]
        assert regency.inspect(bits).tolist() == [0, 1, 2, 3]
        assert regency.inspect(x).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    finally:
        procs.stop().get(30)


def test_nccl_in_a_worker_with_world_size_one() -> None:  # pragma: no cover - needs a GPU
    """A user's remote function may run NCCL itself; one rank per GPU, so world size 1 here."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = this_host().spawn_procs({"gpus": 1})
    try:
        nccl = regency.remote("tests.gpu.helpers.nccl_allreduce", propagate=lambda t, p: t)
        with procs.activate():
            x = torch.arange(5.0, device="cuda")
            y = nccl(x, port)
        assert regency.inspect(y).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        procs.stop().get(30)
