"""Helpers for testing programs built on Regency."""

from ._netns import VirtualHost, virtual_hosts, virtual_hosts_available
from ._sim import Simulated, fault_schedules, simulated_fixture

__all__ = [
    "Simulated",
    "VirtualHost",
    "fault_schedules",
    "simulated_fixture",
    "virtual_hosts",
    "virtual_hosts_available",
]
