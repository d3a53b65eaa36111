"""Round trip of a 64-byte frame between two processes, per transport backend.

This is what chose the default transport (see docs/transports.md).
``python -m benchmarks.bench_transports`` prints one line per backend.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import trio

from regency.transports import Connection, open_transport

SECRET = b"benchmark-secret-0123456789abcdef"
N = 3000


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

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        self.event.set()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass


async def _measure(address: str) -> float:
    async with open_transport(SECRET) as transport:
        client = _Client()
        conn = await transport.connect(address, client)
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(N):
                client.event = trio.Event()
                conn.send_nowait(b"x" * 64)
                await client.event.wait()
            samples.append((time.perf_counter() - t0) / N * 1e6)
        conn.close()
        return statistics.median(samples)


def run() -> list[tuple[str, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        for address in (
            f"unix://{d}/bench.sock",
            "tcp://127.0.0.1:0",
            f"nng+ipc://{d}/bench.nng",
            "nng+tcp://127.0.0.1:0",
        ):
            server = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.bench_transports", "serve", address],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert server.stdout is not None
                bound = server.stdout.readline().strip()
                rows.append((address.split("://")[0], trio.run(_measure, bound)))
            finally:
                server.kill()
                server.wait()
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        trio.run(_serve, sys.argv[2])
    else:
        for scheme, us in run():
            print(f"{scheme:10s} {us:8.1f} us")
