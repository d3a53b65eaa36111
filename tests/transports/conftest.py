"""Fixtures of the transport tests: a private socket directory, and TLS material for the
``nng+tls+tcp`` tests.

The nng backend reads its certificates from ``REGENCY_TLS_CERT``, ``REGENCY_TLS_KEY`` and
``REGENCY_TLS_CA`` when ``open_transport`` gets no ``tls=``; this publishes a throwaway CA and a
server certificate for 127.0.0.1/localhost there for the whole session.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
import trustme

from regency.testing import nng_tls_unavailable
from regency.transports._nng import ENV_CA, ENV_CERT, ENV_KEY


@pytest.fixture
def sockdir() -> Iterator[str]:
    """A private (0700) directory for unix-socket and ipc addresses, as a job's is."""
    with tempfile.TemporaryDirectory(prefix="regency-test-") as d:
        os.chmod(d, 0o700)
        yield d


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = nng_tls_unavailable()
    if reason is None:
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "tls" in str(callspec.params.get("kind", "")):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def tls_environment() -> Iterator[dict[str, str]]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    with tempfile.TemporaryDirectory(prefix="regency-tls-") as d:
        paths = {
            ENV_CERT: os.path.join(d, "server.pem"),
            ENV_KEY: os.path.join(d, "server.key"),
            ENV_CA: os.path.join(d, "ca.pem"),
        }
        for blob in server.cert_chain_pems:
            blob.write_to_path(paths[ENV_CERT], append=True)
        server.private_key_pem.write_to_path(paths[ENV_KEY])
        ca.cert_pem.write_to_path(paths[ENV_CA])
        saved = {name: os.environ.get(name) for name in paths}
        os.environ.update(paths)
        try:
            yield paths
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
