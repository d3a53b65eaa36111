"""regency.Tensor handles passed to actor endpoints, and ``endpoint.rref(...)``, on real procs
(and once on the simulated cluster): each rank's actor gets its own proc's tensor, after the
ops issued before the call; rref's results are tensors later ops use."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import regency  # noqa: E402
from regency._tensor_engine._actors import pending_handoffs  # noqa: E402
from regency.actor import Actor, ActorError, current_rank, endpoint, this_host  # noqa: E402
from regency.core import current_runtime  # noqa: E402
from regency.mesh_controller import RemoteException  # noqa: E402
from regency.sim import simulate  # noqa: E402

from ..conftest import SpawnProcs, root_failures  # noqa: E402


class Keeper(Actor):
    """Takes tensors (sync and async endpoints) and says what it got."""

    def __init__(self) -> None:
        self.kept: list[list[float]] = []

    @endpoint
    def take(self, t: Any, label: str = "") -> tuple[int, str, list[float], bool]:
        return current_rank().rank, label, t.tolist(), type(t) is torch.Tensor

    @endpoint
    async def take_async(self, pair: dict[str, Any]) -> tuple[int, list[float], list[float]]:
        return current_rank().rank, pair["a"].tolist(), pair["b"].tolist()

    @endpoint
    def keep(self, t: Any) -> None:
        self.kept.append(t.clone().tolist())

    @endpoint
    def kept_values(self) -> list[list[float]]:
        return self.kept

    @endpoint
    def handoffs(self) -> int:
        return pending_handoffs(current_runtime())

    @endpoint
    def fail_on(self, rank: int) -> None:
        if current_rank().rank == rank:
            raise ValueError(f"keeper {rank} fails")


class Linear(Actor):
    """``forward`` scales by (rank + 1), so every rank's result tells where it ran."""

    def __init__(self) -> None:
        self.w = torch.eye(3) * (current_rank().rank + 1)
        self.calls = 0

    @endpoint(propagate=lambda x: x)
    def forward(self, x: Any) -> Any:
        self.calls += 1
        return x @ self.w

    @endpoint(propagate=lambda x: (x, x.sum()))
    async def forward_async(self, x: Any) -> Any:
        y = x @ self.w
        return y, y.sum()

    @endpoint(propagate=lambda x: x)
    def broken(self, x: Any) -> Any:
        raise ValueError(f"no forward on rank {current_rank().rank}")

    @endpoint
    def unshaped(self, x: Any) -> Any:
        return x

    @endpoint(propagate=lambda x: (x, x))
    def one_of_two(self, x: Any) -> Any:
        return x * 2

    @endpoint
    def count(self) -> int:
        return self.calls


@pytest.fixture(scope="module")
def procs() -> Any:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(30)


def _rows(t: Any) -> list[list[float]]:
    return [regency.inspect(t, gpus=g).tolist() for g in range(2)]


@pytest.mark.slow
def test_each_rank_takes_its_own_tensor_after_the_ops_before(procs: Any) -> None:
    keepers = procs.spawn("keepers", Keeper)
    with procs.activate():
        rank = procs.rank_tensor("gpus")
        t = torch.zeros(3)
        for i in range(20):  # queued ops, all before the call on the stream
            t.add_(rank + i)
        u = torch.ones(2) * (rank + 7)
    expected = [[float(sum(r + i for i in range(20)))] * 3 for r in range(2)]
    got = keepers.take.call(t, label="x").get()
    assert [v for _, v in got.items()] == [
        (r, "x", expected[r], True) for r in range(2)
    ]  # plain torch tensors
    got_async = keepers.take_async.call({"a": t[:1], "b": u}).get()  # nested, async endpoint
    assert [v for _, v in got_async.items()] == [
        (r, expected[r][:1], [r + 7.0, r + 7.0]) for r in range(2)
    ]
    keepers.keep.broadcast(t)
    # The actors hold the worker's tensor itself (no copy, as in Monarch): a later write on
    # the stream waits until they are done with it.
    assert [v for _, v in keepers.kept_values.call().get().items()] == [[e] for e in expected]
    with procs.activate():
        t.mul_(0)
        t.add_(5)
    keepers.keep.broadcast(t)
    assert [v for _, v in keepers.kept_values.call().get().items()] == [
        [expected[r], [5.0] * 3] for r in range(2)
    ]
    # One rank, a random one, a stream: only the ranks called take part, nothing is left over.
    one = keepers.slice(gpus=1)
    assert one.take.call_one(u, "one").get() == (1, "one", [8.0, 8.0], True)
    assert keepers.take.choose(u).get()[2] in ([7.0, 7.0], [8.0, 8.0])
    streamed = sorted(f.get()[2] for f in keepers.take.stream(u))
    assert streamed == [[7.0, 7.0], [8.0, 8.0]]
    assert [v for _, v in keepers.handoffs.call().get().items()] == [0, 0]


