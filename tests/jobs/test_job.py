"""regency.job without a scheduler: the job model, ProcessJob, LocalJob, the squeue parser,
the batch script, Kubernetes manifests and the command line."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from regency.actor import HostMesh
from regency.job import (
    LocalJob,
    ProcessJob,
    SlurmJob,
    job_load,
    job_loads,
    kubernetes_manifests,
    kubernetes_worker_addresses,
    parse_squeue_json,
)

from ..conftest import pid_alive

T = 60
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def controller(job: str, state: str, action: str = "exit") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.controller", job, state, action],
        env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def report_of(proc: subprocess.Popen[str]) -> dict[str, dict[str, list[object]]]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(T)
        assert proc.stderr is not None
        raise AssertionError(f"the controller printed nothing: {proc.stderr.read()}")
    result: dict[str, dict[str, list[object]]] = json.loads(line)["meshes"]
    return result


def wait_gone(pids: list[int], within: float) -> None:
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if pid_alive(p)]}"
        time.sleep(0.05)


# -- ProcessJob end to end ------------------------------------------------------------------


@pytest.mark.slow
def test_process_job_state_reuse_release_and_kill(tmp_path: Path) -> None:
    state = str(tmp_path / ".regency" / "job_state.pkl")
    spec = "ProcessJob({'trainers': 2, 'data': 1}, lease=2.0)"
    first = controller(spec, state)
    meshes = report_of(first)
    assert first.wait(T) == 0
    assert [len(m["where"]) for m in meshes.values()] == [2, 1]
    assert meshes["trainers"]["secret_in_env"] == [False, False]
    # The state file holds the job secret: only we may read it.
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(state)).st_mode) == 0o700
    cached = job_load(state)
    assert isinstance(cached, ProcessJob)
    workers = [pid for pid, _ in cached._workers.values()]
    assert len(workers) == 3 and all(pid_alive(p) for p in workers)
    # The first controller's procs died with its clean exit; its workers wait for the next.
    proc_pids = [p for m in meshes.values() for p, *_ in m["where"]]  # type: ignore[misc]
    wait_gone(proc_pids, 10)

    # A second controller with an equal spec reuses the same workers.
    second = controller(spec, state)
    again = report_of(second)
    assert second.wait(T) == 0, second.stderr.read() if second.stderr else ""
    assert [len(m["where"]) for m in again.values()] == [2, 1]
    assert again["trainers"]["bumps"] == [1, 1]  # fresh procs on the same workers
    assert [pid for pid, _ in job_load(state)._workers.values()] == workers  # type: ignore[attr-defined]

    # A different spec cannot run on them: they are released and new ones made.
    third = controller("ProcessJob({'trainers': 1})", state, "kill")
    assert [len(m["where"]) for m in report_of(third).values()] == [1]
    assert third.wait(T) == 0
    wait_gone(workers, 10)


@pytest.mark.slow
def test_a_killed_controller_leaves_no_procs_and_the_workers_serve_the_next(tmp_path: Path) -> None:
    state = str(tmp_path / "state.pkl")
    spec = "ProcessJob({'hosts': 2}, lease=1.0)"
    held = controller(spec, state, "hold")
    procs = [p for p, *_ in report_of(held)["hosts"]["where"]]  # type: ignore[misc]
    assert all(pid_alive(p) for p in procs)
    held.send_signal(signal.SIGKILL)
    held.wait(T)
    wait_gone(procs, 10)  # the lease ran out: every proc of the dead controller is gone
    workers = [pid for pid, _ in job_load(state)._workers.values()]  # type: ignore[attr-defined]
    assert all(pid_alive(p) for p in workers)
    follower = controller(spec, state, "kill")
    assert report_of(follower)["hosts"]["bumps"] == [1, 1]
    assert follower.wait(T) == 0
    wait_gone(workers, 10)


# -- the model, in process ------------------------------------------------------------------


@pytest.mark.slow
def test_state_after_regency_started_here_gets_this_process_secret(tmp_path: Path) -> None:
    from regency.actor import this_host
    from regency.core._controller import current_runtime, derive_secret

    from .actors import Probe

    current_runtime()  # Regency runs in this process now, with the test suite's secret
    local = this_host().spawn_procs(per_host={"gpus": 1}, name="local").spawn("local", Probe)
    job = ProcessJob({"a": 1})
    try:
        state = job.state(cached_path=None)  # one controller, two jobs
        # The job got this process's secret (the suite's REGENCY_SECRET, as it happens).
        assert derive_secret(job._secret) == current_runtime().secret
        remote = state.a.spawn_procs(per_host={"gpus": 1}).spawn("remote", Probe)
        assert remote.bump.call_one().get(T) == 1
        # A proc of one job calls an actor of the other: one secret, every link.
        assert local.bump_there.call_one(remote).get(T) == 2
    finally:
        workers = [pid for pid, _ in job._workers.values()]
        job.kill()
    wait_gone(workers, 10)


CACHED_ELSEWHERE = """
import sys
from regency.actor import this_host
from regency.job import ProcessJob
from tests.jobs.actors import Probe
this_host().spawn_procs().spawn("local", Probe).bump.call_one().get(60)  # Regency starts
try:
    ProcessJob({"a": 1}).state(cached_path=sys.argv[1])
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.slow
def test_a_job_cached_by_another_process_after_regency_started_says_what_to_do(
    tmp_path: Path,
) -> None:
    state = str(tmp_path / "job_state.pkl")
    first = controller("ProcessJob({'a': 1})", state)  # applies and caches, with its secret
    report_of(first)
    assert first.wait(T) == 0
    job = job_load(state)
    try:
        env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
        done = subprocess.run(
            [sys.executable, "-c", CACHED_ELSEWHERE, state], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=T,
        )  # fmt: skip
        assert "was applied by another process, with its own job secret" in done.stdout, (
            done.stdout + done.stderr
        )
        assert "call state() before anything else starts Regency" in done.stdout
    finally:
        job.kill()


