"""Which transport links hosts: address parsing and the job's choice (pure)."""

from __future__ import annotations

import pytest

from regency.core._hostlinks import HOST_SCHEMES, host_address, parse_host_address, remote_scheme


@pytest.mark.parametrize("scheme", HOST_SCHEMES)
def test_every_host_scheme_parses(scheme: str) -> None:
    assert parse_host_address(f"{scheme}://10.0.0.12:7700", "--listen") == (
        scheme,
        "10.0.0.12",
        7700,
    )
    assert parse_host_address(f"{scheme}://[::1]:7700", "--listen") == (scheme, "::1", 7700)


@pytest.mark.parametrize(
    "address",
    ["unix:///tmp/w.sock", "nng+ipc:///tmp/w", "tcp://10.0.0.1", "nng+tcp://:7700", "10.0.0.1:7700",
     "tcp://10.0.0.1:notaport"],
)
def test_other_addresses_are_refused_naming_the_schemes(address: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_host_address(address, "worker addresses")
    assert str(info.value) == (
        "worker addresses must look like SCHEME://HOST:PORT with SCHEME one of "
        f"('tcp', 'nng+tcp', 'nng+tls+tcp') (got {address!r})"
    )


def test_the_configured_transport_wins_when_it_reaches_other_hosts() -> None:
    assert remote_scheme("nng+tls+tcp", "tcp://10.0.0.12:7700") == "nng+tls+tcp"
    assert remote_scheme("tcp", "nng+tcp://10.0.0.12:7700") == "tcp"
    # unix and nng+ipc cannot: the first worker's scheme decides.
    assert remote_scheme("unix", "nng+tcp://10.0.0.12:7700") == "nng+tcp"
    assert remote_scheme("nng+ipc", "nng+tls+tcp://10.0.0.12:7700") == "nng+tls+tcp"


def test_host_address_brackets_ipv6() -> None:
    assert host_address("nng+tcp", "::1", 0) == "nng+tcp://[::1]:0"
    assert host_address("tcp", "10.0.0.1", 7700) == "tcp://10.0.0.1:7700"