@pytest.mark.slow
def test_rref_results_feed_later_ops_on_every_rank(procs: Any) -> None:
    linear = procs.spawn("linear", Linear)
    with procs.activate():
        t = torch.ones(2, 3) * (procs.rank_tensor("gpus") + 1)
    o = torch.relu(linear.forward.rref(t))  # outside activate(): t's mesh
    assert isinstance(o, regency.Tensor) and o.shape == (2, 3)
    y, total = linear.forward_async.rref(o)
    with procs.activate():
        z = y + 1
        s = total * 2
    for r in range(2):
        scale = (r + 1) * (r + 1)  # t is (r + 1), times w (r + 1), twice
        assert regency.inspect(o, gpus=r).tolist() == [[float(r + 1) ** 2] * 3] * 2
        assert regency.inspect(z, gpus=r).tolist() == [[float(scale * (r + 1)) + 1] * 3] * 2
        assert regency.inspect(s, gpus=r).item() == 2 * 6 * scale * (r + 1)
    assert [v for _, v in linear.count.call().get().items()] == [1, 1]


@pytest.mark.slow
def test_failures_and_bad_calls_say_what_is_wrong(procs: Any) -> None:
    linear = procs.spawn("linear2", Linear)
    keepers = procs.spawn("keepers2", Keeper)
    with procs.activate():
        t = torch.ones(3)
        bad = torch.empty(1 << 62, dtype=torch.uint8)  # fails on every proc
    # The endpoint raises: its results fail, the actor goes on.
    o = linear.broken.rref(t) + 1
    with pytest.raises(RemoteException, match="no forward on rank 1") as info:
        regency.inspect(o, gpus=1)
    assert info.value.exception_type == "ValueError"
    assert [v for _, v in linear.count.call().get().items()] == [0, 0]
    # A failed tensor: the caller gets its failure; rref's results inherit it.
    with pytest.raises(ActorError, match=r"A regency\.Tensor passed to this endpoint had failed"):
        keepers.take.call(bad).get()
    with pytest.raises(RemoteException, match="RuntimeError"):
        regency.inspect(linear.forward.rref(bad))
    with pytest.raises(
        RemoteException, match=r"endpoint 'linear2\.one_of_two' returned 1 tensors here but 2"
    ):
        regency.inspect(linear.one_of_two.rref(t)[1], gpus=0)
    with pytest.raises(NotImplementedError, match=r"unshaped\.rref\(\.\.\.\): rref needs"):
        linear.unshaped.rref(t)
    # Actors elsewhere than the tensor's procs.
    other = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        strangers = other.spawn("strangers", Linear)
        with pytest.raises(ValueError, match=r"must be on the procs of the regency\.Tensor"):
            strangers.forward.rref(t)
        with pytest.raises(ValueError, match=r"must be on the procs of the regency\.Tensor"):
            other.spawn("keepers3", Keeper).take.call(t)
        with other.activate():
            elsewhere = torch.ones(3)
        with pytest.raises(TypeError, match="WRONG_MESH"):
            keepers.take_async.call({"a": t, "b": elsewhere})
    finally:
        other.stop().get(30)
    with pytest.raises(ValueError, match=r"on 1 of them; call it on actors spawned on"):
        linear.slice(gpus=0).forward.rref(t)
    # Still in step after all that.
    assert [v[2] for _, v in keepers.take.call(t).get().items()] == [[1.0] * 3] * 2
    assert [v for _, v in keepers.handoffs.call().get().items()] == [0, 0]


