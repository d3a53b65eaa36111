"""Monarch's ``grpo_yield.py`` example (examples/monarch/, unchanged but for its imports)
runs on Regency, every time: four generators flood one scorer's channel
from ``asyncio.create_task`` loops that yield only with ``await asyncio.sleep(0)``, the
scorer and the reference model loop on ``await recv.recv()``, the trainer pushes weights
with ``send(..., selection="choose")`` and drains the pool. It used to hang: the scorer's
proc, decoding the flood, served no heartbeat and no acknowledgement, and the generators
gave it up. Here the example's own ``main`` runs with fewer steps (real procs); the whole
script is run ten times for docs/supervision.md."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from ..conftest import SpawnProcs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "monarch")
T = 90


@pytest.fixture
def grpo(monkeypatch: pytest.MonkeyPatch, spawn_procs: SpawnProcs) -> Iterator[ModuleType]:
    # By name, so the procs import it too (they get this process's sys.path).
    monkeypatch.syspath_prepend(EXAMPLES)
    module = importlib.import_module("grpo_yield")
    monkeypatch.setattr(module, "MAX_STEPS", 4)

    class _Host:  # this_host(), whose proc meshes the fixture stops (the example stops one)
        def spawn_procs(self, per_host: dict[str, int]) -> Any:
            return spawn_procs(per_host)

    monkeypatch.setattr(module, "this_host", _Host)
    try:
        yield module
    finally:
        sys.modules.pop("grpo_yield", None)


def test_the_example_is_monarchs_with_only_its_imports_changed() -> None:
    with open(os.path.join(EXAMPLES, "grpo_yield.py")) as f:
        source = f.read()
    assert "monarch" not in "\n".join(
        line for line in source.splitlines() if line.startswith(("import", "from"))
    )
    assert "from regency.actor import Actor, Channel, endpoint, Port, send, this_host" in source
    assert 'send(\n                gen_mesh.update_weights,' in source
    assert "asyncio.create_task(self._rollout_loop())" in source


@pytest.mark.slow
def test_grpo_yield_runs_to_the_end(
    grpo: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(asyncio.wait_for(grpo.main(), T))
    # (The trainer's lines are its proc's, forwarded.)
    assert "[controller] training complete at step 4" in capsys.readouterr().out
