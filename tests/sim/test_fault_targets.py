"""Fault calls take what a user has in hand, and refuse, loudly, what they cannot use.

A mesh rank, a ``HostMesh``/``ProcMesh`` slice, an ``ActorMesh`` or the names the event log
prints all aim a fault; anything else raises ``TypeError``/``LookupError``/``ValueError``
naming what was expected. A fault that silently does nothing is the worst outcome.
"""

from __future__ import annotations

from typing import Any

import pytest

from regency.actor import SupervisionError
from regency.sim import SimResult, current, simulate

from .actors import Counter


def kinds(result: SimResult, kind: str) -> list[str]:
    return [e.detail for e in result.events if e.kind == kind]


def crash_and_call(target_of: Any) -> Any:
    """A program that crashes what ``target_of(hosts, procs, counters)`` names and then
    calls every host's counter: which ranks still answer, which fail."""

    def program(hosts: Any) -> tuple[list[str], list[str]]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        counters = procs.spawn("targets", Counter)
        counters.value.call().get()
        current().crash_host(target_of(hosts, procs, counters))
        answered, failed = [], []
        for rank in range(3):
            try:
                counters.slice(hosts=rank).value.call_one().get()
                answered.append(f"host{rank}")
            except SupervisionError:
                failed.append(f"host{rank}")
        return answered, failed

    return program


@pytest.mark.parametrize(
    "target",
    [
        pytest.param(lambda hosts, procs, counters: 1, id="mesh rank"),
        pytest.param(lambda hosts, procs, counters: "host1", id="host name"),
        pytest.param(lambda hosts, procs, counters: hosts.slice(hosts=1), id="HostMesh slice"),
        pytest.param(lambda hosts, procs, counters: procs.slice(hosts=1), id="ProcMesh slice"),
        pytest.param(lambda hosts, procs, counters: counters.slice(hosts=1), id="ActorMesh"),
        pytest.param(
            lambda hosts, procs, counters: procs.slice(hosts=1)._procs[1][1], id="proc address"
        ),
    ],
)
def test_crash_host_takes_a_rank_a_slice_a_mesh_or_a_name(target: Any) -> None:
    result = simulate(crash_and_call(target), seed=3, hosts=3)
    assert result.value == (["host0", "host2"], ["host1"])
    assert kinds(result, "crash") == ["host1"]


def test_crash_host_of_several_hosts_crashes_each() -> None:
    result = simulate(
        crash_and_call(lambda hosts, procs, counters: hosts.slice(hosts=slice(1, 3))),
        seed=3,
        hosts=3,
    )
    assert result.value == (["host0"], ["host1", "host2"])
    assert kinds(result, "crash") == ["host1", "host2"]


def test_crash_proc_and_pause_proc_take_proc_and_actor_meshes() -> None:
    def program(hosts: Any) -> list[str]:
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        counters = procs.spawn("pc", Counter)
        counters.value.call().get()
        sim = current()
        sim.crash_proc(procs.slice(hosts=0, gpus=1))
        sim.crash_proc(counters.slice(hosts=1, gpus=0))
        sim.pause_proc(counters.slice(hosts=1, gpus=1), 2.0)
        outcome = []
        for h in range(2):
            for g in range(2):
                try:
                    counters.slice(hosts=h, gpus=g).value.call_one().get()
                    outcome.append("ok")
                except SupervisionError:
                    outcome.append("dead")
        return outcome

    result = simulate(program, seed=5, hosts=2)
    assert result.value == ["ok", "dead", "dead", "ok"]  # the paused one answers later
    assert [d.split("/")[2] for d in kinds(result, "crash_proc")] == ["host0", "host1"]
    assert len(kinds(result, "pause")) == 1 and "sim://host1/" in kinds(result, "pause")[0]


def test_link_faults_take_ranks_and_slices() -> None:
    def program(hosts: Any) -> None:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        counters = procs.spawn("links", Counter)
        counters.value.call().get()
        sim = current()
        sim.clog(hosts.slice(hosts=0), 0.5)
        sim.delay(0, procs.slice(hosts=1), 0.25, 1.0)
        sim.disconnect(counters.slice(hosts=0), "controller")
        sim.partition([hosts.slice(hosts=0), "controller"], 1, duration=2.0)
        sim.crash_host(2)
        sim.restart_host(hosts.slice(hosts=2))
        counters.slice(hosts=0).value.call_one().get()

    result = simulate(program, seed=6, hosts=3)
    assert [d.split(" ")[0] for d in kinds(result, "clog")] == ["host0"]
    assert [d.split(" ")[0] for d in kinds(result, "delay")] == ["host0|host1"]
    assert [d.split(" ")[0] for d in kinds(result, "disconnect")] == ["controller|host0"]
    assert [d.split(" until")[0] for d in kinds(result, "partition")] == [
        "#1 controller,host0 | host1"
    ]
    assert kinds(result, "restart") == ["host2"]


