"""Throwaway TLS material for ``nng+tls+tcp`` in tests and benchmarks (needs trustme, a dev
dependency)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import attrs

from ..transports._nng import ENV_CA, ENV_CERT, ENV_KEY


@attrs.frozen
class TlsFiles:
    """PEM files under one directory."""

    #: ``REGENCY_TLS_CERT``, ``REGENCY_TLS_KEY`` and ``REGENCY_TLS_CA`` for a process that
    #: listens on, or dials, any of the names the certificate was made for.
    env: dict[str, str]
    #: A CA that signed none of them: a dialer trusting only it must refuse every listener.
    other_ca: str


def make_tls_files(names: Sequence[str], where: str) -> TlsFiles:
    """Make a CA and one certificate for every host name or IP in ``names``; write them (and
    an unrelated CA) under the directory ``where``."""
    try:
        import trustme
    except ImportError:  # pragma: no cover - trustme is in the dev extra
        raise RuntimeError("make_tls_files needs trustme: pip install 'regency[dev]'") from None
    if not names:
        raise ValueError("make_tls_files needs at least one host name or IP (got none)")
    ca = trustme.CA()
    cert = ca.issue_cert(*names)
    env = {
        ENV_CERT: os.path.join(where, "cert.pem"),
        ENV_KEY: os.path.join(where, "key.pem"),
        ENV_CA: os.path.join(where, "ca.pem"),
    }
    for blob in cert.cert_chain_pems:
        blob.write_to_path(env[ENV_CERT], append=True)
    cert.private_key_pem.write_to_path(env[ENV_KEY])
    ca.cert_pem.write_to_path(env[ENV_CA])
    other_ca = os.path.join(where, "other-ca.pem")
    trustme.CA().cert_pem.write_to_path(other_ca)
    return TlsFiles(env, other_ca)


def nng_tls_unavailable() -> str | None:
    """Why this pynng build cannot do TLS, or None when it can."""
    import pynng

    engine = pynng.ffi.string(pynng.lib.nng_tls_engine_name()).decode()
    if engine in ("", "none"):
        return f"this pynng build has no TLS engine (nng_tls_engine_name() = {engine!r})"
    return None
