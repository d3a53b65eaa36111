"""A relay between hosts that restarts: dials across it are refused for a while. Whether a
refusal may pass is the transport's to say (``Transport.refusal_is_final``): across
simulated hosts, as across tcp, the sender keeps dialing for ``reconnect_refused_s`` and
loses nothing; past that, the link fails, as it does in production."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from regency.actor import Actor, endpoint
from regency.sim import DisconnectFault, FaultSchedule, SimNetwork, simulate

from ..conftest import RootFailures


class Tally(Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def add(self, n: int) -> int:
        self.seen.append(n)
        return n

    @endpoint
    def all(self) -> list[int]:
        return self.seen


def _name(refuse_for: float) -> str:
    return f"tally_refused_{refuse_for:g}s"


def _program(refuse_for: float) -> Any:
    async def program(hosts: Any) -> list[object]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        tally = procs.spawn(_name(refuse_for), Tally)
        await tally.add.call(0)
        # The relay between the controller and host1 restarts at 0.5: links break, and
        # dials are refused for ``refuse_for``. Sends made meanwhile wait for the link.
        await trio.sleep_until(0.5)
        sent = [tally.add.call(n) for n in range(1, 6)]
        outcome: list[object] = []
        for call in sent:
            try:
                outcome.append(sorted((await call).values()))
            except Exception as exc:
                outcome.append(type(exc).__name__)
        try:
            outcome.append([v for v in (await tally.all.call()).values()])
        except Exception as exc:
            outcome.append(type(exc).__name__)
        return outcome

    return program


def _run(refuse_for: float, roots: RootFailures) -> Any:
    fault = DisconnectFault(0.5, "controller", "host1", refuse_for)
    return simulate(_program(refuse_for), seed=5, hosts=2, faults=FaultSchedule(faults=(fault,)))


def test_a_refusal_shorter_than_reconnect_refused_s_loses_nothing(roots: RootFailures) -> None:
    result = _run(1.0, roots)
    assert result.value[:5] == [[n, n] for n in range(1, 6)]
    assert result.value[5] == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
    lines = [str(e) for e in result.events]
    assert any("refused in between" in line for line in lines), lines
    assert roots.of(_name(1.0)) == []


def test_a_refusal_past_reconnect_refused_s_fails_the_link(roots: RootFailures) -> None:
    result = _run(10.0, roots)
    assert all(isinstance(v, str) for v in result.value[:5]), result.value
    assert roots.of(_name(10.0)), "the lost proc reached no one"


def test_within_a_host_a_refusal_is_final_and_across_hosts_it_may_pass() -> None:
    async def main() -> tuple[bool, bool]:
        net = SimNetwork(random.Random(1))
        async with trio.open_nursery() as nursery:
            transport = net.transport("host0", nursery)
            same = transport.refusal_is_final("sim://host0/p1")
            other = transport.refusal_is_final("sim://host1/p1")
            nursery.cancel_scope.cancel()
        return same, other

    assert trio.run(main) == (True, False)


def test_refuse_for_must_be_a_duration() -> None:
    with pytest.raises(ValueError, match="refuse_for"):
        DisconnectFault(0.5, "controller", "host1", -1.0)
