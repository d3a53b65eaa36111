"""The wire version (``regency.transports._auth.WIRE_VERSION``) moves with the codec's frame
layouts: peers of different versions refuse each other in the handshake, so a layout change
that kept the version would let an older worker misread frames instead of being refused.

This pins one frame of every record to a digest recorded per version. A failure here means the
layouts changed: bump ``WIRE_VERSION`` (and say what changed in its comment), then record the
digest this test prints for the new version."""

from __future__ import annotations

import hashlib

from regency.core import _codec
from regency.core import _messages as M
from regency.transports import _auth

#: The digest of :func:`_frames` for each wire version that had this test.
LAYOUTS = {
    2: "7fd60f2cdbaec20a600ccdc601a8398d8232a9240027f353996398a04b966067",
}

PORT = ("unix:///run/regency/c1.sock", 7)


def _frames() -> list[bytes]:
    records: list[M.Wire] = [
        M.Call("c1.p.0", "ping", PORT, 3, ("gpus",), (4,), ((1, "two"), {"k": 3.5})),
        M.Call("c1.p.0", "ping", None, 1 << 40, ["a", "b"], [1, 2], ((), {})),
        M.Call("c1.p.0", "put", PORT, 0, ("x",), (1,), ((_codec.out_of_band(b"\x01" * 70_000),), {})),
        M.Reply(9, 2, M.OK, None),
        M.Reply(9, 2, M.OK, 12345),
        M.Reply(9, 2, M.OK, {"loss": [0.5, 0.25]}),
        M.Reply(9, 0, M.OK, _codec.out_of_band(b"\x02" * 70_000)),
        M.Cast(("c1", 4), "c1.a", "step", PORT, PORT, 2, True, ("hosts", "gpus"), (2, 4),
               (("unix:///run/regency/p1.sock", (0, 1)),), 8, ((1,), {})),
        M.Spawn("c1.a", "trainer", 5, ("gpus",), (8,), PORT, ("c1", "job", "mesh"), ((), {})),
        M.StopActor("c1.a", PORT),
        M.StopProc(None),
        M.Hello("c1.p.3", "unix:///run/regency/p3.sock"),
        M.Failed("mesh", 2, ("boom", 1)),
        M.Heartbeat("tcp://10.0.0.2:7000"),
        M.Session("c1-session", 17),
        M.Ack(42),
        M.Attach("c1", 30.0, ("tcp://10.0.0.1:7000", 3)),
        M.Reserve("c1", 4, ("tcp://10.0.0.1:7000", 4)),
        M.Launch("c1", {"argv": ["python", "-m", "x"]}),
        M.Exited("tcp://10.0.0.2:7001", -9),
        M.Kill("c1", "tcp://10.0.0.2:7001"),
        M.Lease("c1"),
        M.Detach("c1", True),
        M.Refused("tcp://10.0.0.2:7000", "full"),
        M.Lapsed("w1", "lease lapsed"),
    ]
    frames = []
    for record in records:
        frame = _codec.encode(record)
        frames.append(frame if isinstance(frame, bytes) else b"".join(bytes(p) for p in frame))
    return frames


def test_a_change_of_frame_layouts_bumps_the_wire_version() -> None:
    digest = hashlib.sha256(b"".join(len(f).to_bytes(8, "little") + f for f in _frames()))
    recorded = LAYOUTS.get(_auth.WIRE_VERSION)
    assert recorded == digest.hexdigest(), (
        f"the codec's frame layouts give digest {digest.hexdigest()}, but wire version "
        f"{_auth.WIRE_VERSION} recorded {recorded!r}: if the layouts changed, bump "
        "regency.transports._auth.WIRE_VERSION and record this digest under the new version "
        "in LAYOUTS"
    )


def test_every_frame_of_the_pinned_set_decodes() -> None:
    """The pinned frames are real frames: each decodes (the digest pins something live)."""
    for frame in _frames():
        _codec.decode(memoryview(frame))
