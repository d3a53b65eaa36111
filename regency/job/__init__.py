"""Jobs: get hosts from a scheduler and attach to them (Monarch's ``monarch.job``).

A job spec names meshes and how many hosts each needs; ``job.state()`` applies it (or reuses
a live cached allocation) and returns one ``HostMesh`` per mesh. See docs/jobs.md.
"""

from ._exec import exec_command
from ._job import (
    BATCH_ENV,
    DEFAULT_STATE_PATH,
    BatchJob,
    JobState,
    JobTrait,
    in_batch_job,
    job_load,
    job_loads,
)
from ._kubernetes import kubernetes_manifests, kubernetes_worker_addresses
from ._local import LocalJob, ProcessJob
from ._port_forward import PortForwarder
from ._shell import shell
from ._slurm import SlurmJob, SlurmJobInfo, parse_squeue_json

__all__ = [
    "BATCH_ENV",
    "DEFAULT_STATE_PATH",
    "BatchJob",
    "JobState",
    "JobTrait",
    "LocalJob",
    "PortForwarder",
    "ProcessJob",
    "SlurmJob",
    "SlurmJobInfo",
    "exec_command",
    "in_batch_job",
    "job_load",
    "job_loads",
    "kubernetes_manifests",
    "kubernetes_worker_addresses",
    "parse_squeue_json",
    "shell",
]
