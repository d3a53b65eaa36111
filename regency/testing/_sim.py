"""Testing your own actors on the simulated cluster: a pytest fixture and Hypothesis helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..sim import SimResult, check_simulation, fault_schedules, simulate

__all__ = ["Simulated", "fault_schedules", "simulated_fixture"]


class Simulated:
    """What the ``simulated`` fixture gives a test: run a program on a fresh simulated
    cluster, or check that it replays exactly."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def run(self, program: Callable[[Any], Any], *, hosts: int = 4, **kw: Any) -> SimResult:
        """``regency.sim.simulate`` on the fixture's seed; ``faults=``, ``buggify=``,
        ``timeout=``, ``skip_idle=`` and ``log=`` pass through. Raises ``InvariantViolation``
        if the run broke one; the result's ``replay()`` reruns it."""
        return simulate(program, seed=self.seed, hosts=hosts, **kw)

    def check_determinism(
        self, program: Callable[[Any], Any], *, hosts: int = 4, **kw: Any
    ) -> SimResult:
        """Run twice on the fixture's seed (``faults=``, ``buggify=`` as for ``run``)."""
        return check_simulation(program, seed=self.seed, hosts=hosts, **kw)


def simulated_fixture() -> Any:
    """Register with ``simulated = regency.testing.simulated_fixture()`` in a conftest; the
    seed comes from ``--regency-seed`` if you add that option, else 0."""
    import pytest

    @pytest.fixture
    def simulated(request: Any) -> Simulated:
        seed = getattr(request.config.option, "regency_seed", None) or 0
        return Simulated(int(seed))

    return simulated


