"""Every proc starts with the random state a fresh interpreter would have.

Procs forked from the zygote share its memory, and with it every generator seeded before the
fork (torch imports in the zygote when the controller uses it); each must draw its own
numbers, as Monarch's procs (fresh processes) do. The simulator's procs share one process:
the tensor engine seeds its workers from the simulation (tests/tensor_engine).
"""

from __future__ import annotations

from typing import Any

import pytest

from regency.actor import ProcMesh, default_bootstrap_cmd

from ..conftest import SpawnProcs
from .random_actors import RandomDraws

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

T = 60  # fresh interpreters import torch, four at a time


def _draws(procs: ProcMesh, name: str) -> list[dict[str, Any]]:
    mesh = procs.spawn(name, RandomDraws)
    draws: list[dict[str, Any]] = mesh.draws.call().get(T).values()
    return draws


def _distinct(values: list[Any]) -> bool:
    return len({repr(v) for v in values}) == len(values)


@pytest.mark.slow
@pytest.mark.parametrize("start", ["zygote", "fresh"])
def test_each_proc_has_its_own_random_state(spawn_procs: SpawnProcs, start: str) -> None:
    options: dict[str, Any] = {}
    if start == "fresh":  # a bootstrap command: LocalLauncher, a fresh interpreter per proc
        options["bootstrap_command"] = default_bootstrap_cmd()
    draws = _draws(spawn_procs(per_host={"gpus": 4}, **options), f"random_{start}")
    assert _distinct([d["pid"] for d in draws])
    for key in ("torch_seed", "torch_rand", "numpy", "random"):
        assert _distinct([d[key] for d in draws]), (key, [d[key] for d in draws])
    assert not any(d["cuda_initialized"] for d in draws)


def test_reseeding_draws_afresh_what_the_zygote_seeded() -> None:
    # What a fork copied: generators seeded alike (here, all seeded with 0 as if by the
    # zygote); _fresh_random_state (the child's first call) must move each away from it.
    import random

    import numpy.random

    from regency.core._zygote import _fresh_random_state

    def seed_alike() -> None:
        random.seed(0)
        numpy.random.seed(0)
        torch.manual_seed(0)

    def draw() -> tuple[Any, ...]:
        return random.random(), numpy.random.random(), torch.rand(2).tolist()

    seed_alike()
    copied = draw()
    seed_alike()
    _fresh_random_state()
    fresh = draw()
    for i, (before, after) in enumerate(zip(copied, fresh, strict=True)):
        assert before != after, ("random", "numpy", "torch")[i]
    assert torch.initial_seed() != 0


def test_reseeding_imports_nothing() -> None:
    # Never import torch or numpy just to seed them: a proc that does not use them would pay
    # seconds of import for nothing.
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from regency.core._zygote import _fresh_random_state\n"
        "before = set(sys.modules)\n"
        "_fresh_random_state()\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('torch', 'numpy')))\n"
    )
    env = {**os.environ, "REGENCY_ZYGOTE": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
