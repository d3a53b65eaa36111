"""Frame protection for TCP links: an AEAD record layer keyed per connection.

The handshake (:mod:`._auth`) proves that both ends know the job secret, but on its own it
protects nothing that follows: an on-path relay could forward a real handshake and then add,
drop, reorder or alter frames. So after the handshake every frame on a TCP link travels in
records sealed with AES-256-GCM under keys that only the two ends can compute: HKDF-SHA256 of
the job secret with both handshake nonces as salt, one key per direction. A fresh pair of keys
per connection means a record recorded on one connection is worthless on any other.

A record on the wire::

    u32 little-endian: body length, top bit set when more records of the same frame follow
    u64 little-endian: the record's sequence number on this connection (0, 1, 2, ...)
    body: ciphertext + 16-byte tag, authenticated together with the 12 header bytes

The nonce is the sequence number, so each (key, nonce) pair is used once. The receiver
expects the numbers in order and checks each tag before looking at the plaintext: an
injected, altered, replayed, reordered or dropped record, or one whose header was changed,
raises :class:`ProtectionError` naming what was wrong, and the transport closes that one
connection. A frame larger than one record is split into several; the receiver assembles it as
the records arrive (so memory follows the bytes received, never a length a peer claimed).

This module is pure (h11 style): :class:`Sealer` turns frames into bytes to write and
:class:`Opener` turns record headers and bodies into frames; the transports do the I/O.
Both directions of one connection use different keys; one Sealer and one Opener per side.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: Bytes of a record header: u32 length-and-flag, u64 sequence number.
HEADER_BYTES = 12
#: Bytes of the authentication tag at the end of every record body.
TAG_BYTES = 16
#: Most plaintext bytes one record carries; a record's wire size then fits a 256 KiB receive
#: buffer, so records always complete in place.
MAX_RECORD_PLAINTEXT = 256 * 1024 - HEADER_BYTES - TAG_BYTES
_MORE = 1 << 31
_HEADER = struct.Struct("<IQ")
_NONCE_PAD = b"\0\0\0\0"
#: Parts of a frame smaller than this are joined into shared records rather than each
#: becoming a record of its own (28 bytes of overhead per record).
_SMALL_PART = 4096
#: Frames up to this size are sealed as one record with one call (no buffer bookkeeping).
_SMALL_FRAME = 64 * 1024


def _aesgcm(key: bytes) -> tuple[AESGCM, type[Exception]]:
    """AES-GCM under ``key``, and the error a forged record raises. cryptography is imported
    here, on the first sealed link, not with the package: it costs 20-40 ms of every start,
    and unix links (the default) never seal."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key), InvalidTag


class ProtectionError(ValueError):
    """A record failed its checks: the stream was tampered with (or the peer is not the one
    that did the handshake). The connection it arrived on must be closed."""


