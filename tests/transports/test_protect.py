"""Frame protection on TCP links: the pure record layer, and an on-path relay that forwards a
real handshake and then tampers with what follows."""

from __future__ import annotations

import os
import re
import struct

import pytest
import trio

from regency.transports import _protect, open_transport
from regency.transports._protect import Opener, ProtectionError, Sealer, derive_keys

from .relay import Relay
from .test_conformance import SECRET, Recorder, Server

KEY = bytes(range(32))


def _records(wire: bytes | bytearray) -> list[tuple[bytes, bytes]]:
    out = []
    pos = 0
    while pos < len(wire):
        word, _ = struct.unpack_from("<IQ", wire, pos)
        body = word & ~(1 << 31)
        out.append((bytes(wire[pos : pos + 12]), bytes(wire[pos + 12 : pos + 12 + body])))
        pos += 12 + body
    return out


def _open_all(opener: Opener, wire: bytes | bytearray) -> list[bytes]:
    frames = []
    for header, body in _records(wire):
        assert opener.body_length(header) == len(body)
        frame = opener.open(header, body)
        if frame is not None:
            frames.append(bytes(frame))
    return frames


def test_round_trip_small_parts_and_multi_record_frames() -> None:
    sealer, opener = Sealer(KEY), Opener(KEY)
    big = os.urandom(3 * _protect.MAX_RECORD_PLAINTEXT + 5)
    frames: list[object] = [b"", b"hello", [b"ab", b"cd", memoryview(big), b"tail"], big]
    wire = b"".join(sealer.seal(f) for f in frames)  # type: ignore[arg-type]
    got = _open_all(opener, wire)
    assert got == [b"", b"hello", b"abcd" + big + b"tail", big]
    assert sealer.records_sealed == opener.records_opened == 2 + 6 + 4  # "abcd" joined
    assert not opener.mid_frame
    # Nothing of the plaintext is visible on the wire.
    assert big[:64] not in wire


def _sealed_records(count: int) -> list[tuple[bytes, bytes]]:
    sealer = Sealer(KEY)
    return [_records(sealer.seal(f"frame {i}".encode()))[0] for i in range(count)]


def test_replayed_dropped_reordered_and_altered_records_are_refused() -> None:
    r = _sealed_records(3)
    opener = Opener(KEY)
    assert opener.open(*r[0]) == b"frame 0"
    with pytest.raises(ProtectionError, match=r"record 0 arrived where record 1 was expected \(replayed or reordered"):
        opener.open(*r[0])
    fresh = Opener(KEY)
    fresh.open(*r[0])
    with pytest.raises(ProtectionError, match=r"record 2 arrived where record 1 was expected \(one or more records were dropped"):
        fresh.open(*r[2])
    header, body = r[1]
    flipped = body[:3] + bytes([body[3] ^ 1]) + body[4:]
    with pytest.raises(ProtectionError, match="record 1 failed authentication: forged or altered"):
        opener.open(header, flipped)
    # A header whose flag was flipped (claiming more records follow) fails too: the header
    # is authenticated with the body.
    moved = struct.pack("<IQ", len(body) | (1 << 31), 1)
    with pytest.raises(ProtectionError, match="record 1 failed authentication"):
        opener.open(moved, body)
    with pytest.raises(ProtectionError, match="failed authentication"):
        Opener(bytes(32)).open(*r[0])  # another connection's key


def test_forged_lengths_are_refused_before_any_wait_or_allocation() -> None:
    opener = Opener(KEY)
    with pytest.raises(ProtectionError, match=r"declares a body of 2147483647 bytes; a record body must be 16 to"):
        opener.body_length(struct.pack("<IQ", (1 << 31) - 1, 0))
    with pytest.raises(ProtectionError, match="declares a body of 3 bytes"):
        opener.body_length(struct.pack("<IQ", 3, 0))


def test_frames_beyond_max_frame_are_refused_as_records_arrive() -> None:
    sealer, opener = Sealer(KEY), Opener(KEY, max_frame=_protect.MAX_RECORD_PLAINTEXT + 10)
    records = _records(sealer.seal(bytes(3 * _protect.MAX_RECORD_PLAINTEXT)))
    assert opener.open(*records[0]) is None
    with pytest.raises(ProtectionError, match=r"frame exceeds max_frame_bytes=\d+ \(\d+ bytes received so far\)"):
        opener.open(*records[1])


