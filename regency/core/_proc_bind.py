"""``spawn_procs(proc_bind=...)``: Monarch's per-proc CPU and NUMA binding.

A binding is a dict of Monarch's keys: ``cpunodebind``, ``membind`` and ``physcpubind``
(``numactl``, on a NUMA machine) and ``cpus`` (``taskset -c``, used where numactl does not
apply). The controller checks the list (:func:`check_proc_bind`); the host that starts the
proc wraps its command (:func:`bind_command`): the controller for procs on its own host, the
worker for procs on a host of ``attach_to_workers`` (the binding travels in the bootstrap
record of LAUNCH, under :data:`RECORD_KEY`), since only that host knows its NUMA nodes and
tools.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from ._bootstrap_command import BootstrapCommand

#: Monarch's ``proc_bind`` keys.
BIND_KEYS = frozenset({"cpunodebind", "membind", "physcpubind", "cpus"})
_NUMACTL_KEYS = ("cpunodebind", "membind", "physcpubind")
#: Where a proc's binding travels in the bootstrap record of LAUNCH (the worker takes it out).
RECORD_KEY = "proc_bind"


def check_proc_bind(proc_bind: object, per_host: int) -> list[dict[str, str]]:
    """``proc_bind`` checked: a list of ``per_host`` dicts of Monarch's keys to strings."""
    if isinstance(proc_bind, dict | str) or not isinstance(proc_bind, list | tuple):
        raise TypeError(
            f"proc_bind must be a list of dicts, one per proc of a host (got {proc_bind!r})"
        )
    if len(proc_bind) != per_host:
        raise ValueError(
            f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({per_host})"
        )
    for bind in proc_bind:
        if not isinstance(bind, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in bind.items()
        ):
            raise TypeError(f"proc_bind entries must map str to str (got {bind!r})")
        unknown = set(bind) - BIND_KEYS
        if unknown:
            raise ValueError(
                f"proc_bind keys must be among {sorted(BIND_KEYS)} (got {sorted(unknown)})"
            )
    return [dict(bind) for bind in proc_bind]


def bind_command(bind: Mapping[str, str], command: BootstrapCommand) -> BootstrapCommand:
    """``command`` run under ``numactl`` or ``taskset`` as ``bind`` says, on this host:
    numactl's keys where this is a NUMA machine, else ``cpus`` with taskset. Raises
    ``ValueError``/``FileNotFoundError`` saying what this host lacks."""
    numactl = [f"--{k}={bind[k]}" for k in _NUMACTL_KEYS if k in bind]
    numa = os.path.exists("/sys/devices/system/node/node0")
    if numa and numactl:
        tool, options = "numactl", numactl
    elif "cpus" in bind:
        tool, options = "taskset", ["-c", bind["cpus"]]
    elif numactl:
        raise ValueError(
            f"proc_bind {dict(bind)} needs a NUMA machine for numactl's keys "
            "(/sys/devices/system/node/node0 is missing); give 'cpus' instead"
        )
    else:
        return command
    program = shutil.which(tool)
    if program is None:
        raise FileNotFoundError(
            f"proc_bind {dict(bind)} needs {tool!r} on PATH (Debian: apt install "
            f"{'numactl' if tool == 'numactl' else 'util-linux'})"
        )
    return BootstrapCommand(program, None, [*options, command.program, *command.args], command.env)
