"""torchrun-style SPMD scripts on a proc mesh: Monarch's ``monarch.spmd``.

:class:`SPMDActor` sets, in each proc, the environment variables that ``torchrun`` sets
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``, ``MASTER_ADDR``,
``MASTER_PORT``) from the proc's point in its mesh, and can run a training script there, so
an unchanged ``torch.distributed`` script (``init_process_group`` with the ``env://``
defaults) runs across the mesh::

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    spmd = procs.spawn("_SPMDActor", SPMDActor)
    first = dict.fromkeys(procs.extent.labels, 0)
    addr, port = spmd.slice(**first).get_host_port.call_one(None).get()
    spmd.main.call(addr, port, ["train.py", "--lr", "0.01"]).get()

or :func:`setup_torch_elastic_env` for code that calls ``torch.distributed`` from its own
actors. The last dim of the mesh is the procs of one host (``LOCAL_RANK``, as torchrun's
``--nproc-per-node``); the dims before it count hosts (``GROUP_RANK``).
"""

from __future__ import annotations

import enum
import ipaddress
import math
import os
import runpy
import socket
import sys
from typing import Any

from .actor import Actor, ProcMesh, current_rank, current_size, endpoint

__all__ = ["AddrType", "SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]


class AddrType(enum.Enum):
    """Which address family ``get_host_port`` answers with (Monarch's
    ``monarch.tools.network.AddrType``): ``Default`` tries IPv6, then IPv4."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """The first routable (not link-local) address of ``hostname`` of the families
    ``addr_type`` allows; ``RuntimeError`` when it has none."""
    families = {
        AddrType.IPv4: [socket.AF_INET],
        AddrType.IPv6: [socket.AF_INET6],
        AddrType.Default: [socket.AF_INET6, socket.AF_INET],
    }[addr_type]
    for family in families:
        try:
            infos = socket.getaddrinfo(hostname, port, family, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        for info in infos:
            address = str(info[4][0])
            if not ipaddress.ip_address(address.split("%", 1)[0]).is_link_local:
                return address
    raise RuntimeError(
        f"Unable to resolve `{hostname}` to an address ({addr_type.name}) that can bind a TCP "
        "socket. Check the network configuration on the host."
    )


def _find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


class SPMDActor(Actor):
    """One per proc: torchrun's environment for this proc, and a way to run a script in it.

    Ranks come from ``current_rank()``: ``RANK`` is the proc's rank in the mesh,
    ``LOCAL_RANK`` its index along the mesh's last dim (``LOCAL_WORLD_SIZE`` that dim's
    size), ``GROUP_RANK`` which group of the last dim it is in (its host, for meshes spawned
    with ``per_host``)."""

    def __init__(self) -> None:
        super().__init__()
        point = current_rank()
        sizes = current_size()
        labels = point.extent.labels
        if not labels:
            raise ValueError("SPMDActor needs a mesh with at least one dim")
        local_dim = labels[-1]  # typically "gpus"
        self.local_rank: int = point[local_dim]
        self.rank: int = point.rank
        self.nproc_per_node: int = sizes[local_dim]
        self.world_size: int = math.prod(sizes.values())
        self.local_world_size: int = sizes[local_dim]
        self.group_rank: int = self.rank // self.local_world_size
        self.group_world_size: int = (
            self.world_size + self.local_world_size - 1
        ) // self.local_world_size

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        os.environ.update(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(self.rank),
                "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size),
                "GROUP_RANK": str(self.group_rank),
                "GROUP_WORLD_SIZE": str(self.group_world_size),
                "ROLE_RANK": str(self.rank),
                "ROLE_WORLD_SIZE": str(self.world_size),
                "ROLE_NAME": "rank",
                "WORLD_SIZE": str(self.world_size),
            }
        )

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None) -> tuple[str, int]:
        """This host's name (or, with ``use_ipaddr``, its address of that family) and a free
        port on it: a rendezvous for ``MASTER_ADDR``/``MASTER_PORT``."""
        hostname = socket.gethostname()
        port = _find_free_port()
        if use_ipaddr is None:
            return (hostname, port)
        return (get_ipaddr(hostname, port, use_ipaddr), port)

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables in this proc's environment."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the variables, then run a script as torchrun would: ``["train.py", *args]``
        runs the file, ``["-m", "pkg.train", *args]`` the module, as ``__main__`` with
        ``sys.argv`` set. Returns True once it has finished; its exception fails the call."""
        self._setup_env(master_addr, master_port)
        if script_args and script_args[0] == "-m":
            if len(script_args) < 2:
                raise ValueError("No module specified after -m")
            module_name = script_args[1]
            sys.argv = [module_name, *script_args[2:]]
            runpy.run_module(module_name, run_name="__main__", alter_sys=True)
        elif script_args:
            sys.argv = list(script_args)
            runpy.run_path(script_args[0], run_name="__main__")
        else:
            raise ValueError("No script or module specified")
        return True


def _check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            "Either both master_addr and master_port must be specified or neither must be "
            "specified."
        )


def _first(proc_mesh: ProcMesh) -> dict[str, Any]:
    return dict.fromkeys(proc_mesh.extent.labels, 0)


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Set torchrun's variables in every proc of ``proc_mesh`` (spawns an :class:`SPMDActor`
    per proc). Without ``master_addr``/``master_port``, the first proc (every coordinate 0)
    picks its host and a free port there."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        master_addr, master_port = (
            actors.slice(**_first(proc_mesh)).get_host_port.call_one(use_ipaddr).get()
        )
    assert master_port is not None
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """:func:`setup_torch_elastic_env` for async code (``await``)."""
    _check_master(master_addr, master_port)
    actors = proc_mesh.spawn("_SPMDActor", SPMDActor)
    if master_addr is None:
        master_addr, master_port = await actors.slice(
            **_first(proc_mesh)
        ).get_host_port.call_one(use_ipaddr)
    assert master_port is not None
    await actors.setup_env.call(master_addr, master_port)
