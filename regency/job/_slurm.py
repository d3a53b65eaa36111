"""SlurmJob: one sbatch allocation, one ``run_worker_loop_forever`` worker per node.

``apply()`` draws a job secret, pipes a batch script to ``sbatch`` with the secret in
sbatch's environment only (sbatch exports it to the job: it is on no command line and not in
the script), and records the job id. ``state()`` polls ``squeue --json`` until the job runs,
splits its nodes across the meshes in the spec's order and attaches to the workers at
``tcp://NODE:PORT``. ``kill()`` runs ``scancel``.

Slurm 22.05's ``squeue --json`` ignores ``-j`` (it lists every job slurmctld remembers), gives
``job_state`` as a string (a list from 23.02 on) and no ``job_resources`` while pending; the
parser below takes both forms and filters by id.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import attrs

from ..core._hosts import attach_to_workers, new_job_passphrase
from ._job import DEFAULT_STATE_PATH, BatchJob, JobState, JobTrait, in_batch_job, log
from ._local import check_meshes

#: States after which a job never runs again.
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT",
    }
)  # fmt: skip

#: The worker each node runs: its address is the node's name as Slurm knows it, which is
#: what squeue reports to the controller.
WORKER_BOOTSTRAP = (
    "import os; from regency.actor import run_worker_loop_forever; "
    "run_worker_loop_forever(address='tcp://%s:{port}' % os.environ['SLURMD_NODENAME'], "
    "ca='trust_all_connections')"
)


#: Pending reasons that no amount of waiting resolves (the request does not fit the partition,
#: the account or the QOS): waiting for these would wait forever.
HOPELESS_REASONS = frozenset(
    {
        "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
        "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
    }
)  # fmt: skip


@attrs.frozen
class SlurmJobInfo:
    """What ``squeue --json`` says about one job."""

    job_id: str
    states: tuple[str, ...]
    nodes: tuple[str, ...]  # allocated node names, in allocation order; () while pending
    reason: str = ""  # why it is pending ("Resources", "Priority", ...), "" or "None" else

    @property
    def running(self) -> bool:
        return "RUNNING" in self.states

    @property
    def finished(self) -> bool:
        return bool(TERMINAL_STATES.intersection(self.states)) or "COMPLETING" in self.states


def parse_squeue_json(text: str, job_id: str) -> SlurmJobInfo | None:
    """The entry for ``job_id`` in ``squeue --json`` output, None when slurmctld has
    forgotten the job."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"squeue --json printed something that is not JSON ({exc}): {text[:200]!r}") from None
    for job in data.get("jobs", ()):
        if str(job.get("job_id")) != job_id:
            continue
        raw = job.get("job_state", ())
        states = (raw,) if isinstance(raw, str) else tuple(str(s) for s in raw)
        resources = job.get("job_resources") or {}
        allocated = resources.get("allocated_nodes") or ()
        if isinstance(allocated, list):
            nodes = tuple(str(n.get("nodename") or n.get("name")) for n in allocated)
        else:
            nodes = ()
        if not nodes:
            # 23.02+: job_resources.nodes.allocation[].name
            node_info = resources.get("nodes")
            if isinstance(node_info, dict):
                nodes = tuple(str(n["name"]) for n in node_info.get("allocation", ()))
        return SlurmJobInfo(job_id, states, nodes, str(job.get("state_reason") or ""))
    return None


def parse_sbatch_output(text: str) -> str:
    """The job id from ``sbatch --parsable`` ("123" or "123;cluster")."""
    first = text.strip().split(";")[0]
    if not first.isdigit():
        raise RuntimeError(f"sbatch printed no job id (expected '123' or '123;cluster', got {text!r})")
    return first


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(
            f"SlurmJob needs the Slurm client command {name!r} on PATH (Debian: apt install "
            "slurm-client; SLURM_CONF must point at the cluster's slurm.conf)"
        )
    return path


def _opt_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"SlurmJob: {what} must be a positive int or None (got {value!r})")
    return value


