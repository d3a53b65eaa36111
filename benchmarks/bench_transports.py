"""Frames between two processes, per transport backend: the figures that choose a transport.

Two figures per backend, the client dialing a server process that echoes every frame:

* round trip: one 64-byte frame out and its echo back, one at a time (median of 5 x ``N``);
* pipelined: ``BURST`` 64-byte frames sent back to back, timed until the last echo is back,
  as frames per second one way (median of 3).

``python -m benchmarks.bench_transports`` prints a table; ``... --only nng+tcp,tcp`` picks
backends. The ``nng+tls+tcp`` row uses a throwaway CA made with trustme (a dev dependency).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import trio

from regency.transports import Connection, open_transport

SECRET = b"benchmark-secret-0123456789abcdef"
N = 2000
BURST = 20_000
KINDS = ("unix", "tcp", "nng+ipc", "nng+tcp", "nng+tls+tcp")


class _Echo:
    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        conn.send_nowait(bytes(frame))

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


async def _serve(address: str) -> None:
    async with open_transport(SECRET) as transport:
        listener = await transport.listen(address, lambda c: _Echo())
        print(listener.address, flush=True)
        await trio.sleep_forever()


class _Client:
    def __init__(self) -> None:
        self.event = trio.Event()
        self.count = 0
        self.want = 1

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        self.count += 1
        if self.count >= self.want:
            self.event.set()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def _measure(address: str) -> tuple[float, float, float]:
    """(round trip in us, pipelined frames/s, this process's CPU per round trip in us, its
    library threads included: a figure that load on the machine changes little)."""
    async with open_transport(SECRET) as transport:
        client = _Client()
        conn = await transport.connect(address, client)
        frame = b"x" * 64

        async def exchange(count: int) -> None:
            client.event = trio.Event()
            client.count, client.want = 0, count
            for _ in range(count):
                conn.send_nowait(frame)
            await client.event.wait()

        for _ in range(200):
            await exchange(1)
        trips = []
        cpu0 = _cpu()
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(N):
                await exchange(1)
            trips.append((time.perf_counter() - t0) / N * 1e6)
        cpu = (_cpu() - cpu0) / (5 * N) * 1e6
        rates = []
        for _ in range(3):
            t0 = time.perf_counter()
            await exchange(BURST)
            rates.append(BURST / (time.perf_counter() - t0))
        conn.close()
        return statistics.median(trips), statistics.median(rates), cpu


@contextlib.contextmanager
def _tls_files() -> Iterator[dict[str, str]]:
    import trustme

    from regency.transports._nng import ENV_CA, ENV_CERT, ENV_KEY

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="regency-bench-tls-") as d:
        env = {ENV_CERT: f"{d}/cert.pem", ENV_KEY: f"{d}/key.pem", ENV_CA: f"{d}/ca.pem"}
        cert.cert_chain_pems[0].write_to_path(env[ENV_CERT])
        cert.private_key_pem.write_to_path(env[ENV_KEY])
        ca.cert_pem.write_to_path(env[ENV_CA])
        yield env


def run(kinds: tuple[str, ...] = KINDS) -> list[tuple[str, float, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as d, _tls_files() as tls:
        os.chmod(d, 0o700)
        os.environ.update(tls)
        addresses = {
            "unix": f"unix://{d}/bench.sock",
            "tcp": "tcp://127.0.0.1:0",
            "nng+ipc": f"nng+ipc://{d}/bench.nng",
            "nng+tcp": "nng+tcp://127.0.0.1:0",
            "nng+tls+tcp": "nng+tls+tcp://127.0.0.1:0",
        }
        for kind in kinds:
            server = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.bench_transports", "serve", addresses[kind]],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert server.stdout is not None
                bound = server.stdout.readline().strip()
                rows.append((kind, *trio.run(_measure, bound)))
            finally:
                server.kill()
                server.wait()
    return rows


def main() -> None:
    kinds = KINDS
    if sys.argv[1:2] == ["--only"]:
        kinds = tuple(sys.argv[2].split(","))
    print("| transport | 64-byte round trip | pipelined 64-byte frames | client CPU per trip |")
    print("|---|---|---|---|")
    for kind, trip, rate, cpu in run(kinds):
        print(f"| {kind} | {trip:,.0f} us | {rate:,.0f} /s | {cpu:,.0f} us |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        trio.run(_serve, sys.argv[2])
    else:
        main()