def test_what_a_fault_cannot_use_is_refused_with_what_it_expected() -> None:
    def program(hosts: Any) -> list[str]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        sim = current()
        seen = []
        attempts = [
            lambda: sim.crash_host("host9"),
            lambda: sim.crash_host(5),
            lambda: sim.crash_host(1.0),
            lambda: sim.crash_host(True),
            lambda: sim.crash_host("controller"),
            lambda: sim.crash_host("sim:host1"),
            lambda: sim.crash_proc(1),
            lambda: sim.crash_proc("sim://host0/nobody"),
            lambda: sim.crash_proc(hosts),
            lambda: sim.pause_proc(procs, -1.0),
            lambda: sim.pause_proc(procs, "long"),
            lambda: sim.partition([0], [0, 1]),
            lambda: sim.partition([], [1]),
            lambda: sim.disconnect(1, "host7"),
            lambda: sim.clog(0, float("nan")),
            lambda: sim.delay(0, 1, -0.5, 1.0),
        ]
        for attempt in attempts:
            try:
                attempt()
            except (TypeError, LookupError, ValueError) as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
            else:
                seen.append("accepted")
        return seen

    seen = simulate(program, seed=1, hosts=2).value
    expected = [
        "LookupError: crash_host(host): no simulated host 'host9' (hosts: 'controller', "
        "'host0', 'host1')",
        "LookupError: crash_host(host): no host of rank 5 in the simulation's host mesh of 2 "
        "host(s) (ranks 0..1)",
        "TypeError: crash_host(host) must be a host name (str), the rank of a host in the "
        "simulation's host mesh (int), a HostMesh or ProcMesh slice, an ActorMesh, or a proc "
        "address 'sim://HOST/PROC' (got float)",
        "TypeError: crash_host(host) must be a host name (str), the rank of a host in the "
        "simulation's host mesh (int), a HostMesh or ProcMesh slice, an ActorMesh, or a proc "
        "address 'sim://HOST/PROC' (got True)",
        "ValueError: crash_host(host): the controller's host 'controller' cannot crash (the "
        "program runs there); crash the procs on it with crash_proc",
        "LookupError: crash_host(host): no simulated host 'sim:host1' (hosts: 'controller', "
        "'host0', 'host1')",
        "TypeError: crash_proc(proc) must be a proc address 'sim://HOST/PROC' (str), a "
        "ProcMesh slice, or an ActorMesh (its procs) (got the int 1: a proc rank needs its "
        "mesh, e.g. procs.slice(gpus=1))",
        "LookupError: crash_proc(proc): no running simulated proc at 'sim://host0/nobody'",
        "TypeError: crash_proc(proc) must be a proc address 'sim://HOST/PROC' (str), a "
        "ProcMesh slice, or an ActorMesh (its procs) (got HostMesh)",
        "ValueError: pause_proc(duration) must be a number of virtual seconds >= 0 (got -1.0)",
        "TypeError: pause_proc(duration) must be a number of virtual seconds >= 0 (got 'long')",
        "ValueError: partition sides must not share hosts (both have ['host0'])",
        "LookupError: partition(a): an empty list names no host",
        "LookupError: disconnect(host_b): no simulated host 'host7' (hosts: 'controller', "
        "'host0', 'host1')",
        "ValueError: clog(duration) must be a number of virtual seconds >= 0 (got nan)",
        "ValueError: delay(extra) must be a number of virtual seconds >= 0 (got -0.5)",
    ]
    assert seen == expected


def test_faults_aimed_at_procs_that_are_still_starting_take_effect() -> None:
    # spawn_procs returns before its procs run: a fault aimed at them at once must not be
    # refused, and must not be lost.
    def program(hosts: Any) -> list[str]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        counters = procs.spawn("early", Counter)
        current().crash_proc(procs.slice(hosts=0))
        current().pause_proc(procs.slice(hosts=1), 5.0)
        outcome = []
        for rank in range(2):
            try:
                counters.slice(hosts=rank).value.call_one().get()
                outcome.append(f"ok at {current().now():.1f}")
            except SupervisionError:
                outcome.append("dead")
        return outcome

    result = simulate(program, seed=2, hosts=2)
    assert result.value[0] == "dead"
    assert result.value[1].startswith("ok at 5.")  # answered once the pause ended
    assert len(kinds(result, "crash_proc")) == 1 and len(kinds(result, "pause")) == 1
