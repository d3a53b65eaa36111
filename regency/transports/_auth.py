"""Challenge-response handshake on the job secret.

Every stream connection starts with this exchange before any frame is accepted, so nothing
from a peer that does not know the secret is ever unpickled. Both sides prove knowledge of the
secret (mutual authentication): the dialer never sends payload to an impostor either.

    server -> client   MAGIC  nonce_s(32)
    client -> server   MAGIC  nonce_c(32)  HMAC(secret, "c" nonce_s nonce_c)
    server -> client   HMAC(secret, "s" nonce_c nonce_s)

The module is pure: it builds and checks messages; the transports do the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

MAGIC = b"RGCY\x01"
NONCE_BYTES = 32
MAC_BYTES = 32
SERVER_HELLO_BYTES = len(MAGIC) + NONCE_BYTES
CLIENT_PROOF_BYTES = len(MAGIC) + NONCE_BYTES + MAC_BYTES
SERVER_PROOF_BYTES = MAC_BYTES
#: Seconds a peer gets to finish the handshake before the connection is dropped.
HANDSHAKE_TIMEOUT = 10.0


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()


def server_hello() -> tuple[bytes, bytes]:
    """Return (message to send, server nonce)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return MAGIC + nonce, nonce


def client_proof(secret: bytes, hello: bytes) -> tuple[bytes, bytes]:
    """Answer a server hello; return (message to send, client nonce).

    Raises ValueError when ``hello`` is not a Regency server hello.
    """
    if len(hello) != SERVER_HELLO_BYTES or not hello.startswith(MAGIC):
        raise ValueError("peer is not a Regency endpoint (bad handshake greeting)")
    nonce_s = hello[len(MAGIC) :]
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    return MAGIC + nonce_c + _mac(secret, b"c", nonce_s, nonce_c), nonce_c


def check_client_proof(secret: bytes, nonce_s: bytes, proof: bytes) -> bytes:
    """Verify a client's proof; return the server's proof to send back.

    Raises ValueError naming what was wrong.
    """
    if len(proof) != CLIENT_PROOF_BYTES or not proof.startswith(MAGIC):
        raise ValueError("peer did not send a Regency handshake")
    nonce_c = proof[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    mac = proof[len(MAGIC) + NONCE_BYTES :]
    if not hmac.compare_digest(mac, _mac(secret, b"c", nonce_s, nonce_c)):
        raise ValueError("peer does not know the job secret")
    return _mac(secret, b"s", nonce_c, nonce_s)


def client_nonce_of(proof: bytes) -> bytes:
    """The client's nonce in a (checked) client proof: with the server's nonce, the salt of
    the connection's frame keys (:mod:`._protect`)."""
    return proof[len(MAGIC) : len(MAGIC) + NONCE_BYTES]


def check_server_proof(secret: bytes, nonce_c: bytes, nonce_s: bytes, proof: bytes) -> None:
    if not hmac.compare_digest(proof, _mac(secret, b"s", nonce_c, nonce_s)):
        raise ValueError("server does not know the job secret")
