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
        from ..core._context import current_rank

        rank = current_rank()
        extra = {f"REGENCY_RANK_{k.upper()}": str(v) for k, v in rank.items()}
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
) -> int:
    """Run ``cmd`` once on every host of ``hosts``; print what each printed (prefixed by its
    host rank) and return the largest exit status."""
    if not cmd or not all(isinstance(c, str) for c in cmd):
        raise ValueError(f"exec_command: cmd must be a non-empty list of str (got {cmd!r})")
    procs = hosts.spawn_procs(name="exec")
    try:
        shells = procs.spawn("regency_exec", Shell)
        results = shells.run.call(cmd, dict(env or {}), workdir).get(timeout)
        worst = 0
        for point, result in results.items():
            tag = ",".join(f"{k}={v}" for k, v in point.items())
            for stream, text in ((sys.stdout, result["stdout"]), (sys.stderr, result["stderr"])):
                for line in text.splitlines():
                    print(f"[{tag}] {line}", file=stream)
            code = int(result["returncode"])
            worst = max(worst, code if code >= 0 else 128 - code)
        return worst
    finally:
        procs.stop().get(timeout)
