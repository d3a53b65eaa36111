"""The cost of frame protection on tcp:// links: ``call_one`` round trip,
pipelined rate, and 1 MiB and 64 MiB arguments, with every frame sealed (AES-256-GCM, the
default) and in the clear (``tcp_protection="off"``), plus the raw record-layer and TLS 1.3
throughput that decided the design. ``python -m benchmarks.bench_protect``.

Each setting runs in its own controller process: the setting is read when the runtime starts,
and every proc of the job inherits it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONTROLLER = r"""
import json, statistics, sys, time
from regency.actor import Actor, endpoint, this_host

class Echo(Actor):
    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def length(self, data: bytes) -> int:
        return len(data)

pm = this_host().spawn_procs()
one = pm.spawn("echo", Echo)
one.ping.call_one().get(30)
out = {}
samples = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(500):
        one.ping.call_one().get(30)
    samples.append((time.perf_counter() - t0) / 500 * 1e6)
out["rtt_us"] = statistics.median(samples)
rates = []
for _ in range(3):
    t0 = time.perf_counter()
    futs = [one.ping.call_one() for _ in range(10_000)]
    for f in futs:
        f.get(60)
    rates.append(10_000 / (time.perf_counter() - t0))
out["pipelined"] = statistics.median(rates)
for label, size, reps in (("1MiB_ms", 1 << 20, 50), ("64MiB_ms", 64 << 20, 5)):
    data = bytes(size)
    one.length.call_one(data).get(60)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        assert one.length.call_one(data).get(60) == size
        samples.append((time.perf_counter() - t0) * 1e3)
    out[label] = statistics.median(samples)
pm.stop().get(30)
print(json.dumps(out))
"""


def _measure(protection: str) -> dict[str, float]:
    env = {
        **os.environ,
        "REGENCY_DEFAULT_TRANSPORT": "tcp",
        "REGENCY_TCP_PROTECTION": protection,
        "PYTHONPATH": ROOT,
    }
    env.setdefault("REGENCY_SECRET", "regency-benchmark-job-secret")
    done = subprocess.run(
        [sys.executable, "-c", CONTROLLER], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark controller failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _record_layer_gbps(size: int) -> tuple[float, float]:
    """Seal and open throughput of one frame of ``size`` bytes, in GB/s."""
    from regency.transports._protect import HEADER_BYTES, Opener, Sealer

    key = bytes(range(32))
    data = os.urandom(size)
    reps = max(3, min(2000, (256 << 20) // size))
    sealer = Sealer(key)
    t0 = time.perf_counter()
    wires = [sealer.seal(data) for _ in range(reps)]
    seal = size * reps / (time.perf_counter() - t0) / 1e9
    opener = Opener(key)
    t0 = time.perf_counter()
    for wire in wires:
        view = memoryview(wire)
        pos = 0
        while pos < len(view):
            body = opener.body_length(view[pos : pos + HEADER_BYTES])
            opener.open(view[pos : pos + HEADER_BYTES], view[pos + HEADER_BYTES : pos + HEADER_BYTES + body])
            pos += HEADER_BYTES + body
    opened = size * reps / (time.perf_counter() - t0) / 1e9
    return seal, opened


def _tls13_gbps(size: int) -> float:
    """One direction of TLS 1.3 (stdlib ssl, memory BIOs, AES-256-GCM) for ``size``-byte
    writes, both ends in this process: encrypt + decrypt, like one seal + one open."""
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("regency")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ctx in (server_ctx, client_ctx):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    cert.configure_cert(server_ctx)
    ca.configure_trust(client_ctx)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="regency")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # handshake
        for side, out, peer_in in ((client, c_out, s_in), (server, s_out, c_in)):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
    data = os.urandom(size)
    reps = max(3, min(2000, (256 << 20) // size))
    t0 = time.perf_counter()
    for _ in range(reps):
        client.write(data)
        s_in.write(c_out.read())
        got = 0
        while got < size:
            got += len(server.read(size - got))
    return size * reps / (time.perf_counter() - t0) / 1e9


def run() -> list[tuple[str, str, float, str]]:
    rows: list[tuple[str, str, float, str]] = []
    # Alternate the settings so that a change in the machine's load hits both alike.
    runs: dict[str, list[dict[str, float]]] = {"off": [], "aead": []}
    for _ in range(3):
        for mode in runs:
            runs[mode].append(_measure(mode))
    results = {
        mode: {key: statistics.median(r[key] for r in got) for key in got[0]}
        for mode, got in runs.items()
    }
    for key, label, unit in (
        ("rtt_us", "call_one round trip over tcp", "us"),
        ("pipelined", "pipelined call_one over tcp", "calls/s"),
        ("1MiB_ms", "call_one with a 1 MiB argument over tcp", "ms"),
        ("64MiB_ms", "call_one with a 64 MiB argument over tcp", "ms"),
    ):
        rows.append((f"{label}, in the clear", "", results["off"][key], unit))
        rows.append((f"{label}, sealed (AES-256-GCM)", "", results["aead"][key], unit))
    for size, label in ((64, "64 B"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB")):
        seal, opened = _record_layer_gbps(size)
        rows.append((f"record layer seal, {label} frames", "", seal, "GB/s"))
        rows.append((f"record layer open, {label} frames", "", opened, "GB/s"))
        try:
            rows.append((f"TLS 1.3 write+read (stdlib ssl), {label}", "", _tls13_gbps(size), "GB/s"))
        except ImportError:
            pass
    return rows


if __name__ == "__main__":
    for figure, _target, value, unit in run():
        print(f"{figure:60s} {value:12,.3f} {unit}")

