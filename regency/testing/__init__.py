"""Helpers for testing programs built on Regency."""

from ._netns import VirtualHost, virtual_hosts, virtual_hosts_available
from ._sim import Simulated, fault_schedules, simulated_fixture
from ._slurm import SlurmCluster, SlurmUnavailable, slurm_cluster

__all__ = [
    "Simulated",
    "SlurmCluster",
    "SlurmUnavailable",
    "VirtualHost",
    "fault_schedules",
    "simulated_fixture",
    "slurm_cluster",
    "virtual_hosts",
    "virtual_hosts_available",
]
