"""Introspection in the simulator: the same stacks, timeouts and stall warnings, in virtual
time, and a stall's warning replays from the seed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

import regency
from regency.introspection import CallTimeoutError
from regency.sim import simulate

from .actors import Forever


def _program(hosts: Any) -> dict[str, Any]:
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("forever", Forever)
    assert mesh.ok.call().get(10).values() == [1] * 4
    fut = mesh.wait.call()
    try:
        fut.get(timeout=30.0)
    except CallTimeoutError as exc:
        error = exc
    stacks = regency.stacks(procs)
    return {"error": str(error), "ranks": error.ranks, "stacks": str(stacks),
            "calls": [len(p.calls) for p in stacks.procs]}


def test_stacks_and_timeouts_in_virtual_time(configured: Callable[..., None]) -> None:
    configured(stall_warning_s=0)
    result = simulate(_program, seed=3, hosts=2)
    value = result.value
    assert value["ranks"] == (0, 1, 2, 3)
    assert "forever.wait did not finish within 30.0 s: 4 of 4 rank(s)" in value["error"]
    assert "in endpoint wait for 30.0 s" in value["error"]
    assert "await trio.sleep_forever()" in value["error"]
    assert value["calls"] == [1, 1, 1, 1]
    assert "Forever 'forever' ranks 0-3: same stack: in endpoint wait (async)" in value["stacks"]


def test_a_simulated_stall_is_warned_in_virtual_time_and_replays(
    configured: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    configured(stall_warning_s=5)
    caplog.set_level(logging.WARNING, logger="regency.stall")

    def run() -> list[str]:
        caplog.clear()
        simulate(_program, seed=5, hosts=2)
        return [r.getMessage() for r in caplog.records if r.name == "regency.stall"]

    first = run()
    # 5 s, 10 s and 20 s of virtual time within the 30 s timeout, for each of 4 ranks.
    assert sum("has run for" in m for m in first) == 12, first
    assert any("Forever 'forever' rank 0" in m and "sleep_forever" in m for m in first)
    assert run() == first