def derive_keys(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
    """The (client-to-server, server-to-client) keys of one connection: HKDF-SHA256 (RFC 5869)
    of the job secret, salted with both handshake nonces."""
    if len(server_nonce) < 16 or len(client_nonce) < 16:
        raise ValueError(
            f"handshake nonces must be at least 16 bytes (got {len(server_nonce)} and "
            f"{len(client_nonce)})"
        )
    prk = hmac.new(server_nonce + client_nonce, secret, hashlib.sha256).digest()
    to_server = hmac.new(prk, b"regency frames client->server\x01", hashlib.sha256).digest()
    to_client = hmac.new(prk, b"regency frames server->client\x01", hashlib.sha256).digest()
    return to_server, to_client


def keys_for(
    role: str,
    secret: bytes,
    server_nonce: bytes,
    client_nonce: bytes,
    max_frame: int = 1 << 31,
) -> tuple[Sealer, Opener]:
    """The sealer (for what this side sends) and opener (for what it receives) of one
    connection; ``role`` is "client" (the side that dialed) or "server"."""
    to_server, to_client = derive_keys(secret, server_nonce, client_nonce)
    if role == "client":
        return Sealer(to_server), Opener(to_client, max_frame)
    if role == "server":
        return Sealer(to_client), Opener(to_server, max_frame)
    raise ValueError(f"role must be one of ('client', 'server') (got {role!r})")


class Sealer:
    """Seals outgoing frames. Not thread-safe: the caller seals and writes under one lock,
    so records reach the wire in sequence order."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError(f"a frame key must be 32 bytes (got {len(key)})")
        self._aead, _ = _aesgcm(key)
        self._seq = 0

    @property
    def records_sealed(self) -> int:
        return self._seq

    def seal(
        self, frame: bytes | bytearray | memoryview | Sequence[bytes | memoryview]
    ) -> bytes | bytearray:
        """The bytes to write for one frame (one or more records), in one buffer."""
        parts: Sequence[bytes | bytearray | memoryview]
        if isinstance(frame, bytes | bytearray | memoryview):
            if len(frame) <= _SMALL_FRAME:
                return self._seal_one(frame)
            parts = [frame]
        else:
            if sum(len(p) for p in frame) <= _SMALL_FRAME:
                return self._seal_one(b"".join(frame))
            parts = frame
        chunks = _chunks(parts)
        total = sum(len(c) for c in chunks) + len(chunks) * (HEADER_BYTES + TAG_BYTES)
        out = bytearray(total)
        view = memoryview(out)
        pos = 0
        last = len(chunks) - 1
        for i, chunk in enumerate(chunks):
            body = len(chunk) + TAG_BYTES
            seq = self._seq
            self._seq = seq + 1
            header = _HEADER.pack(body | (_MORE if i < last else 0), seq)
            view[pos : pos + HEADER_BYTES] = header
            pos += HEADER_BYTES
            self._aead.encrypt_into(
                _NONCE_PAD + header[4:], chunk, header, view[pos : pos + body]
            )
            pos += body
        view.release()
        return out


    def _seal_one(self, data: bytes | bytearray | memoryview) -> bytes:
        """A frame that fits one record: the common case, with the fewest steps."""
        seq = self._seq
        self._seq = seq + 1
        header = _HEADER.pack(len(data) + TAG_BYTES, seq)
        return header + self._aead.encrypt(_NONCE_PAD + header[4:], data, header)


def _chunks(parts: Sequence[bytes | bytearray | memoryview]) -> list[memoryview]:
    """Split a frame's parts into record plaintexts: big parts are cut in place, runs of
    small ones are joined (so a frame of many tiny parts is not many tiny records)."""
    out: list[memoryview] = []
    small = bytearray()
    for part in parts:
        view = memoryview(part).cast("B")
        if len(view) < _SMALL_PART:
            small += view
            if len(small) >= MAX_RECORD_PLAINTEXT:
                out.extend(_cut(memoryview(bytes(small))))
                small = bytearray()
            continue
        if small:
            out.append(memoryview(bytes(small)))
            small = bytearray()
        out.extend(_cut(view))
    if small or not out:
        out.append(memoryview(bytes(small)))
    return out


def _cut(view: memoryview) -> list[memoryview]:
    step = MAX_RECORD_PLAINTEXT
    return [view[i : i + step] for i in range(0, len(view), step)]


class Opener:
    """Checks and opens incoming records, in order, and assembles frames from them."""

    def __init__(self, key: bytes, max_frame: int = 1 << 31) -> None:
        if len(key) != 32:
            raise ValueError(f"a frame key must be 32 bytes (got {len(key)})")
        self._aead, self._invalid_tag = _aesgcm(key)
        self._seq = 0
        self._max_frame = max_frame
        #: Where frames of several records are assembled (reused from frame to frame until
        #: ``release_buffer``), and how much of the current one it holds (-1: none begun).
        self._store: mmap.mmap | None = None
        self._filled = -1

    @property
    def records_opened(self) -> int:
        return self._seq

    @property
    def mid_frame(self) -> bool:
        """True when records of an unfinished frame were received (a connection that ends
        now was truncated)."""
        return self._filled >= 0

    def body_length(self, header: bytes | bytearray | memoryview) -> int:
        """How many body bytes follow this record header (checked against the largest
        record, so a forged length cannot make the reader wait for or allocate more)."""
        word, seq = _HEADER.unpack(header)
        body: int = word & ~_MORE
        if body < TAG_BYTES or body > MAX_RECORD_PLAINTEXT + TAG_BYTES:
            raise ProtectionError(
                f"record {seq} declares a body of {body} bytes; a record body must be "
                f"{TAG_BYTES} to {MAX_RECORD_PLAINTEXT + TAG_BYTES} bytes (the stream was "
                "altered, or the peer does not protect its frames)"
            )
        return body

    def open(
        self, header: bytes | bytearray | memoryview, body: bytes | bytearray | memoryview
    ) -> bytes | memoryview | None:
        """Check one record; return the frame it completes, or None when more records of
        the same frame are to come. A frame of several records is a view of a buffer that
        the next such frame reuses: use it before asking for the next. Raises
        :class:`ProtectionError`."""
        header = bytes(header)
        word, seq = _HEADER.unpack(header)
        expected = self._seq
        if seq != expected:
            what = (
                "replayed or reordered" if seq < expected else "one or more records were dropped"
            )
            raise ProtectionError(
                f"record {seq} arrived where record {expected} was expected ({what} on the way)"
            )
        nonce = _NONCE_PAD + header[4:]
        more = word & _MORE
        if not more and self._filled < 0:  # a frame of one record: the common case
            try:
                plain = self._aead.decrypt(nonce, body, header)
            except self._invalid_tag:
                raise _forged(seq) from None
            self._seq = expected + 1
            return plain
        # A record of a frame of several: open it straight into the assembly buffer.
        start = max(self._filled, 0)
        end = start + len(body) - TAG_BYTES
        if end > self._max_frame:
            raise ProtectionError(
                f"frame exceeds max_frame_bytes={self._max_frame} ({end} bytes received so far)"
            )
        store = self._reserve(start, end)
        with memoryview(store) as view:
            try:
                self._aead.decrypt_into(nonce, body, header, view[start:end])
            except self._invalid_tag:
                raise _forged(seq) from None
        self._seq = expected + 1
        if more:
            self._filled = end
            return None
        self._filled = -1
        return memoryview(store)[:end]

    def _reserve(self, filled: int, needed: int) -> mmap.mmap:
        """The assembly buffer, at least ``needed`` bytes, keeping its first ``filled``.
        Anonymous memory: the kernel commits it as records are written into it; it at most
        doubles per growth, so it never runs far ahead of the bytes received."""
        store = self._store
        if store is None or len(store) < needed:
            grown = mmap.mmap(-1, max(needed, 2 * len(store) if store is not None else 0, 1 << 20))
            if store is not None and filled:
                with memoryview(grown) as to, memoryview(store) as old:
                    to[:filled] = old[:filled]
            self._store = store = grown
        return store

    def release_buffer(self) -> None:
        """Give the assembly buffer back (between frames; the transport calls this once big
        frames stop coming). The next frame of several records allocates a fresh one."""
        if self._filled < 0:
            self._store = None


def _forged(seq: int) -> ProtectionError:
    return ProtectionError(
        f"record {seq} failed authentication: forged or altered on the way (or the peer "
        "does not hold this connection's keys)"
    )
