"""Monarch's ``monarch.spmd``: torchrun's environment in each proc, and a torchrun-style
script (``torch.distributed`` over gloo) run unchanged across a proc mesh."""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
from pathlib import Path

import pytest

from regency.actor import Actor, endpoint, this_host
from regency.spmd import AddrType, SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async

T = 60
_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


class Environ(Actor):
    @endpoint
    def torchrun(self) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in _VARS}


@pytest.mark.slow
def test_setup_torch_elastic_env_sets_torchruns_variables_from_the_mesh() -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    try:
        setup_torch_elastic_env(procs)
        seen = procs.spawn("environ", Environ).torchrun.call().get(T)
        got = {point["hosts"] * 2 + point["gpus"]: env for point, env in seen.items()}
        masters = {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in got.values()}
        assert len(masters) == 1
        master_addr, master_port = masters.pop()
        assert master_addr == socket.gethostname() and master_port and int(master_port) > 0
        for rank, env in got.items():
            assert env["RANK"] == env["ROLE_RANK"] == str(rank)
            assert env["LOCAL_RANK"] == str(rank % 2)
            assert env["GROUP_RANK"] == str(rank // 2)
            assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
            assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
            assert env["ROLE_NAME"] == "rank"
        # The async form, with an explicit rendezvous.
        asyncio.run(setup_torch_elastic_env_async(procs, "127.0.0.1", 29999))
        again = procs.spawn("environ2", Environ).torchrun.call().get(T).values()
        assert {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in again} == {
            ("127.0.0.1", "29999")
        }
        with pytest.raises(ValueError, match="both master_addr and master_port"):
            setup_torch_elastic_env(procs, master_addr="127.0.0.1")
        # Monarch's rendezvous by address family.
        spmd = procs.spawn("spmd", SPMDActor).slice(hosts=0, gpus=0)
        address, _ = spmd.get_host_port.call_one(AddrType.IPv4).get(T)
        assert socket.inet_aton(address)
    finally:
        procs.stop().get(T)


TRAIN = textwrap.dedent(
    """
    import os
    import sys

    import torch
    import torch.distributed as dist

    def main():
        dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_*
        rank = dist.get_rank()
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        with open(os.path.join(sys.argv[1], f"rank{rank}"), "w") as f:
            f.write(f"{dist.get_world_size()} {value.item()} {os.environ['LOCAL_RANK']}")
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow
def test_a_torchrun_script_runs_unchanged_across_the_mesh(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        spmd = procs.spawn("_SPMDActor", SPMDActor)
        first = dict.fromkeys(procs.extent.labels, 0)
        master_addr, master_port = spmd.slice(**first).get_host_port.call_one(None).get(T)
        done = spmd.main.call(master_addr, master_port, [str(script), str(tmp_path)]).get(T)
        assert list(done.values()) == [True, True]
    finally:
        procs.stop().get(T)
    results = sorted((tmp_path / f"rank{r}").read_text() for r in range(2))
    assert results == ["2 3.0 0", "2 3.0 1"]
