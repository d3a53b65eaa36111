"""The simulated mode as notebooks use it: ``env=`` reaching simulated procs, and ``await``
from the program's own event loop (asyncio or trio) under ``REGENCY_RUNTIME=sim``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from regency.actor import Actor, endpoint
from regency.sim import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class EnvReader(Actor):
    @endpoint
    def read(self, key: str) -> str | None:
        return os.environ.get(key)

    @endpoint
    async def read_async(self, key: str) -> str | None:
        return os.getenv(key)

    @endpoint
    def write(self, key: str, value: str) -> None:
        os.environ[key] = value


def test_env_reaches_simulated_procs_and_stays_theirs() -> None:
    key, own = "REGENCY_TEST_MASTER_ADDR", "REGENCY_TEST_OWN"

    def program(hosts: Any) -> dict[str, Any]:
        with_env = hosts.spawn_procs(per_host={"gpus": 2}, env={key: "sim-master"})
        plain = hosts.spawn_procs(per_host={"gpus": 1})
        a = with_env.spawn("a", EnvReader)
        b = plain.spawn("b", EnvReader)
        a.slice(gpus=0).write.call_one(own, "rank 0's").get()
        return {
            "sync": sorted(a.read.call(key).get().values()),
            "async": sorted(a.read_async.call(key).get().values()),
            "plain": b.read.call(key).get().values(),
            "own": a.read.call(own).get().values(),
            "controller": (os.environ.get(key), os.environ.get(own)),
        }

    result = simulate(program, seed=3, hosts=1).value
    assert result == {
        "sync": ["sim-master", "sim-master"],
        "async": ["sim-master", "sim-master"],
        "plain": [None],
        "own": ["rank 0's", None],  # a proc's writes are its own, as with real procs
        "controller": (None, None),
    }
    assert key not in os.environ and own not in os.environ
    assert type(os.environ) is os._Environ  # the process's own again once the run ended


SCRIPT = """
import asyncio, os, sys
import trio
import regency, regency.sim
from regency.actor import Actor, endpoint, proc_mesh, current_rank

class Napper(Actor):
    @endpoint
    async def nap(self, seconds):
        await trio.sleep(seconds)
        return (current_rank().rank, os.environ.get("WHO"))

async def main():
    pm = await proc_mesh(gpus=2, env={"WHO": "sim"})
    nappers = await pm.spawn("nappers", Napper)
    got = await nappers.nap.call(30.0)
    return sorted(got.values()), round(regency.sim.current().now())

regency.configure(runtime="sim", seed=11)
print("asyncio", *asyncio.run(main()))
print("trio", *trio.run(main))
"""


@pytest.mark.slow
def test_await_in_the_simulated_mode_from_asyncio_and_trio() -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    runs = [
        subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCRIPT)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        for _ in range(2)
    ]
    assert runs[0].returncode == 0, runs[0].stderr
    lines = runs[0].stdout.splitlines()
    assert lines[0] == "asyncio [(0, 'sim'), (1, 'sim')] 30", lines
    assert lines[1] == "trio [(0, 'sim'), (1, 'sim')] 60", lines
    assert runs[1].stdout == runs[0].stdout  # the same seed, the same virtual times
