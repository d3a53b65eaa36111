"""Helpers for testing programs built on Regency."""

from ._netns import VirtualHost, virtual_hosts, virtual_hosts_available
from ._readable import RealThreads, ThreadWorld, check_thread_reads
from ._sim import Simulated, fault_schedules, simulated_fixture
from ._slurm import SlurmCluster, SlurmUnavailable, slurm_cluster
from ._tls import TlsFiles, make_tls_files, nng_tls_unavailable
from ._waiting import check_waiter

__all__ = [
    "RealThreads",
    "Simulated",
    "SlurmCluster",
    "SlurmUnavailable",
    "ThreadWorld",
    "TlsFiles",
    "VirtualHost",
    "check_thread_reads",
    "check_waiter",
    "fault_schedules",
    "make_tls_files",
    "nng_tls_unavailable",
    "simulated_fixture",
    "slurm_cluster",
    "virtual_hosts",
    "virtual_hosts_available",
]
