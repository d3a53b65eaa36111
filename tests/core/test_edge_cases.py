"""Bad inputs and odd timings: each fails one thing, clearly, and loses nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import regency
from regency.actor import ActorMesh, Channel, ProcMesh, SupervisionError, this_host

from ..conftest import SpawnProcs
from .actors import (
    Asker,
    AsyncExiter,
    Counter,
    Exiter,
    Producer,
    Shadowed,
    Stoppable,
    TwiceAnswering,
)

#: Real processes: the slow tier (pytest -m "not slow" skips it).
pytestmark = pytest.mark.slow


T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        pm.initialized.get(T)
        yield pm
    finally:
        pm.stop().get(T)


@pytest.mark.parametrize("attempt", range(3))
def test_sibling_procs_can_talk_before_they_all_listen(
    spawn_procs: SpawnProcs, attempt: int
) -> None:
    pm = spawn_procs(per_host={"gpus": 4})
    counters = pm.spawn("counters", Counter, attempt)
    asker = pm.slice(gpus=0).spawn("asker", Asker, counters)
    assert asker.ask.call_one().get(T) == [attempt] * 4
    pm.stop().get(T)


@pytest.mark.parametrize(("cls", "method"), [(Exiter, "exit_sync"), (AsyncExiter, "exit_async")])
def test_base_exception_fails_the_actor_and_poisons_only_its_proc(
    spawn_procs: SpawnProcs, cls: type, method: str
) -> None:
    pm = spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn(f"dies_{method}", cls)
    with pytest.raises(
        SupervisionError,
        match=rf"The actor <tests\.core\.actors\.\w+ dies_{method}\{{'gpus': 1/2\}}> and all its "
        rf"descendants have failed: endpoint dies_{method}.{method} raised builtins",
    ):
        getattr(mesh.slice(gpus=1), method).call_one().get(T)
    with pytest.raises(SupervisionError, match="failed"):
        mesh.slice(gpus=1).ok.call_one().get(T)
    assert mesh.slice(gpus=0).ok.call_one().get(T) == "ok"
    # The failed actor's proc refuses new actors; the other proc takes them.
    with pytest.raises(SupervisionError, match=r"refuses new actors because an actor on it failed"):
        pm.slice(gpus=1).spawn("after", Counter).initialized.get(T)
    assert pm.slice(gpus=0).spawn("after", Counter, 2).value.call_one().get(T) == 2
    pm.stop().get(T)


def test_an_explicit_port_answering_twice_counts_once(procs: ProcMesh) -> None:
    mesh = procs.spawn("twice", TwiceAnswering)
    assert mesh.answer.call().get(T).values() == ["first 0", "first 1"]


def test_open_ranked_reports_the_sender_rank(procs: ProcMesh) -> None:
    ps = procs.spawn("ranked", Producer)
    port, receiver = Channel[int].open_ranked()
    ps.produce.broadcast(port, 1)
    got = sorted(receiver.recv().get(T) for _ in range(2))
    assert got == [(0, 0), (1, 1000)]


def test_endpoint_named_like_a_mesh_attribute_is_refused(procs: ProcMesh) -> None:
    with pytest.raises(
        ValueError, match=r"endpoints \['size'\] of Shadowed have the names of ActorMesh attributes"
    ):
        procs.spawn("shadowed", Shadowed)


def test_an_endpoint_named_stop_is_what_mesh_stop_means(procs: ProcMesh) -> None:
    mesh = procs.spawn("stoppable", Stoppable)
    assert mesh.stop.call().get(T).values() == ["endpoint stop", "endpoint stop"]
    one = mesh.slice(gpus=1)
    assert one.stop.call_one().get(T) == "endpoint stop"
    assert mesh.is_running.call().get(T).values() == [False, False]
    ActorMesh.stop(mesh).get(T)  # the mesh's own stop, spelled out
    with pytest.raises(SupervisionError):
        mesh.is_running.call().get(T)
    with pytest.raises(AttributeError, match="Stoppable has no endpoint 'nope'"):
        mesh.endpoint("nope")


def test_configuration_values_are_checked() -> None:
    with pytest.raises(ValueError, match=r"spawn_timeout must be positive \(got 0\)"):
        regency.configure(spawn_timeout=0)
    with pytest.raises(
        TypeError, match=r"unknown configuration key 'spawn_timout' \(did you mean 'spawn_timeout'\?\)"
    ):
        regency.configure(spawn_timout=1)


def test_oversized_message_fails_at_the_call_site_and_the_link_survives() -> None:
    program = textwrap.dedent(
        """
        import regency
        from regency.actor import this_host
        from tests.core.actors import Recorder
        regency.configure(max_frame_bytes=1 << 20)
        rec = this_host().spawn_procs(per_host={"gpus": 1}).spawn("rec", Recorder)
        try:
            rec.record.call_one(b"x" * (2 << 20)).get(30)
        except ValueError as e:
            print("refused:", e)
        rec.record.call_one(b"small").get(30)
        print("log:", rec.log.call_one().get(30))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "refused: message of 2097" in out.stdout
    assert "exceeds max_frame_bytes=1048576" in out.stdout
    assert "log: [b'small']" in out.stdout
