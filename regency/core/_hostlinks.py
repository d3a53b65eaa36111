"""Which transport carries the links of a multi-host job.

Workers, the controller's multi-host address and the procs on other hosts all need a transport
that reaches across hosts: ``tcp`` (trio sockets), ``nng+tcp`` or ``nng+tls+tcp``. A job picks
one by configuration (``configure(default_transport=...)``, when that names one of these) or,
failing that, by the scheme of the first worker address it attaches to. Pure functions.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

#: Transports that can carry a link between two hosts, fastest first (docs/transports.md).
HOST_SCHEMES: Final = ("tcp", "nng+tcp", "nng+tls+tcp")


def parse_host_address(address: str, what: str) -> tuple[str, str, int]:
    """Split ``SCHEME://HOST:PORT`` into (scheme, host, port) for a host-reaching scheme.

    ``what`` names the address in the error, e.g. ``"--listen"`` or ``"worker addresses"``.
    """
    shape = f"{what} must look like SCHEME://HOST:PORT with SCHEME one of {HOST_SCHEMES}"
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError:
        raise ValueError(f"{shape} (got {address!r})") from None
    if parts.scheme not in HOST_SCHEMES or parts.hostname is None or port is None:
        raise ValueError(f"{shape} (got {address!r})")
    return parts.scheme, parts.hostname, port


def remote_scheme(default_transport: str, first_worker: str) -> str:
    """The scheme of a job's links between hosts: the configured default transport when it can
    reach another host, else the scheme of the first worker's address."""
    if default_transport in HOST_SCHEMES:
        return default_transport
    scheme, _, _ = parse_host_address(first_worker, "worker addresses")
    return scheme


def host_address(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, with an IPv6 host in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"
