"""A proc whose bootstrap callable (``spawn_procs(bootstrap=fn)``) raises tells its spawner
what it raised before it exits: ``initialized`` and the mesh's spawns fail with that
exception's type, message and traceback (an ActorError, as Monarch's, and a
SupervisionError), not with a bare exit status."""

from __future__ import annotations

from typing import Any

import pytest

from regency.actor import ActorError, SupervisionError
from regency.core._errors import BootstrapError, RemoteException
from regency.sim import simulate

from ..conftest import SpawnProcs
from .boot_failures import Echo, raise_in_async_boot, raise_in_boot

T = 60


def test_initialized_fails_with_what_the_bootstrap_raised(spawn_procs: SpawnProcs) -> None:
    pm = spawn_procs({"gpus": 1}, bootstrap=raise_in_boot)
    with pytest.raises(ActorError, match=r"stage 3\.4 bootstrap failure") as caught:
        pm.initialized.get(T)
    error = caught.value
    assert isinstance(error, SupervisionError) and isinstance(error, BootstrapError)
    message = str(error)
    assert message.startswith("proc "), message
    assert "'s bootstrap function raised builtins.RuntimeError: stage 3.4 bootstrap failure\n" in message
    # The traceback is the proc's: it names the bootstrap function where it raised.
    assert "Remote traceback:\n" in message and "in raise_in_boot" in message, message
    assert error.failure.type_name == "builtins.RuntimeError"
    assert "in raise_in_boot" in error.failure.traceback
    assert isinstance(error.exception, RemoteException)
    assert error.message == "stage 3.4 bootstrap failure"


def test_calls_to_its_actors_fail_saying_what_the_bootstrap_raised(
    spawn_procs: SpawnProcs,
) -> None:
    """Spawning does not wait for the procs: an actor spawned on the mesh fails with the
    proc, and its exit's description names what the bootstrap raised."""
    pm = spawn_procs({"gpus": 1}, bootstrap=raise_in_boot)
    echo = pm.spawn("echo", Echo)
    said = (
        r"proc c\d+\.p\d+ exited with status 1 after its bootstrap function raised "
        r"builtins.RuntimeError: stage 3.4 bootstrap failure"
    )
    with pytest.raises(SupervisionError, match=said):
        echo.echo.call_one(1).get(T)


def test_an_async_bootstrap_that_raises_is_reported_alike(spawn_procs: SpawnProcs) -> None:
    pm = spawn_procs({"gpus": 2}, bootstrap=raise_in_async_boot)
    with pytest.raises(BootstrapError) as caught:
        pm.initialized.get(T)
    message = str(caught.value)
    assert "'s bootstrap function raised builtins.KeyError: 'no such shard'\n" in message, message
    assert "in raise_in_async_boot" in message, message


def test_the_error_survives_pickling() -> None:
    """It crosses process boundaries as any error does (a proc spawning procs passes it up)."""
    import pickle

    from regency.core._errors import RemoteFailure

    error = BootstrapError("c1.p0", RemoteFailure("builtins.RuntimeError", "boom", "tb\n"), "; t")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is BootstrapError and str(back) == str(error)
    assert back.failure == error.failure and back.proc_id == "c1.p0"


def test_on_the_simulated_cluster_the_same_error_reaches_the_spawner() -> None:
    # The simulator runs the production path: the runtime runs the callable once it listens
    # (on a lockstep thread, through the executor), reports what it raised in its HELLO and
    # exits with 1; the spawn fails with the error, and the run goes on.
    async def program(hosts: Any) -> str:
        pm = hosts.spawn_procs(per_host={"gpus": 1}, bootstrap=raise_in_boot)
        try:
            await pm.initialized
        except BootstrapError as exc:
            return str(exc)
        return "no error"

    result = simulate(program, seed=1, hosts=1)
    said = "bootstrap function raised builtins.RuntimeError: stage 3.4 bootstrap failure"
    assert said in result.value
    assert "raise_in_boot" in result.value  # its traceback
