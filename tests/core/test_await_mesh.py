"""``await proc_mesh.spawn(...)`` (the seeds' notebook line): meshes are awaitable."""

from __future__ import annotations

import pickle

import pytest

from regency.actor import ActorMesh, SupervisionError, this_host

from .actors import Bad, Counter


@pytest.mark.slow
async def test_await_spawn_resolves_to_the_mesh_once_initialized() -> None:
    pm = await this_host().spawn_procs(per_host={"gpus": 2})
    counters = await pm.spawn("awaited", Counter, 5)
    assert isinstance(counters, ActorMesh)
    assert (await counters.value.call()).values() == [5, 5]
    assert await counters.slice(gpus=1) is not None  # slices share the spawn's future

    with pytest.raises(SupervisionError, match="init exploded"):
        await pm.spawn("bad_awaited", Bad)

    # A mesh that was passed in (not spawned here) has no initialization to wait for.
    passed = pickle.loads(pickle.dumps(counters))
    assert await passed is passed
    await pm.stop()
