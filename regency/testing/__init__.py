"""Helpers for testing programs built on Regency."""

from ._netns import VirtualHost, virtual_hosts, virtual_hosts_available

__all__ = ["VirtualHost", "virtual_hosts", "virtual_hosts_available"]
