"""The environment record: the one place production and the simulator differ."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest

import regency
from regency.actor import Actor, endpoint
from regency.core import _waiting, current_runtime
from regency.core._config import Config
from regency.core._environment import PRODUCTION, Environment, production
from regency.core._executor import ThreadExecutor
from regency.core._leader import Leader
from regency.core._probe import Probe
from regency.core._runtime import Runtime
from regency.core._ticker import TrioTicker
from regency.rdma._state import state_of
from regency.sim import current, simulate

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
    waiters: list[Runtime] = []

    def waiter(rt: Runtime) -> Any:
        waiters.append(rt)
        return _waiting.LOCK

    env = Environment(
        executor=Executor, waiter=waiter, ticker=ticker, probe=probe, ack_every=5,
        ack_delay=0.5,
    )
    rt = _runtime(env)
    assert rt.waiter is _waiting.LOCK and waiters == [rt] and rt.leader is None
    assert type(_runtime().waiter) is Leader  # production's: threads read their own replies
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
        # What an executor can do is its property (``runs_freely``), not its type.
        assert not re.search(r"(isinstance\(|type\()[^)]*Executor", text), path
        # Waiting goes through the environment's waiter, not hooks set on a module.
        assert not re.search(r"_future\.\w+\s*=", text), path
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


class _WhereAmI(Actor):
    @endpoint
    def world(self) -> tuple[str | None, bool, bool, float]:
        rt = current_runtime()
        return (
            rt.env.simulated_host,
            not rt.executor.runs_freely,
            rt.probe is not None,
            state_of(rt).registry._clock(),
        )


def test_simulated_runtimes_get_the_simulators_environment() -> None:
    def program(hosts: Any) -> tuple[Any, Any, float]:
        controller = current().controller
        assert controller is not None
        here = (controller.env.simulated_host, not controller.executor.runs_freely)
        procs = hosts.slice(hosts=1).spawn_procs()
        there = procs.spawn("where", _WhereAmI).world.call_one().get()
        return here, there, current().now()

    here, (host, runner, probe, leases_at), now = simulate(program, seed=3, hosts=2).value
    assert here == ("controller", True)
    assert (host, runner, probe) == ("host1", True, True)
    assert 0 < leases_at <= now  # the lease clock is the simulation's virtual clock
