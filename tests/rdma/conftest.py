"""Shared fixtures of the RDMA tests: a mesh of three peer procs, and the backend under test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from regency.actor import ActorMesh, this_host
from regency.rdma import set_backend

from .actors import Peer

T = 30  # generous timeout for .get(): a hang fails the test instead of the suite

BACKENDS = ("same_host", "tcp")


@pytest.fixture(scope="package")
def peers() -> Iterator[ActorMesh[Peer]]:
    pm = this_host().spawn_procs(per_host={"procs": 3})
    try:
        mesh = pm.spawn("peers", Peer)
        mesh.pid.call().get(T)
        yield mesh
        mesh.stop().get(T)
    finally:
        pm.stop().get(T)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, peers: ActorMesh[Peer]) -> Iterator[str]:
    """Force one backend in the controller and in every peer for the test."""
    name: str = request.param
    set_backend(name)
    peers.use_backend.call(name).get(T)
    yield name
    set_backend(None)
    peers.use_backend.call(None).get(T)
