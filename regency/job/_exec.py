"""Run a shell command on the hosts of a mesh (``regency exec``)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from ..core._endpoint import Actor, endpoint
from ..core._proc_mesh import HostMesh


class Shell(Actor):
    """Runs commands on its host and returns what they printed."""

    @endpoint
    def run(
        self, cmd: list[str], env: dict[str, str], workdir: str | None
    ) -> dict[str, Any]:
        from ..core._context import current_rank, current_size

        rank = current_rank()
        extra = {f"REGENCY_RANK_{k.upper()}": str(v) for k, v in rank.items()}
        extra.update({f"REGENCY_SIZE_{k.upper()}": str(v) for k, v in current_size().items()})
        if cmd[0] == "-m":  # `regency exec -m MODULE`: this host's Python runs it
            cmd = [sys.executable, *cmd]
        try:
            done = subprocess.run(
                cmd,
                env={**os.environ, **extra, **env},
                cwd=workdir,
                capture_output=True,
                text=True,
            )
        except OSError as exc:
            return {"returncode": 127, "stdout": "", "stderr": f"{cmd[0]}: {exc}\n"}
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def exec_command(
    hosts: HostMesh,
    cmd: list[str],
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    *,
    timeout: float | None = None,
    per_host: dict[str, int] | None = None,
    point: dict[str, int] | None = None,
) -> int:
    """Run ``cmd`` once on every host of ``hosts`` (``per_host={"gpus": 4}``: in 4 procs per
    host, each with ``REGENCY_RANK_<DIM>``/``REGENCY_SIZE_<DIM>`` of every dim; ``point``:
    only at those coordinates, e.g. ``{"hosts": 1, "gpus": 3}``); print what each printed
    (prefixed by its coordinates) and return the largest exit status. A ``cmd`` that starts
    with ``"-m"`` runs a module with the host's Python."""
    if not cmd or not all(isinstance(c, str) for c in cmd):
        raise ValueError(f"exec_command: cmd must be a non-empty list of str (got {cmd!r})")
    dims = [*hosts._shape.labels, *(per_host or {})]
    fixed = dict(point or {})  # the coordinates the slice takes away, for the tags
    if point is not None:
        unknown = [d for d in point if d not in dims]
        if unknown:
            raise ValueError(
                f"exec_command: point names dims {unknown} that the mesh does not have "
                f"(its dims: {dims})"
            )
    procs = hosts.spawn_procs(name="exec", per_host=per_host)
    try:
        shells = procs.spawn("regency_exec", Shell)
        if point:
            shells = shells.slice(**point)
        results = shells.run.call(cmd, dict(env or {}), workdir).get(timeout)
        worst = 0
        for at, result in results.items():
            coords = {**fixed, **dict(at.items())}
            tag = ",".join(f"{d}={coords[d]}" for d in dims if d in coords)
            for stream, text in ((sys.stdout, result["stdout"]), (sys.stderr, result["stderr"])):
                for line in text.splitlines():
                    print(f"[{tag}] {line}", file=stream)
            code = int(result["returncode"])
            worst = max(worst, code if code >= 0 else 128 - code)
        return worst
    finally:
        procs.stop().get(timeout)