def test_on_the_simulated_cluster() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpus": 2})
        linear = mesh.spawn("linear", Linear)
        keepers = mesh.spawn("keepers", Keeper)
        with mesh.activate():
            t = torch.ones(3) * (mesh.rank_tensor("hosts") * 2 + mesh.rank_tensor("gpus"))
        taken = [v[2] for _, v in keepers.take.call(t).get().items()]
        with mesh.activate():
            o = linear.forward.rref(t) + 1
        return taken, [regency.inspect(o, hosts=h, gpus=g).tolist() for h in (0, 1) for g in (0, 1)]

    taken, outs = simulate(program, seed=3, hosts=2).value
    assert taken == [[float(r)] * 3 for r in range(4)]
    assert outs == [[float(r * (r + 1) + 1)] * 3 for r in range(4)]


@pytest.mark.slow
def test_actors_that_are_gone_fail_rref_and_keep_no_tensors(procs: Any) -> None:
    """Calls that reach actors already stopped are bounced: rref's results fail (the stream
    goes on, it does not wait for an outcome that never comes) and a plain call's tensors
    are not kept for an actor that will never take them."""
    witness = procs.spawn("witness", Keeper)  # on the same procs: reads their handoffs
    linear = procs.spawn("gone_linear", Linear)
    keepers = procs.spawn("gone_keepers", Keeper)
    with procs.activate():
        t = torch.ones(3)
    linear.stop().get(30)
    keepers.stop().get(30)
    o = linear.forward.rref(t)
    with pytest.raises(
        RemoteException,
        match=r"the call never ran: Supervision event: actor .* has status: stopped "
        r"\(actor gone_linear rank 1 was stopped\)",
    ) as info:
        regency.fetch_shard(o, gpus=1).get(30)  # (the stream did not hang on it)
    assert info.value.exception_type == "SupervisionError"
    keepers.keep.broadcast(t)
    with pytest.raises(Exception, match="stopped"):
        keepers.take.call(t).get(30)
    with procs.activate():
        after = t + 1  # later ops still run, after the bounced calls' own ops
    assert regency.fetch_shard(after, gpus=0).get(30).tolist() == [2.0] * 3
    assert [v for _, v in witness.handoffs.call().get(30).items()] == [0, 0]


def test_a_call_refused_for_a_failed_rank_lends_nothing(spawn_procs: SpawnProcs) -> None:
    """A call that fails before it is sent (a rank of the actors is known to have failed)
    issues no op: the healthy ranks' workers keep nothing for a call that never comes."""
    procs = spawn_procs({"gpus": 2})
    witness = procs.spawn("witness", Keeper)
    keepers = procs.spawn("half_failed", Keeper)
    with procs.activate():  # (the tensor workers start before the proc refuses actors)
        t = torch.ones(3)
    keepers.fail_on.broadcast(1)
    root_failures.wait_for("half_failed", 60)
    with pytest.raises(Exception, match='failure on mesh "half_failed" at rank 1'):
        keepers.take.call(t).get(30)
    with pytest.raises(Exception, match='failure on mesh "half_failed" at rank 1'):
        keepers.keep.broadcast(t)
    with procs.activate():
        after = t * 3
    assert regency.fetch_shard(after, gpus=0).get(30).tolist() == [3.0] * 3
    assert witness.slice(gpus=0).handoffs.call_one().get(30) == 0