def test_keys_differ_per_direction_and_per_connection() -> None:
    n1, n2, n3 = os.urandom(32), os.urandom(32), os.urandom(32)
    up, down = derive_keys(SECRET, n1, n2)
    assert up != down and len(up) == len(down) == 32
    assert derive_keys(SECRET, n1, n3)[0] != up
    assert derive_keys(b"t" * 32, n1, n2)[0] != up
    with pytest.raises(ValueError, match=r"role must be one of \('client', 'server'\) \(got 'peer'\)"):
        _protect.keys_for("peer", SECRET, n1, n2)
    with pytest.raises(ValueError, match="a frame key must be 32 bytes"):
        Sealer(b"short")


# -- an on-path relay over real TCP ------------------------------------------------------------


def _raw_frame() -> bytes:
    """What an attacker without the secret adds: a plain length-prefixed frame."""
    payload = b"\x80\x05\x95" + b"A" * 40
    return len(payload).to_bytes(4, "little") + payload


def _forged_record() -> bytes:
    body = os.urandom(48)
    return struct.pack("<IQ", len(body), 0) + body


@pytest.mark.parametrize(
    ("mode", "attack", "delivered", "error"),
    [
        ("inject", _raw_frame(), [], r"record \d+ "),
        ("inject", _forged_record(), [], "record 0 failed authentication: forged or altered"),
        ("drop", b"", [], r"record 1 arrived where record 0 was expected \(one or more records were dropped"),
        ("reorder", b"", [], "record 1 arrived where record 0 was expected"),
        ("replay", b"", [b"first"], r"record 0 arrived where record 1 was expected \(replayed or reordered"),
        ("flip", b"", [], "record 0 failed authentication: forged or altered"),
    ],
)
async def test_on_path_relay_cannot_inject_drop_reorder_replay_or_alter(
    mode: str, attack: bytes, delivered: list[bytes], error: str
) -> None:
    async with open_transport(SECRET) as transport, trio.open_nursery() as nursery:
        server = Server()
        listener = await transport.listen("tcp://127.0.0.1:0", server)
        host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
        relay = Relay((host, int(port)), mode, attack)
        relayed = await nursery.start(relay.serve)
        client = Recorder()
        conn = await transport.connect(relayed, client)
        conn.send_nowait(b"first")
        conn.send_nowait(b"second")
        await server.accepted.wait()
        sink = server.sinks[0]
        await sink.wait_for(lambda: sink.lost)
        assert sink.frames == delivered
        assert re.search(error, str(sink.lost[0])), sink.lost
        assert isinstance(sink.lost[0], ProtectionError)
        # Only that connection closed: the listener serves the next one.
        ok = Recorder()
        conn2 = await transport.connect(listener.address, ok)
        conn2.send_nowait(b"after")
        await server.sinks[1].wait_for(lambda: server.sinks[1].frames == [b"after"])
        nursery.cancel_scope.cancel()


async def test_tcp_frames_are_encrypted_on_the_wire_and_unix_frames_are_not() -> None:
    """The bytes a passive observer sees on a tcp link do not contain the frame."""
    secret_text = b"the-plaintext-must-not-appear" * 4
    async with open_transport(SECRET) as transport, trio.open_nursery() as nursery:
        server = Server()
        listener = await transport.listen("tcp://127.0.0.1:0", server)
        host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
        seen = bytearray()

        class Tap(Relay):
            async def _tamper(self, client: trio.SocketStream, server: trio.SocketStream) -> None:
                async for chunk in client:
                    seen.extend(chunk)
                    await server.send_all(chunk)

        relayed = await nursery.start(Tap((host, int(port)), "tap").serve)
        conn = await transport.connect(relayed, Recorder())
        conn.send_nowait(secret_text)
        await server.accepted.wait()
        await server.sinks[0].wait_for(lambda: server.sinks[0].frames == [secret_text])
        assert b"must-not-appear" not in seen
        nursery.cancel_scope.cancel()


async def test_protection_off_sends_frames_in_the_clear() -> None:
    async with open_transport(SECRET, protect_tcp=False) as transport:
        server = Server()
        listener = await transport.listen("tcp://127.0.0.1:0", server)
        conn = await transport.connect(listener.address, Recorder())
        assert conn._sealer is None  # type: ignore[attr-defined]
        conn.send_nowait(b"x")
        await server.accepted.wait()
        await server.sinks[0].wait_for(lambda: server.sinks[0].frames == [b"x"])



def test_tcp_protection_setting_is_checked() -> None:
    import regency

    with pytest.raises(ValueError, match=r"tcp_protection must be one of \('aead', 'off'\) \(got 'tls'\)"):
        regency.configure(tcp_protection="tls")
