"""``context().actor_instance.abort(reason)`` (Monarch's): the actor fails with the reason."""

from __future__ import annotations

import pytest

from regency.actor import SupervisionError, this_host

from ..conftest import RootFailures
from .actors import Aborter

T = 30


@pytest.mark.slow
@pytest.mark.parametrize("reason", [None, "work is done badly"])
def test_abort_fails_the_actor_with_its_reason(roots: RootFailures, reason: str | None) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    name = f"aborter_{'none' if reason is None else 'reason'}"
    try:
        mesh = procs.spawn(name, Aborter)
        assert mesh.abort.call_one(reason).get(T) == "aborting"  # the handler finishes first
        failure = roots.wait_for(name, T)
        with pytest.raises(SupervisionError, match="actor aborted"):
            mesh.abort.call_one(None).get(T)
    finally:
        procs.stop().get(T)
    expected = reason or "no reason provided"
    assert failure.cause.summary == f"actor aborted: {expected}"
    assert f"The actor <tests.compat.actors.Aborter {name}{{'gpus': 0/1}}>" in failure.report()