LOCAL_CLIENT = """
import json, os
from regency.job import LocalJob, job_load
from tests.jobs.actors import Probe
cached = type(job_load()).__name__
state = LocalJob(hosts=("trainers",)).state()
value = state.trainers.spawn_procs().spawn("p", Probe).bump.call_one().get(60)
with open("out.json", "w") as f:
    json.dump({"batch": os.environ.get("REGENCY_BATCH_JOB"), "cached": cached, "value": value}, f)
"""


@pytest.mark.slow
def test_local_job_batch_mode_runs_the_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    (tmp_path / "client.py").write_text(LOCAL_CLIENT)
    job = LocalJob(hosts=("trainers",))
    job.apply(client_script=f"{sys.executable} client.py")
    assert job.process.wait(T) == 0, list((tmp_path / ".regency" / "logs").glob("*/*"))
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"batch": "1", "cached": "BatchJob", "value": 1}
    with pytest.raises(ValueError, match="runs no batch client"):
        _ = LocalJob().process


def test_local_job_gives_this_host_per_mesh_and_pickles() -> None:
    job = LocalJob(hosts=("trainers", "data"))
    state = job.state(cached_path=None)
    assert isinstance(state.trainers, HostMesh) and isinstance(state.data, HostMesh)
    with pytest.raises(AttributeError, match=r"no mesh named 'eval' \(meshes: trainers, data\)"):
        _ = state.eval
    assert job.active and job.apply_id is not None
    assert list(state.meshes) == ["trainers", "data"] and repr(state).startswith("JobState(")
    again = job.state()  # attached again: new meshes (as Monarch's)
    assert again is not state and list(again.meshes) == ["trainers", "data"]
    copy = job_loads(job.dumps())
    assert isinstance(copy, LocalJob) and copy.active and copy.apply_id == job.apply_id
    job.kill()
    assert not job.active


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ProcessJob({}), "meshes must be a non-empty dict"),
        (lambda: ProcessJob({"a": 0}), "host count of mesh 'a' must be a positive int"),
        (lambda: ProcessJob({"a-b": 1}), "mesh names must be identifiers"),
        (lambda: ProcessJob({"a": 1}, lease=0), "lease must be positive"),
        (lambda: SlurmJob({"a": 1}, port=0), "port must be an int in 1..65535"),
        (lambda: SlurmJob({"a": 1}, port=1, monarch_port=2), "give one"),
        (lambda: SlurmJob({"a": 1}, slurm_args="--exclusive"), "slurm_args must be a list"),
        (lambda: SlurmJob({"a": 1}, slurm_args=["exclusive"]), "each starting with '-'"),
        (lambda: SlurmJob({"a": 1}, gpus_per_node=0), "gpus_per_node must be a positive int"),
        (lambda: SlurmJob({"a": 1}, slurm_args=["--export=NONE"]), "include ALL or REGENCY_SECRET"),
        (lambda: SlurmJob({"a": 1}, mem="1G\n#SBATCH --x"), "mem must be a one-line"),
        (lambda: SlurmJob({"a": 1}, job_start_timeout=-1), "job_start_timeout must be positive"),
        (lambda: LocalJob(hosts="hosts"), "hosts must be a sequence"),
    ],
)
def test_bad_job_specs_are_refused(make: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()  # type: ignore[operator]


def test_apply_refuses_an_empty_client_script() -> None:
    with pytest.raises(ValueError, match="client_script must be a command line"):
        LocalJob().apply(client_script="  ")
    with pytest.raises(ValueError, match="ProcessJob runs no batch client"):
        ProcessJob({"a": 1}).apply(client_script="python x.py")


def test_monarch_port_is_port() -> None:
    job = SlurmJob({"a": 2, "b": 1}, monarch_port=4444, log_dir="/tmp/logs", python_exe="/p y")
    script = job.batch_script()
    assert "#SBATCH --nodes=3" in script
    assert "#SBATCH --exclusive" in script
    assert "srun --nodes=3 --ntasks=3 --ntasks-per-node=1" in script
    assert "'/p y' -c" in script and ":4444" in script
    batch = job.batch_script("python train.py --lr 1")
    assert "-m regency.job._batch --port 4444 --nodes 3 -- 'python train.py --lr 1'" in batch


def test_batch_script_options_and_no_secret() -> None:
    job = SlurmJob(
        {"a": 1}, slurm_args=["--constraint=a100"], time_limit="01:00:00", partition="gpu",
        exclusive=False, gpus_per_node=8, cpus_per_task=4, mem="100G", account="acct",
        qos="high", ntasks_per_node=2, job_name="train",
    )  # fmt: skip
    job._secret = "s3cr3t-value-that-must-not-leak"
    script = job.batch_script()
    for line in (
        "--time=01:00:00", "--partition=gpu", "--gpus-per-node=8", "--cpus-per-task=4",
        "--mem=100G", "--account=acct", "--qos=high", "--ntasks-per-node=2",
        "#SBATCH --constraint=a100", f"--job-name=train_{os.getpid()}",
    ):  # fmt: skip
        assert line in script
    assert "--exclusive" not in script
    assert job._secret not in script


SQUEUE_2205 = {
    "jobs": [
        {"job_id": 7, "job_state": "RUNNING", "job_resources": {
            "nodes": "n[1-2]", "allocated_nodes": [{"nodename": "n1"}, {"nodename": "n2"}]}},
        {"job_id": 8, "job_state": "PENDING", "nodes": ""},
        {"job_id": 9, "job_state": "CANCELLED", "job_resources": {"allocated_nodes": []}},
    ]
}  # fmt: skip
SQUEUE_2302 = {
    "jobs": [
        {"job_id": 7, "job_state": ["RUNNING"],
         "job_resources": {"nodes": {"allocation": [{"name": "a"}, {"name": "b"}]}}},
    ]
}  # fmt: skip


def test_squeue_json_of_both_slurm_generations() -> None:
    text = json.dumps(SQUEUE_2205)
    running = parse_squeue_json(text, "7")
    assert running is not None and running.running and running.nodes == ("n1", "n2")
    pending = parse_squeue_json(text, "8")
    assert pending is not None and not pending.running and pending.nodes == ()
    assert not pending.finished
    cancelled = parse_squeue_json(text, "9")
    assert cancelled is not None and cancelled.finished
    assert parse_squeue_json(text, "70") is None
    new = parse_squeue_json(json.dumps(SQUEUE_2302), "7")
    assert new is not None and new.running and new.nodes == ("a", "b")
    with pytest.raises(ValueError, match="not JSON"):
        parse_squeue_json("squeue: error: x", "7")


def test_kubernetes_manifests_and_addresses() -> None:
    text = kubernetes_manifests({"trainers": 4, "data_loaders": 1}, "ghcr.io/me/train:1", gpus_per_host=8)
    docs = text.split("\n---\n")
    assert len(docs) == 4
    assert [d.split("kind: ")[1].split("\n")[0] for d in docs] == [
        "Service", "StatefulSet", "Service", "StatefulSet",
    ]  # fmt: skip
    assert "replicas: 4" in docs[1] and "replicas: 1" in docs[3]
    assert "clusterIP: None" in docs[0]
    assert "secretKeyRef: {name: \"regency-job-secret\", key: secret}" in docs[1]
    assert "nvidia.com/gpu: 8" in docs[1]
    assert '"regency-data-loaders"' in docs[2]
    addresses = kubernetes_worker_addresses({"trainers": 2})
    assert addresses == {
        "trainers": [
            f"tcp://regency-trainers-{i}.regency-trainers.default.svc.cluster.local:7700"
            for i in range(2)
        ]
    }
    # The worker's address in the manifest is the one the controller dials.
    assert "tcp://%s.regency-trainers.default.svc.cluster.local:7700" in docs[1]
    with pytest.raises(ValueError, match="must be a DNS label"):
        kubernetes_manifests({"a": 1}, "img", namespace="Bad_NS")
    with pytest.raises(ValueError, match="image must name a container image"):
        kubernetes_manifests({"a": 1}, "")


def test_cli_kubernetes_and_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from regency.__main__ import main

    monkeypatch.chdir(tmp_path)

    def regency(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = regency("kubernetes", "--image", "img:1", "--mesh", "trainers=2")
    assert code == 0 and "kind: StatefulSet" in out
    code, _, err = regency("kubernetes", "--image", "img:1", "--mesh", "trainers")
    assert code == 2 and "--mesh takes NAME=HOSTS" in err
    code, _, err = regency("kill")
    assert code == 2
    assert "no applied job in .regency/job_state.pkl: run `regency apply module:attr` first" in err
    code, _, err = regency("exec", "--", "true")
    assert code == 2 and "no applied job" in err
    code, _, err = regency("exec")
    assert code == 2 and "give the command to run" in err
    code, _, err = regency("apply", "nosuchmodule:job")
    assert code == 2 and "cannot import 'nosuchmodule'" in err
    (tmp_path / "notajob.py").write_text("job = 3\n")
    code, _, err = regency("apply", "notajob:job")
    assert code == 2 and "must be a regency.job.JobTrait" in err
    code, _, err = regency("apply", "notajob")
    assert code == 2 and "module:attr" in err


@pytest.mark.slow
def test_cli_contexts_hold_one_applied_job_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from regency.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ctxjobs.py").write_text(
        "from regency.job import ProcessJob\none = ProcessJob({'h': 1})\n"
    )

    def regency(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    assert regency("context", "ls") == (0, "No contexts.\n", "")
    assert regency("context", "use", "first")[:2] == (0, "Switched to context 'first'\n")
    code, out, err = regency("apply", "ctxjobs:one")
    assert code == 0, err
    assert os.path.islink(".regency/job_state.pkl")  # the state went into the context
    [(worker, _)] = job_load(".regency/first/state.pkl")._workers.values()  # type: ignore[attr-defined]
    assert pid_alive(worker)
    assert regency("context", "create", "second")[0] == 0
    assert regency("context", "use", "second")[0] == 0
    assert regency("context", "ls")[1] == "  first\n* second\n"
    assert oct(os.stat(".regency/second").st_mode & 0o777) == "0o700"
    # `kill NAME` ends that context's job, whichever is active.
    code, out, err = regency("kill", "first")
    assert code == 0 and "killed the job in .regency/first/state.pkl" in out, err
    wait_gone([worker], 10)
    try:
        os.waitpid(worker, 0)  # `apply` started it from this process: reap it
    except ChildProcessError:
        pass
    assert regency("context", "rm", "second")[1] == "Removed context 'second'\n"
    assert os.readlink(".regency/job_state.pkl") == os.path.join("default", "state.pkl")
    code, _, err = regency("context", "use", "../elsewhere")
    assert code == 2 and "a context name must be a plain directory name" in err
    code, _, err = regency("context", "rm", "nosuch")
    assert code == 2 and "there is no context 'nosuch'" in err
    code, _, err = regency("context")
    assert code == 2 and "give an action" in err


@pytest.mark.slow
def test_cli_exec_point_per_host_script_module_and_kill(tmp_path: Path) -> None:
    (tmp_path / "execjobs.py").write_text(
        "from regency.job import ProcessJob\ntwo = ProcessJob({'hosts': 2})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])

    def regency(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "regency", *args], cwd=tmp_path, env=env, input=stdin,
            capture_output=True, text=True, timeout=T,
        )  # fmt: skip

    applied = regency("apply", "execjobs:two")
    assert applied.returncode == 0, applied.stderr
    workers = [pid for pid, _ in job_load(str(tmp_path / ".regency/job_state.pkl"))._workers.values()]  # type: ignore[attr-defined]
    try:
        shown = "echo $REGENCY_RANK_HOSTS $REGENCY_RANK_GPUS $REGENCY_SIZE_GPUS"
        one = regency("exec", "--per-host", "gpus=2", "--point", "hosts=1,gpus=1", "--", "sh", "-c", shown)
        assert one.returncode == 0, one.stderr
        assert one.stdout == "[hosts=1,gpus=1] 1 1 2\n"  # one proc: the point's
        script = regency("exec", "--script", "-", "x", stdin='echo "$0 $1 $REGENCY_RANK_HOSTS"\nexit 3\n')
        assert script.returncode == 3
        assert sorted(script.stdout.splitlines()) == [
            "[hosts=0] regency-exec x 0", "[hosts=1] regency-exec x 1",
        ]  # fmt: skip
        module = regency("exec", "--point", "hosts=0", "-m", "platform")
        assert module.returncode == 0 and module.stdout.startswith("[hosts=0] "), module.stderr
        assert module.stdout.count("\n") == 1
        bad = regency("exec", "--point", "racks=1", "--", "true")
        assert bad.returncode == 2 and "point names dims ['racks']" in bad.stderr
        bad = regency("exec", "--per-host", "gpus", "--", "true")
        assert bad.returncode == 2 and "--per-host takes DIM=N" in bad.stderr
        killed = regency("exec", "--kill", "--", "true")
        assert killed.returncode == 0, killed.stderr
        assert "killed the job in .regency/job_state.pkl" in killed.stdout
        assert not (tmp_path / ".regency/job_state.pkl").exists()
        wait_gone(workers, 10)
    finally:
        for pid in workers:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_new_proc_mesh_on_a_host_after_one_of_its_procs_died() -> None:
    """Monarch's users hit this on Kubernetes: the host stays usable after a proc dies."""
    from ..conftest import root_failures
    from .actors import Probe

    job = ProcessJob({"hosts": 1})
    try:
        hosts = job.state(cached_path=None).hosts
        first = hosts.spawn_procs(per_host={"gpus": 2}, name="dying").spawn("first", Probe)
        pids = [pid for pid, *_ in first.where.call().get(T).values()]
        os.kill(pids[0], signal.SIGKILL)
        root_failures.wait_for("first")
        again = hosts.spawn_procs(per_host={"gpus": 2}, name="again").spawn("again", Probe)
        assert again.bump.call().get(T).values() == [1, 1]
    finally:
        workers = [pid for pid, _ in job._workers.values()]
        job.kill()
    wait_gone(workers, 10)


@pytest.mark.slow
def test_host_mesh_stop_keeps_the_workers_for_the_next_attach() -> None:
    from regency.actor import attach_to_workers

    from .actors import Probe

    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        probes = hosts.spawn_procs(per_host={"gpus": 1}, name="before").spawn("before", Probe)
        procs = [pid for pid, *_ in probes.where.call().get(T).values()]
        hosts.stop().get(T)  # our procs end; the workers stay (shutdown() would end them)
        wait_gone(procs, 10)
        workers = [pid for pid, _ in job._workers.values()]
        assert all(pid_alive(pid) for pid in workers)
        again = attach_to_workers(
            [address for _, address in job._workers.values()], job._secret, name="again"
        )
        assert again.spawn_procs(name="after").spawn("after", Probe).bump.call().get(T).values() == [1, 1]
    finally:
        workers = [pid for pid, _ in job._workers.values()]
        job.kill()
    wait_gone(workers, 10)