def _opt_str(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise ValueError(f"SlurmJob: {what} must be a one-line non-empty str or None (got {value!r})")
    return value


class SlurmJob(JobTrait):
    """Monarch's SlurmJob: ``meshes`` maps mesh names to node counts; one allocation holds
    every mesh. ``port`` (Monarch: ``monarch_port``) is where each node's worker listens.
    ``slurm_args`` are extra sbatch options (each starting with ``-``)."""

    def __init__(
        self,
        meshes: dict[str, int],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        port: int = 22222,
        job_name: str = "regency_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
        *,
        monarch_port: int | None = None,
        lease: float = 10.0,
    ) -> None:
        super().__init__()
        self._meshes = check_meshes(meshes, "SlurmJob")
        if monarch_port is not None:
            if port not in (22222, monarch_port):
                raise ValueError(
                    f"SlurmJob: port and monarch_port name the same thing; give one "
                    f"(got port={port}, monarch_port={monarch_port})"
                )
            port = monarch_port
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"SlurmJob: port must be an int in 1..65535 (got {port!r})")
        if isinstance(slurm_args, str) or not all(
            isinstance(a, str) and a.startswith("-") and "\n" not in a for a in slurm_args
        ):
            raise ValueError(
                "SlurmJob: slurm_args must be a list of sbatch options, each starting with "
                f"'-', e.g. ['--constraint=a100'] (got {slurm_args!r})"
            )
        for arg in slurm_args:
            if arg.startswith("--export=") and not any(
                v in ("ALL", "REGENCY_SECRET") for v in arg.split("=", 1)[1].split(",")
            ):
                raise ValueError(
                    "SlurmJob: an --export in slurm_args must pass the job secret to the "
                    f"workers: include ALL or REGENCY_SECRET (got {arg!r})"
                )
        if not isinstance(exclusive, bool):
            raise TypeError(f"SlurmJob: exclusive must be a bool (got {exclusive!r})")
        if job_start_timeout is not None and (
            not isinstance(job_start_timeout, int | float) or job_start_timeout <= 0
        ):
            raise ValueError(
                f"SlurmJob: job_start_timeout must be positive seconds or None (got {job_start_timeout!r})"
            )
        self._python_exe = _opt_str(python_exe, "python_exe") or "python"
        self._slurm_args = tuple(slurm_args)
        self._port = port
        self._job_name = _opt_str(job_name, "job_name") or "regency_job"
        self._ntasks_per_node = _opt_int(ntasks_per_node, "ntasks_per_node") or 1
        self._time_limit = _opt_str(time_limit, "time_limit")
        self._partition = _opt_str(partition, "partition")
        self._log_dir = os.path.abspath(_opt_str(log_dir, "log_dir") or os.getcwd())
        self._exclusive = exclusive
        self._gpus_per_node = _opt_int(gpus_per_node, "gpus_per_node")
        self._cpus_per_task = _opt_int(cpus_per_task, "cpus_per_task")
        self._mem = _opt_str(mem, "mem")
        self._job_start_timeout = job_start_timeout
        self._account = _opt_str(account, "account")
        self._qos = _opt_str(qos, "qos")
        if not isinstance(lease, int | float) or isinstance(lease, bool) or lease <= 0:
            raise ValueError(f"SlurmJob: lease must be positive seconds (got {lease!r})")
        #: Seconds a worker keeps our procs without hearing from us (a dead controller's
        #: procs die after this); not part of the spec.
        self._lease = float(lease)
        self._secret = ""
        self._job_id: str | None = None
        self._nodes: tuple[str, ...] = ()

    # -- the spec ------------------------------------------------------------------------

    def _spec(self) -> tuple[Any, ...]:
        return (
            self._meshes, self._python_exe, self._slurm_args, self._port, self._job_name,
            self._ntasks_per_node, self._time_limit, self._partition, self._exclusive,
            self._gpus_per_node, self._cpus_per_task, self._mem, self._account, self._qos,
        )  # fmt: skip

    @property
    def job_id(self) -> str | None:
        """The Slurm job id (of the cached job this spec reuses, if so; in batch mode inside
        the allocation: ``$SLURM_JOB_ID``)."""
        running = self._running
        if running is not None and running is not self:
            inner = running.job if isinstance(running, BatchJob) else running
            if isinstance(inner, SlurmJob) and inner is not self:
                return inner.job_id
        if self._job_id is not None:
            return self._job_id
        return os.environ.get("SLURM_JOB_ID") if in_batch_job() else None

    @property
    def nodes(self) -> int:
        return sum(self._meshes.values())

    def batch_script(self, client_script: str | None = None) -> str:
        """The script ``apply()`` pipes to sbatch."""
        name = f"{self._job_name}_{os.getpid()}"
        out = os.path.join(self._log_dir, f"slurm_%j_{name}")
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --nodes={self.nodes}",
            f"#SBATCH --ntasks-per-node={self._ntasks_per_node}",
            f"#SBATCH --output={out}.out",
            f"#SBATCH --error={out}.err",
        ]
        for flag, value in (
            ("--time", self._time_limit),
            ("--partition", self._partition),
            ("--gpus-per-node", self._gpus_per_node),
            ("--cpus-per-task", self._cpus_per_task),
            ("--mem", self._mem),
            ("--account", self._account),
            ("--qos", self._qos),
        ):
            if value is not None:
                lines.append(f"#SBATCH {flag}={value}")
        if self._exclusive:
            lines.append("#SBATCH --exclusive")
        lines.extend(f"#SBATCH {arg}" for arg in self._slurm_args)
        python = shlex.quote(self._python_exe)
        if client_script is None:
            worker = WORKER_BOOTSTRAP.format(port=self._port)
            lines.append(
                f"exec srun --nodes={self.nodes} --ntasks={self.nodes} --ntasks-per-node=1 "
                f"--kill-on-bad-exit=0 {python} -c {shlex.quote(worker)}"
            )
        else:
            lines.append(
                f"exec {python} -m regency.job._batch --port {self._port} "
                f"--nodes {self.nodes} -- {shlex.quote(client_script)}"
            )
        return "\n".join(lines) + "\n"

    # -- JobTrait ------------------------------------------------------------------------

    def _create(self, client_script: str | None) -> None:
        sbatch = _tool("sbatch")
        # Applied after Regency started here: this process's secret (one controller, several
        # jobs); else a fresh one, which this process adopts when it attaches.
        self._secret = new_job_passphrase()
        self._nodes = ()
        if client_script is not None:
            # The client inside the allocation finds this and attaches to its own job.
            BatchJob(self).dump(DEFAULT_STATE_PATH)
        os.makedirs(self._log_dir, exist_ok=True)
        script = self.batch_script(client_script)
        done = subprocess.run(
            [sbatch, "--parsable"],
            input=script,
            capture_output=True,
            text=True,
            env={**os.environ, "REGENCY_SECRET": self._secret},
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch refused the job (exit {done.returncode}): {done.stderr.strip()}")
        self._job_id = parse_sbatch_output(done.stdout)
        if client_script is not None:
            # Again, with the job id, so that `regency kill` here can cancel it (atomic: the
            # client may be reading it already; either version leads it to this job).
            BatchJob(self).dump(DEFAULT_STATE_PATH)
        log.info(
            "submitted Slurm job %s (%d nodes); logs: %s",
            self._job_id, self.nodes, os.path.join(self._log_dir, f"slurm_{self._job_id}_*"),
        )  # fmt: skip

    def info(self) -> SlurmJobInfo | None:
        """The job as ``squeue --json`` shows it now; None when unknown or forgotten."""
        job_id = self.job_id
        if job_id is None:
            return None
        done = subprocess.run(
            [_tool("squeue"), "--json"], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"squeue --json failed (exit {done.returncode}): {done.stderr.strip()}")
        return parse_squeue_json(done.stdout, job_id)

    def _wait_running(self) -> tuple[str, ...]:
        job_id = self.job_id
        if job_id is None:
            raise RuntimeError("this SlurmJob has not been applied: call apply() or state()")
        timeout = self._job_start_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            info = self.info()
            if info is None:
                raise RuntimeError(f"Slurm job {job_id} is not in the queue any more (it ended)")
            if info.finished:
                raise RuntimeError(f"Slurm job {job_id} ended ({'+'.join(info.states)}) before it ran")
            if "PENDING" in info.states and info.reason in HOPELESS_REASONS:
                self._kill()
                raise RuntimeError(
                    f"Slurm job {job_id} can never start ({info.reason}: the request does not "
                    "fit the partition, account or QOS); it was cancelled"
                )
            if info.running and info.nodes:
                if len(info.nodes) != self.nodes:
                    raise RuntimeError(
                        f"Slurm job {job_id} runs on {len(info.nodes)} nodes, expected {self.nodes}"
                    )
                return info.nodes
            if deadline is not None and time.monotonic() > deadline:
                self._kill()
                raise TimeoutError(
                    f"Slurm job {job_id} did not start within job_start_timeout={timeout} s "
                    f"({'+'.join(info.states)}); it was cancelled"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def _state(self) -> JobState:
        if not self._nodes:
            self._nodes = self._wait_running()
        meshes = {}
        at = 0
        for mesh, count in self._meshes.items():
            names = self._nodes[at : at + count]
            at += count
            meshes[mesh] = attach_to_workers(
                [f"tcp://{node}:{self._port}" for node in names],
                self._secret,
                name=mesh,
                lease=self._lease,
            )
        return JobState(meshes)

    def can_run(self, spec: JobTrait) -> bool:
        if not isinstance(spec, SlurmJob) or spec._spec() != self._spec():
            return False
        info = self.info()
        return info is not None and not info.finished

    def _kill(self) -> None:
        job_id = self.job_id
        if job_id is None or in_batch_job():
            return
        done = subprocess.run(
            [_tool("scancel"), job_id], capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            log.warning("scancel %s failed: %s", job_id, done.stderr.strip())
        self._job_id = None
        self._nodes = ()
