"""Certificates for multi-host tests over ``nng+tls+tcp``, made for the test with trustme."""

from __future__ import annotations

import pathlib

import attrs
import trustme

from regency.testing import VirtualHost
from regency.transports._nng import ENV_CA, ENV_CERT, ENV_KEY


@attrs.frozen
class TlsFiles:
    #: REGENCY_TLS_CERT, _KEY and _CA for a process on any of the virtual hosts.
    env: dict[str, str]
    #: A CA that signed none of them (a dialer trusting only it must refuse every listener).
    other_ca: str


def make_tls_files(machines: list[VirtualHost], where: pathlib.Path) -> TlsFiles:
    """One CA, one certificate naming every virtual host's IP and this namespace's (the
    bridge, ``.1`` of the same subnet), written under ``where``."""
    ca = trustme.CA()
    subnet = machines[0].ip.rsplit(".", 1)[0]
    cert = ca.issue_cert(f"{subnet}.1", *(m.ip for m in machines))
    env = {ENV_CERT: str(where / "cert.pem"), ENV_KEY: str(where / "key.pem"),
           ENV_CA: str(where / "ca.pem")}
    for blob in cert.cert_chain_pems:
        blob.write_to_path(env[ENV_CERT], append=True)
    cert.private_key_pem.write_to_path(env[ENV_KEY])
    ca.cert_pem.write_to_path(env[ENV_CA])
    other = where / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    return TlsFiles(env, str(other))


def nng_tls_unavailable() -> str | None:
    """Why this pynng build cannot do TLS, or None when it can."""
    import pynng

    engine = pynng.ffi.string(pynng.lib.nng_tls_engine_name()).decode()
    if engine in ("", "none"):
        return f"this pynng build has no TLS engine (nng_tls_engine_name() = {engine!r})"
    return None
