"""``@concurrent_endpoint`` as Monarch programs use it: real procs, asyncio in the bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from regency.actor import (
    Actor,
    Port,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    this_host,
)

from .actors import Gate

T = 30


@pytest.mark.slow
def test_concurrent_calls_cancelled_before_cleanup_when_the_proc_stops(tmp_path: Path) -> None:
    log = tmp_path / "log"
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        gate = procs.spawn("gate", Gate, str(log))
        waiting = gate.wait.call_one()  # waits for the next call: only a concurrent call can
        assert gate.release_when_ready.call_one().get(T) == "released"
        assert waiting.get(T) == "done"
        assert gate.hang.call_one().get(T) == "started"  # still running when the proc stops
    finally:
        procs.stop().get(T)
    # asyncio code saw CancelledError, and it ran to its end before __cleanup__.
    assert log.read_text() == "hang cancelled\ncleanup\n"


@pytest.mark.slow
def test_an_explicit_port_body_that_raises_fails_the_actor(tmp_path: Path, roots: object) -> None:
    # Two procs: a failed actor's proc refuses new actors.
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        gate = procs.slice(gpus=0).spawn("raising_gate", Gate, str(tmp_path / "log"))
        # The caller got its answer; the error after it is not lost: the actor fails.
        assert gate.answer_then_raise.call_one().get(T) == "answered"
        with pytest.raises(SupervisionError, match="after the answer"):
            gate.release_when_ready.call_one().get(T)
        gate2 = procs.slice(gpus=1).spawn("raising_gate2", Gate, str(tmp_path / "log2"))
        with pytest.raises(SupervisionError, match="explicit boom"):
            gate2.raise_unanswered.call_one().get(T)
    finally:
        procs.stop().get(T)


def test_concurrent_endpoint_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"does not wrap @endpoint \(on ping\)"):

        class Stacked(Actor):
            @concurrent_endpoint
            @endpoint
            async def ping(self) -> str:
                return "pong"

    with pytest.raises(ValueError, match=r"can only wrap async endpoints: make .*ping an"):

        class Sync(Actor):
            @concurrent_endpoint  # type: ignore[arg-type]
            def ping(self) -> str:
                return "pong"

    class Mixed(Actor):
        @concurrent_endpoint
        async def wait(self) -> None: ...

        @concurrent_endpoint(explicit_response_port=True)
        async def answer(self, port: Port[int]) -> None: ...

        @endpoint
        async def plain(self) -> None: ...

    # Monarch's attribute: concurrent endpoints answer through a port.
    assert Mixed.wait._explicit_response_port
    assert Mixed.answer._explicit_response_port
    assert not Mixed.plain._explicit_response_port
