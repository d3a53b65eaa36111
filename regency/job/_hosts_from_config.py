"""Monarch's ``hosts_from_config(name)``: the host mesh a project's configuration names.

Monarch 0.7 has no configuration behind it yet: it starts two worker processes on this
machine and attaches to them, so a program written for several hosts runs on one. So does
this, with Regency's workers (each ``start_worker_loop_forever`` on a free port of
127.0.0.1; they stop when their host mesh is shut down or this process ends).
"""

from __future__ import annotations

import os
import socket
from typing import Any

#: How many hosts the mesh has (Monarch's fixed two).
NUM_HOSTS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def hosts_from_config(name: str) -> Any:
    """A ``HostMesh`` of :data:`NUM_HOSTS` hosts (dim ``hosts``) named ``name``: workers on
    this machine, started for it. Without ``REGENCY_SECRET`` the workers get this process's
    job secret (a fresh one when Regency has not started here yet)."""
    from ..actor import _start_worker, attach_to_workers

    if not isinstance(name, str):
        raise TypeError(f"hosts_from_config(name) takes a str (got {name!r})")
    from ..core._hosts import new_job_passphrase

    passphrase = None
    env = None
    if not os.environ.get("REGENCY_SECRET", "").strip():
        # Regency already runs here (local procs first): its secret; else a fresh one.
        passphrase = new_job_passphrase()
        env = {**os.environ, "REGENCY_SECRET": passphrase}
    workers = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(NUM_HOSTS)]
    children = []
    try:
        for address in workers:
            children.append(_start_worker(address, env)[1])
        if passphrase is None:
            return attach_to_workers(workers=workers, ca="trust_all_connections", name=name)
        return attach_to_workers(workers, passphrase, name=name)
    except BaseException:
        for child in children:
            child.terminate()
        raise
