"""get_or_spawn_controller and @concurrent_endpoint, through real procs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from regency.actor import (
    ActorError,
    ProcMesh,
    SupervisionError,
    concurrent_endpoint,
    get_or_spawn_controller,
    this_host,
)

from .singleton_actors import Client, Gate, Tally

T = 30


@pytest.fixture(scope="module")
def procs() -> ProcMesh:
    return this_host().spawn_procs(per_host={"gpus": 2})


@pytest.mark.slow
def test_one_controller_per_name_in_the_controller_process(procs: ProcMesh) -> None:
    first = get_or_spawn_controller("tally", Tally, 100).get(T)
    again = get_or_spawn_controller("tally", Tally, 5).get(T)
    assert first._key == again._key
    assert first.pid.call_one().get(T) == os.getpid()  # it lives in the client process
    # Procs find the same one, from sync and async endpoints.
    clients = procs.spawn("clients", Client)
    keys_totals = clients.add_from_proc.call(1).get(T).values()
    assert {key for key, _ in keys_totals} == {first._key}
    key, _ = clients.add_from_async.call(10).get(T).values()[0]
    assert key == first._key
    # 100 + 1 + 1 + 10 + 10, whatever the order.
    assert first.add.call_one(0).get(T) == 122
    other = get_or_spawn_controller("other", Tally).get(T)
    assert other._key != first._key and other.add.call_one(1).get(T) == 1


FAILED_CONTROLLER = """
import regency.actor
from regency.actor import ActorError, SupervisionError, get_or_spawn_controller
from tests.core.singleton_actors import Broken

reached_root = []
regency.actor.unhandled_fault_hook = reached_root.append
broken = get_or_spawn_controller("broken", Broken).get(30)
try:
    broken.hello.call_one().get(30)
except SupervisionError as exc:
    print("CALL", "this controller cannot start" in str(exc))
# The registry owns it: the failure goes to the registry's __supervise__, which keeps it
# (it does not reach the root) and answers later lookups with it. The supervision report may
# trail the call's error by a moment; each lookup is one round trip.
for _ in range(500):
    try:
        get_or_spawn_controller("broken", Broken).get(30)
    except ActorError as exc:
        print("LOOKUP", "controller 'broken' has failed" in str(exc),
              "this controller cannot start" in str(exc))
        break
print("ROOT", len(reached_root))
# The controller's process is not poisoned: other singletons and its own actors still spawn.
from regency.actor import this_proc
from tests.core.singleton_actors import Tally
print("AFTER", get_or_spawn_controller("other", Tally).get(30).add.call_one(1).get(30),
      this_proc().spawn("local", Tally).add.call_one(2).get(30))
"""


@pytest.mark.slow
def test_a_failed_controller_is_reported_to_later_callers() -> None:
    # In a controller of its own: its singletons and root failures stay out of later tests.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", FAILED_CONTROLLER],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["CALL True", "LOOKUP True True", "ROOT 0", "AFTER 1 2"]


def test_get_or_spawn_controller_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        get_or_spawn_controller("", Tally)
    with pytest.raises(TypeError, match="needs an Actor subclass"):
        get_or_spawn_controller("x", int)  # type: ignore[type-var]


@pytest.mark.slow
def test_concurrent_calls_do_not_wait_for_each_other(procs: ProcMesh) -> None:
    gate = procs.spawn("gate", Gate)
    waits = [gate.wait.call(str(i)) for i in range(3)]
    # A plain mailbox would hold `open` behind the first `wait` forever.
    gate.open.call().get(T)
    for i, fut in enumerate(waits):
        assert set(fut.get(T).values()) == {f"passed {i}"}
    # An error goes to the caller; the actor goes on.
    with pytest.raises(ActorError, match="no such thing"):
        gate.fail.call().get(T)
    assert set(gate.wait.call("after").get(T).values()) == {"passed after"}


@pytest.mark.slow
def test_stopping_an_actor_cancels_its_concurrent_calls(procs: ProcMesh) -> None:
    gate = procs.spawn("closing", Gate)
    waiting = gate.wait.call("never")
    gate.stop().get(T)
    with pytest.raises(SupervisionError, match="was stopped"):
        waiting.get(T)


def test_concurrent_endpoint_needs_an_async_function() -> None:
    with pytest.raises(ValueError, match=r"can only wrap async endpoints: make .*sync an `async def`"):

        @concurrent_endpoint
        def sync(self: object) -> None: ...
