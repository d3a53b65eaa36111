"""The environment record: the one place production and the simulator differ."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

import regency
from regency.core._config import Config
from regency.core._environment import PRODUCTION, Environment, production
from regency.core._executor import ThreadExecutor
from regency.core._probe import Probe
from regency.core._runtime import Runtime
from regency.core._ticker import TrioTicker
from regency.rdma._state import state_of

ROOT = Path(regency.__file__).parent


def _runtime(env: Environment | None = None) -> Runtime:
    return Runtime(
        "c1", secret=b"s" * 32, jobdir="/nowhere", config=Config(), address="inproc://c1",
        env=env,
    )


def test_a_runtime_takes_everything_world_specific_from_its_environment() -> None:
    made: list[Runtime] = []

    class Executor(ThreadExecutor):
        def __init__(self, rt: Runtime) -> None:
            super().__init__(rt)
            made.append(rt)

    ticker = TrioTicker()
    probe = Probe()
    env = Environment(executor=Executor, ticker=ticker, probe=probe, ack_every=5, ack_delay=0.5)
    rt = _runtime(env)
    assert rt.env is env and rt.ticker is ticker and rt.probe is probe
    assert isinstance(rt.executor, Executor) and made == [rt]  # one executor per runtime
    assert (rt.ack_every, rt.ack_delay) == (5, 0.5)
    assert _runtime().env is PRODUCTION is production()
    assert PRODUCTION.executor is ThreadExecutor and PRODUCTION.probe is None
    assert isinstance(PRODUCTION.ticker, TrioTicker)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        env.probe = None  # type: ignore[misc]
    # Nothing pokes a hook into a running runtime: the world is the environment's.
    for hook in ("probe", "ticker", "ack_every", "ack_delay"):
        with pytest.raises(AttributeError):
            setattr(rt, hook, None)


def test_rdma_reads_the_environment_not_the_address() -> None:
    virtual = [100.0]
    env = Environment(simulated_host="host3", clock=lambda: virtual[0])
    state = state_of(_runtime(env))
    assert state.simulated and state.host == "sim:host3" and state.pid == 0
    # Leases expire on the environment's clock (virtual time in a simulation).
    assert state.registry._clock() == 100.0
    virtual[0] = 250.0
    assert state.registry._clock() == 250.0
    real = state_of(_runtime())
    assert not real.simulated and real.pid > 0


def _sources(package: str) -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted((ROOT / package).glob("*.py"))]


def test_the_core_never_asks_whether_it_is_simulated() -> None:
    for path, text in _sources("core"):
        assert not re.search(r"runtime\s*==\s*[\"']sim[\"']", text), path
        assert "sim://" not in text, path
        assert "from ..sim" not in text and "import regency.sim" not in text, path


def test_rdma_does_not_sniff_simulated_addresses_or_read_the_wall_clock() -> None:
    for path, text in _sources("rdma"):
        assert "sim://" not in text and 'scheme == "sim"' not in text, path
        if path.name == "_registry.py":
            # Only the production registry (one real process) is on the wall clock.
            assert text.count("time.monotonic") == 1, path
            assert "registry = Registry(time.monotonic)" in text
        else:
            assert "time.monotonic" not in text, path
