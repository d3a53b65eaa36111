"""Challenge-response handshake on the job secret.

Every stream connection starts with this exchange before any frame is accepted, so nothing
from a peer that does not know the secret is ever unpickled. Both sides prove knowledge of the
secret (mutual authentication): the dialer never sends payload to an impostor either.

    server -> client   MAGIC  version  nonce_s(32)
    client -> server   MAGIC  version  nonce_c(32)  HMAC(secret, "c" nonce_s nonce_c)
    server -> client   HMAC(secret, "s" nonce_c nonce_s)

``version`` is :data:`WIRE_VERSION`, one byte: peers of different versions refuse each other in
the handshake with :class:`VersionMismatch`, naming both versions, instead of misreading each
other's frames later.

The module is pure: it builds and checks messages; the transports do the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

MAGIC = b"RGCY"
#: The version of everything that travels after the handshake: the frame layouts of
#: :mod:`regency.core._codec` and the transports' framing. Bump it with any change a peer of
#: the previous version would misread; ``tests/core/test_wire_version.py`` fails on a layout
#: change that did not.
#: 1: up to session 5; 2: compact calls and replies (binary headers, cached routes).
WIRE_VERSION = 2
#: What every greeting and proof starts with.
PREFIX = MAGIC + bytes((WIRE_VERSION,))
NONCE_BYTES = 32
MAC_BYTES = 32
SERVER_HELLO_BYTES = len(PREFIX) + NONCE_BYTES
CLIENT_PROOF_BYTES = len(PREFIX) + NONCE_BYTES + MAC_BYTES
SERVER_PROOF_BYTES = MAC_BYTES
#: Seconds a peer gets to finish the handshake before the connection is dropped.
HANDSHAKE_TIMEOUT = 10.0


class VersionMismatch(ValueError):
    """The peer is a Regency process of another wire version: retrying cannot help."""


def _check_prefix(message: bytes, size: int, what: str) -> None:
    if len(message) != size or not message.startswith(MAGIC):
        raise ValueError(f"peer is not a Regency endpoint (bad {what})")
    theirs = message[len(MAGIC)]
    if theirs != WIRE_VERSION:
        raise VersionMismatch(
            f"peer speaks Regency wire version {theirs}, this process speaks version "
            f"{WIRE_VERSION}: every process of a job must run the same Regency release"
        )


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()


def server_hello() -> tuple[bytes, bytes]:
    """Return (message to send, server nonce)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return PREFIX + nonce, nonce


def client_proof(secret: bytes, hello: bytes) -> tuple[bytes, bytes]:
    """Answer a server hello; return (message to send, client nonce).

    Raises ValueError when ``hello`` is not a Regency server hello, :class:`VersionMismatch`
    when it is one of another wire version.
    """
    _check_prefix(hello, SERVER_HELLO_BYTES, "handshake greeting")
    nonce_s = hello[len(PREFIX) :]
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    return PREFIX + nonce_c + _mac(secret, b"c", nonce_s, nonce_c), nonce_c


def check_client_proof(secret: bytes, nonce_s: bytes, proof: bytes) -> bytes:
    """Verify a client's proof; return the server's proof to send back.

    Raises ValueError naming what was wrong.
    """
    _check_prefix(proof, CLIENT_PROOF_BYTES, "handshake proof")
    nonce_c = proof[len(PREFIX) : len(PREFIX) + NONCE_BYTES]
    mac = proof[len(PREFIX) + NONCE_BYTES :]
    if not hmac.compare_digest(mac, _mac(secret, b"c", nonce_s, nonce_c)):
        raise ValueError("peer does not know the job secret")
    return _mac(secret, b"s", nonce_c, nonce_s)


def client_nonce_of(proof: bytes) -> bytes:
    """The client's nonce in a (checked) client proof: with the server's nonce, the salt of
    the connection's frame keys (:mod:`._protect`)."""
    return proof[len(PREFIX) : len(PREFIX) + NONCE_BYTES]


def check_server_proof(secret: bytes, nonce_c: bytes, nonce_s: bytes, proof: bytes) -> None:
    if not hmac.compare_digest(proof, _mac(secret, b"s", nonce_c, nonce_s)):
        raise ValueError("server does not know the job secret")
