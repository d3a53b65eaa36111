"""Jobs: get hosts from a scheduler and attach to them (Monarch's ``monarch.job``).

A job spec names meshes and how many hosts each needs; ``job.state()`` applies it (or reuses
a live cached allocation) and returns one ``HostMesh`` per mesh. See docs/jobs.md.
"""

from ._current import DEFAULT_JOB_PATH, load_current_job, set_current_job
from ._exec import exec_command
from ._hosts_from_config import hosts_from_config
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
from ._service_identity import (
    SERVICE_PROC_IDS_ENV,
    SERVICE_PROC_RANK_ENV,
    deserialize_service_proc_ids,
    new_service_proc_id,
    ranked_service_proc_id_from_env,
    serialize_service_proc_ids,
    service_proc_addr,
    service_proc_addrs,
)
from ._shell import shell
from ._slurm import SlurmJob, SlurmJobInfo, parse_squeue_json
from ._ssh import SSHJob

__all__ = [
    "BATCH_ENV",
    "DEFAULT_JOB_PATH",
    "DEFAULT_STATE_PATH",
    "SERVICE_PROC_IDS_ENV",
    "SERVICE_PROC_RANK_ENV",
    "BatchJob",
    "JobState",
    "JobTrait",
    "LocalJob",
    "PortForwarder",
    "ProcessJob",
    "SSHJob",
    "SlurmJob",
    "SlurmJobInfo",
    "deserialize_service_proc_ids",
    "exec_command",
    "hosts_from_config",
    "in_batch_job",
    "job_load",
    "job_loads",
    "kubernetes_manifests",
    "kubernetes_worker_addresses",
    "load_current_job",
    "new_service_proc_id",
    "parse_squeue_json",
    "ranked_service_proc_id_from_env",
    "serialize_service_proc_ids",
    "service_proc_addr",
    "service_proc_addrs",
    "set_current_job",
    "shell",
]
