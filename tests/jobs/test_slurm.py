"""SlurmJob end to end against a real single-node SLURM 22.05 cluster (see conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from regency.job import SlurmJob, job_load
from regency.testing import SlurmCluster

from ..conftest import pid_alive
from .test_job import T, controller, report_of, wait_gone

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _spec(tmp_path: Path, port: int) -> str:
    return (
        f"SlurmJob({{'hosts': 1}}, python_exe={sys.executable!r}, port={port}, "
        f"log_dir={str(tmp_path / 'logs')!r}, lease=2.0, job_start_timeout=60)"
    )


#: What a job is once over (kill() may race a worker that exits on shutdown with scancel).
ENDED = {"CANCELLED", "COMPLETED", "FAILED"}


def _job_state(slurm: SlurmCluster, job_id: str) -> str:
    out = slurm.run("scontrol", "show", "job", job_id).stdout
    match = re.search(r"JobState=(\w+)", out)
    return match.group(1) if match else "GONE"


def _wait_job_state(slurm: SlurmCluster, job_id: str, states: set[str], within: float = T) -> str:
    deadline = time.monotonic() + within
    while (state := _job_state(slurm, job_id)) not in states:
        assert time.monotonic() < deadline, f"job {job_id} is {state}, expected one of {states}"
        time.sleep(0.05)
    return state


def _workers_of_port(port: int) -> list[int]:
    """Live worker processes (python -c ...run_worker_loop_forever...) on ``port`` (not the
    srun that started them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        argv = cmdline.split(b"\0")
        ours = argv[:2] == [sys.executable.encode(), b"-c"] and (
            b"run_worker_loop_forever" in argv[2] and f":{port}'".encode() in argv[2]
        )
        if ours and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def _regency(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["PYTHONPATH"] = ROOT
    return subprocess.run(
        [sys.executable, "-m", "regency", *args], cwd=tmp_path, capture_output=True,
        text=True, timeout=T, env=env,
    )  # fmt: skip


def test_apply_state_calls_reuse_and_kill(slurm: SlurmCluster, tmp_path: Path) -> None:
    port = _free_port()
    state = str(tmp_path / "job_state.pkl")
    first = controller(_spec(tmp_path, port), state)
    meshes = report_of(first)
    assert first.wait(T) == 0
    job = job_load(state)
    assert isinstance(job, SlurmJob) and job.job_id is not None
    job_id = job.job_id
    [(_, in_job, parent)] = meshes["hosts"]["where"]  # type: ignore[misc]
    assert in_job == job_id  # the proc runs inside the allocation
    assert meshes["hosts"]["secret_in_env"] == [False]
    [worker] = _workers_of_port(port)
    # The secret: in the 0600 state file, on no command line, not in the batch script.
    secret = job._secret
    assert len(secret) >= 32 and oct(os.stat(state).st_mode & 0o777) == "0o600"
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                assert secret.encode() not in f.read()
        except OSError:
            continue
    script = slurm.run("scontrol", "write", "batch_script", job_id, "-").stdout
    assert "run_worker_loop_forever" in script and secret not in script

    # A later controller with an equal spec reuses the allocation (no second job).
    second = controller(_spec(tmp_path, port), state, "kill")
    again = report_of(second)
    assert second.wait(T) == 0, second.stderr.read() if second.stderr else ""
    [(_, again_job, again_parent)] = again["hosts"]["where"]  # type: ignore[misc]
    assert (again_job, again_parent) == (job_id, parent)  # same worker, same proc launcher
    assert again["hosts"]["bumps"] == [1]
    # kill() shut the mesh down (its worker exits) and ran scancel: the job is over.
    _wait_job_state(slurm, job_id, ENDED)
    wait_gone([worker], T)


def test_a_killed_controller_leaves_no_procs_then_exec_and_kill_from_the_cli(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    port = _free_port()
    (tmp_path / "jobs.py").write_text(
        f"from regency.job import SlurmJob\njob = {_spec(tmp_path, port)}\n"
    )
    applied = _regency(tmp_path, "apply", "jobs:job")
    assert applied.returncode == 0, applied.stderr
    job_id = re.search(r"job id (\d+)", applied.stdout).group(1)  # type: ignore[union-attr]
    state = str(tmp_path / ".regency" / "job_state.pkl")
    held = controller(_spec(tmp_path, port), state, "hold")
    [(proc, in_job, _)] = report_of(held)["hosts"]["where"]  # type: ignore[misc]
    assert in_job == job_id  # the controller reused what `regency apply` made
    [worker] = _workers_of_port(port)
    held.send_signal(signal.SIGKILL)
    held.wait(T)
    wait_gone([proc], 10)  # its lease (2 s) ran out: the worker killed its procs
    assert pid_alive(worker) and _job_state(slurm, job_id) == "RUNNING"

    out = _regency(
        tmp_path, "exec", "--one", "--mesh", "hosts", "-e", "X=42", "--workdir", "/tmp", "--",
        "sh", "-c", "echo $SLURM_JOB_ID x=$X $(pwd); exit 3",
    )  # fmt: skip
    assert out.returncode == 3, out.stderr  # the largest exit status of the hosts
    assert f"[hosts=0] {job_id} x=42 /tmp" in out.stdout
    killed = _regency(tmp_path, "kill")
    assert killed.returncode == 0, killed.stderr
    assert not os.path.exists(state)
    assert _wait_job_state(slurm, job_id, ENDED) == "CANCELLED"  # no controller: scancel
    wait_gone([worker], T)


CLIENT = textwrap.dedent(
    """
    import json, os, sys, time
    from regency.job import SlurmJob
    from tests.jobs.actors import Probe
    from jobs import job
    state = job.state()
    probes = state.hosts.spawn_procs(per_host={"gpus": 2}).spawn("p", Probe)
    where = probes.where.call().get(60).values()
    with open("result.json", "w") as f:
        json.dump({"where": where, "batch": os.environ.get("REGENCY_BATCH_JOB"),
                   "job_id": job.job_id, "client_pid": os.getpid()}, f)
    if sys.argv[1:] == ["hold"]:
        time.sleep(600)
    """
)


def _batch(slurm: SlurmCluster, tmp_path: Path, hold: bool) -> tuple[str, int]:
    port = _free_port()
    (tmp_path / "jobs.py").write_text(
        f"from regency.job import SlurmJob\njob = {_spec(tmp_path, port)}\n"
    )
    (tmp_path / "client.py").write_text(CLIENT)
    client = f"{sys.executable} client.py" + (" hold" if hold else "")
    applied = _regency(tmp_path, "apply", "--batch", client, "jobs:job")
    assert applied.returncode == 0, applied.stderr
    job_id = re.search(r"job id (\d+)", applied.stdout).group(1)  # type: ignore[union-attr]
    return job_id, port


def _result(tmp_path: Path, slurm: SlurmCluster, job_id: str) -> dict[str, object]:
    deadline = time.monotonic() + T
    path = tmp_path / "result.json"
    while not path.exists() or not path.read_text().endswith("}"):
        state = _job_state(slurm, job_id)
        if state not in ("PENDING", "RUNNING"):
            logs = [p.read_text() for p in (tmp_path / "logs").glob("*")]
            raise AssertionError(f"job {job_id} is {state} and the client wrote nothing: {logs}")
        assert time.monotonic() < deadline
        time.sleep(0.05)
    result: dict[str, object] = json.loads(path.read_text())
    return result


def test_batch_mode_runs_the_client_in_the_allocation_and_stops_the_workers(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job_id, port = _batch(slurm, tmp_path, hold=False)
    result = _result(tmp_path, slurm, job_id)
    assert result["batch"] == "1" and result["job_id"] == job_id
    where = result["where"]
    assert isinstance(where, list) and len(where) == 2
    assert {w[1] for w in where} == {job_id}
    assert _wait_job_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    assert _workers_of_port(port) == []
    wait_gone([w[0] for w in where], 10)
    out = next((tmp_path / "logs").glob(f"slurm_{job_id}_*.out")).read_text()
    assert "the client exited with 0; workers stopped" in out


def test_batch_mode_a_killed_client_leaves_no_workers(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id, port = _batch(slurm, tmp_path, hold=True)
    result = _result(tmp_path, slurm, job_id)
    workers = _workers_of_port(port)
    assert len(workers) == 1
    os.kill(int(result["client_pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    state = _wait_job_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED"})
    assert state == "FAILED"  # the client's status (killed) is the job's
    wait_gone(workers, T)
    where = result["where"]
    assert isinstance(where, list)
    wait_gone([w[0] for w in where], 10)


def test_regency_kill_cancels_a_batch_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id, port = _batch(slurm, tmp_path, hold=True)
    _result(tmp_path, slurm, job_id)
    workers = _workers_of_port(port)
    assert len(workers) == 1
    killed = _regency(tmp_path, "kill")
    assert killed.returncode == 0, killed.stderr
    assert _wait_job_state(slurm, job_id, ENDED) == "CANCELLED"
    wait_gone(workers, T)


def test_sbatch_refusal_and_job_start_timeout_are_clear(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    too_big = SlurmJob({"hosts": 5}, python_exe=sys.executable, log_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"can never start \(PartitionConfig: the request"):
        too_big.state(cached_path=None)
    assert slurm.job_ids() == []  # cancelled
    with pytest.raises(RuntimeError, match=r"sbatch refused the job \(exit 1\): .*Memory specification"):
        SlurmJob({"hosts": 1}, mem="100000000G", log_dir=str(tmp_path)).apply()
    # The node is busy: our job stays pending until job_start_timeout, then is cancelled.
    busy = slurm.run("sbatch", "--parsable", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 60")
    assert busy.returncode == 0, busy.stderr
    try:
        waiting = SlurmJob(
            {"hosts": 1}, python_exe=sys.executable, log_dir=str(tmp_path), job_start_timeout=1
        )
        with pytest.raises(TimeoutError, match=r"did not start within job_start_timeout=1 s \(PENDING\); it was cancelled"):
            waiting.state(cached_path=None)
        assert slurm.job_ids() == [busy.stdout.strip()]  # ours was cancelled
    finally:
        slurm.run("scancel", busy.stdout.strip().split(";")[0])


LOCAL_THEN_SLURM = """
import json, sys
from regency.actor import this_host
from regency.job import SlurmJob
from tests.jobs.actors import Probe
local = this_host().spawn_procs(per_host={"gpus": 1}, name="local").spawn("local", Probe)
first = local.bump.call_one().get(60)  # Regency runs in this process, on a secret of its own
job = eval(sys.argv[1], {"SlurmJob": SlurmJob})
state = job.state(cached_path=None)  # a notebook that experimented locally takes an allocation
remote = state.hosts.spawn_procs(per_host={"gpus": 1}).spawn("remote", Probe)
where = remote.where.call_one().get(60)
crossed = local.bump_there.call_one(remote).get(60)  # a local proc calls the job's actor
print(json.dumps({"first": first, "job_id": job.job_id, "in_job": where[1], "crossed": crossed}))
job.kill()
"""


def test_slurm_job_after_local_procs_in_one_controller(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["HOME"] = str(tmp_path)  # no per-user secret file: the controller draws its own
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_THEN_SLURM, _spec(tmp_path, _free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2 * T,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["first"] == 1 and result["in_job"] == result["job_id"] is not None
    assert result["crossed"] == 1
    _wait_job_state(slurm, result["job_id"], ENDED)
