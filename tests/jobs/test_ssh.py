"""SSHJob end to end against a real OpenSSH server on a virtual host (tests/jobs/_sshd.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from regency.job import SSHJob, job_load

from ..conftest import pid_alive
from ._sshd import sshd_host
from .actors import Probe
from .test_job import T

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _python(tmp_path: Path) -> str:
    """The Python the hosts run: ours, with this repository on its path (a host must import
    the program's actors, here tests.jobs.actors; ssh starts in the home directory)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH={ROOT}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _worker_pids(port: int) -> list[int]:
    """Processes on this machine (any namespace) running a worker on ``port``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        argv0 = cmdline.split(b"\0", 1)[0]
        if argv0.endswith(b"ssh"):
            continue  # our side of the connection
        if (
            b"run_worker_loop_forever" in cmdline
            and f":{port}".encode() in cmdline
            and pid_alive(int(entry))
        ):
            found.append(int(entry))
    return found


def test_ssh_job_starts_workers_over_ssh_and_kill_ends_them(tmp_path: Path) -> None:
    with sshd_host(tmp_path / "ssh") as server:
        job = SSHJob(python_exe=_python(tmp_path), ssh_args=server.ssh_args, monarch_port=22333)
        job.add_mesh("hosts", [server.host.ip])
        state = str(tmp_path / "job_state.pkl")
        try:
            hosts = job.state(cached_path=state).hosts
            probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
            assert probes.bump.call().get(T).values() == [1, 1]
            # The secret reached the worker on its ssh connection's stdin only.
            assert probes.secret_in_env.call().get(T).values() == [False, False]
            secret = job._secret
            for pid in _worker_pids(22333):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    assert secret.encode() not in f.read()
            assert job_load(state).can_run(job)  # a later controller would reuse it
            [worker] = _worker_pids(22333)
        finally:
            job.kill()
        # The worker ended with its ssh connection.
        deadline = time.monotonic() + T
        while pid_alive(worker):
            assert time.monotonic() < deadline, "the worker outlived its ssh connection"
            time.sleep(0.05)


def test_ssh_job_refuses_bad_arguments_and_says_why_a_host_fails(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="transport 'metatls'"):
        SSHJob(transport="metatls")
    with pytest.raises(ValueError, match="only supports the transports"):
        SSHJob(transport="udp")
    with pytest.raises(TypeError, match="ssh_args must be a list of str"):
        SSHJob(ssh_args="-p 22")  # type: ignore[arg-type]
    job = SSHJob()
    with pytest.raises(ValueError, match="hosts must be a non-empty list"):
        job.add_mesh("hosts", "node1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="add_mesh"):
        job.apply()
    with sshd_host(tmp_path / "ssh") as server:
        bad = SSHJob(python_exe="/no/such/python", ssh_args=server.ssh_args, monarch_port=22334)
        bad.add_mesh("hosts", [server.host.ip])
        with pytest.raises(RuntimeError, match=r"the worker on .* did not start .*no/such/python"):
            bad.state(cached_path=None)
