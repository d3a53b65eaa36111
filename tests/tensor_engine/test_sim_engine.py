"""The tensor engine on the simulated cluster: every API, fast (workers are ordinary actors;
collectives go over the simulated network)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import regency  # noqa: E402
from regency._tensor_engine._worker import live_refs  # noqa: E402
from regency.mesh_controller import RemoteException  # noqa: E402
from regency.sim import simulate  # noqa: E402

from ..sim.actors import Counter  # noqa: E402


def run(program: Callable[[Any], Any], hosts: int = 2, seed: int = 1) -> Any:
    return simulate(program, seed=seed, hosts=hosts).value


def test_factories_and_ops_run_on_every_proc_and_fetch_by_coordinate() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            t = torch.ones(3, 4)
            u = t * 2 + mesh.rank_tensor("gpu") + 10 * mesh.rank_tensor("hosts")
            parts = u.split(2)
        assert isinstance(u, regency.Tensor) and u.shape == (3, 4) and u.dtype == torch.float32
        assert u.mesh is mesh and u.stream.name == "main"
        v = u.sum()  # outside activate(): still remote, the mesh is u's
        assert isinstance(v, regency.Tensor)
        return (
            regency.inspect(v).item(),
            regency.inspect(v, hosts=1, gpu=1).item(),
            regency.fetch_shard({"x": parts[1], "n": 5}, {"gpu": 1}).get()["x"].tolist(),
            regency.inspect("not a tensor"),
        )

    first, last, part, passthrough = run(program)
    assert first == 24.0
    assert last == 12 * (2 + 1 + 10)
    assert part == [[3.0] * 4]
    assert passthrough == "not a tensor"


def test_active_mesh_and_no_mesh() -> None:
    with pytest.raises(ValueError, match="no device mesh is active"):
        regency.get_active_mesh()

    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 1})
        with mesh.activate():
            assert regency.get_active_mesh() is mesh
            with regency.no_mesh.activate():
                local = torch.ones(2)
                assert type(local) is torch.Tensor
                with pytest.raises(ValueError, match="no device mesh is active"):
                    regency.get_active_mesh()
            remote = torch.ones(2)
        assert isinstance(remote, regency.Tensor)
        return local.tolist()

    assert run(program, hosts=1) == [1.0, 1.0]


def test_a_remote_failure_surfaces_at_fetch_and_poisons_only_its_dependents() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        bad = regency.remote(
            "regency._tensor_engine._worker.rank_value",  # KeyError: no entry for the rank
            propagate=lambda table: torch.empty(()),
        )
        with mesh.activate():
            good = torch.full((2,), 3.0)
            failed = bad({})
            dependent = failed + good
            twice_dependent = dependent * 2
            independent = good + 1
        with pytest.raises(RemoteException) as caught:
            regency.inspect(twice_dependent, gpu=1)
        assert regency.inspect(independent).tolist() == [4.0, 4.0]  # workers go on
        with mesh.activate():
            after = good * 5
        return caught.value, regency.inspect(after).tolist()

    error, after = run(program)
    assert after == [15.0, 15.0]
    assert error.rank == 1  # the worker at the fetched coordinate: every rank failed
    text = str(error)
    assert text.startswith("A remote function has failed asynchronously on rank 1.")
    assert error.controller_frames[-1].line == "failed = bad({})"  # where it was issued
    assert "in program\n    failed = bad({})" in text
    assert "test_sim_engine.py" in text and "KeyError" in error.worker_error_string


def test_bad_arguments_raise_type_error_at_the_call() -> None:
    def program(hosts: Any) -> Any:
        procs = hosts.spawn_procs(per_host={"gpu": 2})
        other = hosts.spawn_procs(per_host={"gpu": 2})
        with procs.activate():
            t = torch.ones(4)
        with other.activate():
            o = torch.ones(4)
        errors = []
        for bad in (
            lambda: t + torch.ones(4),
            lambda: t + o,
            lambda: (t.drop(), t + 1),
        ):
            with pytest.raises(TypeError) as caught:
                bad()
            errors.append(str(caught.value))
        assert t.dropped
        return errors

    local, wrong_mesh, dropped = run(program, hosts=1)
    assert "LOCAL_TENSOR" in local and "local tensor of shape (4,)" in local
    assert "WRONG_MESH" in wrong_mesh
    assert "DROPPED" in dropped and "was dropped" in dropped


def test_refs_are_deleted_when_handles_are_collected() -> None:
    count = regency.remote(live_refs, propagate="inspect")

    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 1})
        with mesh.activate():
            keep = torch.ones(2)
            before = regency.call_on_shard_and_fetch(count).get()
            for _ in range(50):
                x = keep * 2
                del x
            gc.collect()
            regency.inspect(keep)  # a batch goes out with the deletes
            after = regency.call_on_shard_and_fetch(count).get()
        return before, after

    before, after = run(program, hosts=1)
    assert after <= before + 1, (before, after)


@pytest.mark.parametrize(
    "reduction, expect",
    [
        ("sum", lambda vals: sum(vals)),
        ("avg", lambda vals: sum(vals) / len(vals)),
        ("product", lambda vals: vals[0] * vals[1] * vals[2] * vals[3]),
        ("min", lambda vals: min(vals)),
        ("max", lambda vals: max(vals)),
    ],
)
def test_reductions_over_all_dims(reduction: str, expect: Callable[[list[float]], float]) -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            r = mesh.rank_tensor(("hosts", "gpu")).float() + 1
            out = r.reduce(("hosts", "gpu"), reduction)
        return [regency.inspect(out, hosts=h, gpu=g).item() for h in (0, 1) for g in (0, 1)]

    assert run(program) == [expect([1.0, 2.0, 3.0, 4.0])] * 4


def test_bitwise_stack_scatter_and_in_place_reductions() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            rank = mesh.rank_tensor(("hosts", "gpu"))  # 0..3
            bits = (rank + 1) * 3  # 3, 6, 9, 12
            band, bor, bxor = (bits.reduce("gpu", op) for op in ("band", "bor", "bxor"))
            rows = torch.arange(4.0).reshape(4, 1) + 10 * rank
            stacked = rows.reduce("gpu", "stack")
            scattered = rows.reduce("gpu", "sum", scatter=True)
            alltoall = rows.reduce("gpu", "stack", scatter=True)
            inplace = rank.float()
            inplace.reduce_("hosts", "sum")
            tree = regency.reduce({"r": rank, "n": 7}, "gpu", "max")
            regency.reduce_([bits], ("hosts", "gpu"), "min")
        at = regency.inspect
        return {
            "bit": [at(x, hosts=1).item() for x in (band, bor, bxor)],
            "stack": at(stacked, hosts=1, gpu=1).tolist(),
            "scatter": at(scattered, hosts=0, gpu=1).tolist(),
            "alltoall": at(alltoall, hosts=0, gpu=1).flatten().tolist(),
            "inplace": at(inplace, hosts=0, gpu=1).item(),
            "tree": (at(tree["r"], hosts=1).item(), tree["n"]),
            "bits": at(bits, hosts=1, gpu=1).item(),
        }

    got = run(program)
    assert got["bit"] == [9 & 12, 9 | 12, 9 ^ 12]
    assert got["stack"] == [[[20.0], [21.0], [22.0], [23.0]], [[30.0], [31.0], [32.0], [33.0]]]
    assert got["scatter"] == [[2.0 + 12.0], [3.0 + 13.0]]  # the second half, summed over gpu
    assert got["alltoall"] == [2.0, 3.0, 12.0, 13.0]  # chunk 1 from gpu 0, then from gpu 1
    assert got["inplace"] == 1.0 + 3.0
    assert got["tree"] == (3, 7) and got["bits"] == 3  # pytrees; min of 3, 6, 9, 12


def test_reduce_into_out_writes_the_given_tensor() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            r = mesh.rank_tensor(("hosts", "gpu")).float() + 1  # 1..4
            out = torch.zeros(())
            got = r.reduce(("hosts", "gpu"), "sum", out=out)
            wrong_shape = torch.zeros(2)
            with pytest.raises(ValueError, match=r"out of shape \(\) and dtype torch.float32"):
                r.reduce("gpu", out=wrong_shape)
            with pytest.raises(ValueError, match="takes no out="):
                r.reduce("gpu", out=out, _inplace=True)
            with pytest.raises(TypeError, match=r"takes a regency\.Tensor"):
                r.reduce("gpu", out=3)
        return got is out, [regency.inspect(out, hosts=h, gpu=1).item() for h in (0, 1)]

    assert run(program) == (True, [10.0, 10.0])


def test_reduce_rejects_bad_arguments() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            t = torch.ones(3)
            messages = []
            for call in (
                lambda: t.reduce("nope"),
                lambda: t.reduce("gpu", "median"),
                lambda: t.reduce(("hosts", "gpu"), "stack"),
                lambda: t.reduce("gpu", scatter=True),
                lambda: t.reduce_("gpu", "stack"),
            ):
                with pytest.raises(ValueError) as caught:
                    call()
                messages.append(str(caught.value))
            with pytest.raises(TypeError, match="integer or bool"):
                t.reduce("gpu", "bxor")
        return messages

    nope, median, multi, scatter, inplace = run(program)
    assert nope == "reduce dims must be among ('hosts', 'gpu') (got 'nope')"
    assert median.startswith("reduction must be one of ('stack', 'sum'")
    assert "takes one dim" in multi
    assert "must divide it (got shape (3,))" in scatter
    assert "cannot change the tensor's size" in inplace


def test_to_mesh_moves_between_slices_and_pipelines() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2}).rename(hosts="pp")
        stages = [mesh.slice(pp=i) for i in range(2)]
        with stages[0].activate():
            x = torch.ones(2) * (1 + stages[0].rank_tensor("gpu"))
        y = x.to_mesh(stages[1])
        with stages[1].activate():
            z = y * 10
        on_comms = x.to_mesh(stages[1], stream=regency.Stream("comms"))
        assert on_comms.stream.name == "comms"
        with pytest.warns(UserWarning, match="broadcasting along"):
            w = x.slice_mesh(gpu=1).to_mesh(stages[1])
        with pytest.raises(ValueError, match="lacks"):
            x.to_mesh(stages[1].slice(gpu=0))
        assert z.mesh is stages[1]
        return (
            regency.inspect(z, gpu=1).tolist(),
            regency.inspect(w, gpu=0).tolist(),
            regency.to_mesh({"a": x}, stages[1])["a"].mesh is stages[1],
        )

    z, w, pytree_ok = run(program)
    assert z == [20.0, 20.0]
    assert w == [2.0, 2.0]
    assert pytree_ok


def test_remote_functions_and_their_adverbs() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        double = regency.remote("torch.mul")  # propagates by running torch.mul on fakes
        shaped = regency.remote(lambda t: t.repeat(2), propagate=lambda t: t.repeat(2))
        rank_of = regency.remote(
            "regency._tensor_engine._worker.current_worker_rank", propagate="inspect"
        )
        with mesh.activate():
            t = torch.ones(2) + mesh.rank_tensor("gpu")
            d = double(t, 3)
            r = shaped(t)
            assert rank_of() is None
            rank_of.broadcast()
            assert not t._engine.issuer._ops  # sent now, not with a later batch
            ranks = rank_of.call().get()
            chosen = rank_of.choose().get()
            streamed = sorted(f.get() for f in rank_of.stream())
            one = regency.call_on_shard_and_fetch(rank_of, shard={"hosts": 1, "gpu": 1}).get()
        with mesh.slice(hosts=0, gpu=1).activate():
            single = rank_of.call_one().get()
        return (
            regency.inspect(d, gpu=1).tolist(),
            regency.inspect(r).tolist(),
            list(ranks.values()),
            chosen,
            streamed,
            one,
            single,
        )

    d, r, ranks, chosen, streamed, one, single = run(program)
    assert d == [6.0, 6.0] and r == [1.0] * 4
    assert ranks == [0, 1, 2, 3] and chosen in ranks and streamed == ranks
    assert one == 3 and single == 1


def test_remote_rejects_bad_definitions() -> None:
    with pytest.raises(TypeError, match="remote takes a function"):
        regency.remote("no_dots")
    with pytest.raises(ValueError, match="propagate must be"):
        regency.remote(len, propagate="sometimes")


def test_streams_and_borrows() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 1})
        comms = regency.Stream("comms")
        assert regency.get_active_stream().name == "main"
        with mesh.activate():
            t = torch.ones(2)
            borrowed, borrow = comms.borrow(t, mutable=True)
            reasons = []
            with pytest.raises(TypeError) as caught:
                t + 1  # lent mutably: the origin cannot be used
            reasons.append(str(caught.value))
            with pytest.raises(TypeError) as caught:
                borrowed + 1  # on comms, used from main
            reasons.append(str(caught.value))
            with comms.activate():
                assert regency.get_active_stream() is comms
                borrowed.add_(1)
            borrow.drop()
            assert borrowed.dropped
            after = t * 1
            read, ro = comms.borrow(t)
            with ro:
                with comms.activate():
                    copy = read * 2  # reading an immutable borrow is fine
                    with pytest.raises(TypeError) as caught:
                        read.add_(1)
                    reasons.append(str(caught.value))
                with pytest.raises(TypeError) as caught:
                    t.add_(1)
                reasons.append(str(caught.value))
                plain = t + 0  # the origin can still be read
            t.add_(1)  # the borrow ended with the block
            _, forgotten = comms.borrow(t, mutable=True)
            with pytest.warns(RuntimeWarning, match="collected without borrow.drop"):
                del forgotten
                gc.collect()
            t.add_(0)  # usable again
        return (
            reasons,
            regency.inspect(after).tolist(),
            regency.inspect(t).tolist(),
            (regency.inspect(plain).tolist()),
            copy.stream.name,
        )

    reasons, after, t, plain, copy_stream = run(program, hosts=1)
    assert "BORROWED" in reasons[0]
    assert "WRONG_STREAM" in reasons[1] and "borrow the tensor onto stream 'main'" in reasons[1]
    assert "MUTATING_BORROW" in reasons[2] and "MUTATING_BORROW" in reasons[3]
    assert after == [2.0, 2.0]  # the comms stream's write is seen after the drop
    assert t == [3.0, 3.0] and plain == [2.0, 2.0] and copy_stream == "comms"


def test_autograd_over_handles_and_grad_generator() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 2)
            x = torch.ones(3, 4)
        assert isinstance(model.weight, regency.Tensor) and model.weight.requires_grad
        model(x).sum().backward()
        grad = model.weight.grad
        assert isinstance(grad, regency.Tensor)
        with mesh.activate():
            loss = (model(x) ** 2).sum()
            grads = list(regency.grad_generator(loss, [model.bias, model.weight]))
            with torch.no_grad():
                total = grads[0].reduce("gpu", "sum")
        weight = regency.inspect(model.weight)
        bias = regency.inspect(model.bias)
        local = torch.nn.Linear(4, 2)
        with torch.no_grad():
            local.weight.copy_(weight)
            local.bias.copy_(bias)
        (local(torch.ones(3, 4)) ** 2).sum().backward()
        return (
            regency.inspect(grad).tolist(),
            regency.inspect(grads[0]).tolist(),
            local.bias.grad.tolist(),
            regency.inspect(total).tolist(),
            (regency.inspect(grads[0], gpu=0) + regency.inspect(grads[0], gpu=1)).tolist(),
        )

    grad, bias_grad, local_bias_grad, total, expected_total = run(program)
    assert grad == [[3.0] * 4] * 2
    assert bias_grad == pytest.approx(local_bias_grad)  # gpu 0's model, recomputed here
    assert total == pytest.approx(expected_total)  # each proc has its own random weights


def test_values_handles_cannot_give_and_constants_they_can_take() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 1})
        other = hosts.spawn_procs(per_host={"gpu": 1})
        with mesh.activate():
            t = torch.tensor([1.0, 2.0])  # data from the controller becomes a constant there
            w = torch.ones(2, requires_grad=True)
            scaled = t * torch.tensor(3.0)  # a local scalar tensor rides along by value
            with pytest.raises(RuntimeError, match=r"needs the values of a regency\.Tensor"):
                t.sum().item()
            with pytest.raises(TypeError, match="cannot be pickled"):
                import pickle

                pickle.dumps(t)
            counters = mesh.spawn("counters", Counter)
            # An actor takes its own proc's tensor (tests/tensor_engine/test_actor_tensors.py),
            # never one of another mesh's procs.
            taken = counters.incr.call_one(t).get()
            strangers = other.spawn("strangers", Counter)
            with pytest.raises(ValueError, match=r"must be on the procs of the regency\.Tensor"):
                strangers.incr.call(t)
            with pytest.raises(TypeError, match="requires grad"):
                w.reduce("gpu")
            square = torch.ones(2, 3)
            with pytest.raises(NotImplementedError, match="changes the shape or strides"):
                square.t_()
            assert (square + torch.ones(3)).shape == (2, 3)  # still (2, 3) here and there
            assert regency.inspect(square.mm(torch.ones(3, 1))).shape == (2, 1)
        with pytest.raises(ValueError, match="different spawn_procs calls"):
            t.to_mesh(other)
        with pytest.raises(TypeError, match="shard must be a dict"):
            regency.fetch_shard(t, 0)
        with pytest.raises(ValueError, match=r"shard dims must be among \('hosts', 'gpu'\)"):
            regency.inspect(t, rank=0)
        with mesh.activate():
            first = torch.ones(2)
            torch.set_default_dtype(torch.float64)
            try:
                second = torch.ones(2)  # the same op and arguments: not a stale cache entry
            finally:
                torch.set_default_dtype(torch.float32)
        assert (first.dtype, second.dtype) == (torch.float32, torch.float64)
        assert regency.inspect(second).dtype == torch.float64
        return regency.inspect(scaled).tolist(), taken.tolist()

    assert run(program, hosts=1) == ([3.0, 6.0], [1.0, 2.0])


def test_a_tensor_program_replays_from_its_seed() -> None:
    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 2})
        with mesh.activate():
            x = torch.rand(4)
            y = x.reduce(("hosts", "gpu"), "sum")
        return regency.inspect(y, hosts=1, gpu=1).tolist()

    first = simulate(program, seed=5, hosts=2)
    second = simulate(program, seed=5, hosts=2)
    assert first.value == second.value and first.trace_hash == second.trace_hash


def test_a_crashed_proc_fails_collectives_instead_of_hanging(roots: Any) -> None:
    from regency.core import SupervisionError
    from regency.sim import current

    def program(hosts: Any) -> Any:
        mesh = hosts.spawn_procs(per_host={"gpu": 1})
        with mesh.activate():
            x = torch.ones(2)
        regency.inspect(x, hosts=1)
        current().crash_proc(mesh._procs[1][1])
        with mesh.activate():
            total = x.reduce("hosts")
            alone = x * 3
        with pytest.raises(RemoteException) as caught:
            regency.inspect(total, hosts=0)
        with pytest.raises(SupervisionError):
            regency.inspect(alone, hosts=1)
        return caught.value.worker_error_string, regency.inspect(alone, hosts=0).tolist()

    error, alone = run(program)
    assert "rank 1 sent nothing for 300.0 s in a collective" in error
    assert alone == [3.0, 3.0]  # the surviving worker goes on
    assert roots.wait_for("tensor_engine").ranks == (1,)
