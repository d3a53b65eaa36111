"""Bulk values between real processes: NumPy arrays and CPU tensors travel out of band and
arrive in memory they own, never aliasing a transport's reused receive buffer (before, an
array an actor kept changed when later frames arrived)."""

from __future__ import annotations

import pytest

from tests.conftest import SpawnProcs

from .bulk_actors import Keeper

numpy = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

T = 30


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bulk_values_kept_or_returned_stay_as_sent(spawn_procs: SpawnProcs, kind: str) -> None:
    make = (
        (lambda n, v: numpy.full(n, v)) if kind == "numpy" else (lambda n, v: torch.full((n,), v))
    )
    keeper = spawn_procs({"gpus": 1}).spawn("keeper", Keeper)
    sizes = (1_000, 100_000, 300_000)  # in the receive buffer; a big frame of its own; both
    for n in sizes:
        for i in range(3):
            keeper.keep.call_one(make(n, float(i))).get(T)
    expected = [float(n * i) for n in sizes for i in range(3)]
    assert keeper.sums.call_one().get(T) == expected  # kept values did not change later
    back = [keeper.echo.call_one(make(n, float(i))).get(T) for n in sizes for i in range(3)]
    assert [float(v.sum()) for v in back] == expected  # nor did values returned to us
