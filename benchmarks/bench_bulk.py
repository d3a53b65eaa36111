"""Big arguments between procs of one host: the shared-memory lane on and off.

``python -m benchmarks.bench_bulk --frames [BLOCKS]`` measures the transport alone: a forked
process echoes raw frames of a few sizes over one unix-socket connection, big frames going
through the lane or the socket in alternating blocks (the client sets which; the echo
follows, since its connection has both paths too), timing the round trip and the client's CPU
time per round trip (one thread: it survives load better than wall time). That is where the
threshold (``LANE_MIN``) was chosen.

``python -m benchmarks.bench_bulk [BLOCKS]`` spawns one proc and echoes ``bytes`` of a few
sizes with ``call_one`` (the same size each way), in short blocks that alternate between
big frames through the shared-memory lane (``transports/_shm.py``) and through the unix
socket, in one process against the same proc, the order flipping every block so that the
machine's load drifts over both alike. The lane is negotiated per connection; the blocks
switch which path the *senders* of every connection take (both paths stay open on the
same connections; a receiver takes either), in this process and in the proc. A tiny round
trip is measured the same way, as a check that the lane's test on every frame costs
nothing visible. Prints the median and quartiles of the blocks' means.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from regency.actor import Actor, endpoint, this_host

SIZES = [("256 KiB", 256 * 1024), ("1 MiB", 1 << 20), ("4 MiB", 4 << 20)]


def _set_lane(on: bool) -> int:
    """Make every lane connection of this process send big frames through the lane (on)
    or the socket (off); how many connections have a lane. (A benchmark's switch: it
    finds the connections through the garbage collector.)"""
    from regency.transports import _sockets

    count = 0
    for obj in gc.get_objects():
        if type(obj) is _sockets.SocketConnection and obj.lane:  # (no ABC checks on every object)
            obj._lane_min = _sockets.LANE_MIN if on else _sockets._NEVER
            count += 1
    return count


class Echo(Actor):
    @endpoint
    def ping(self, x: object = None) -> object:
        return x

    @endpoint
    def lane(self, on: bool) -> int:
        return _set_lane(on)


def compare(blocks: int) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    echo = procs.spawn("echo", Echo).slice(gpus=0)
    echo.ping.call_one().get(30)

    def per_call_us(fn: Callable[[], object], n: int) -> Callable[[], float]:
        def block() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n * 1e6

        return block

    figures: list[tuple[str, Callable[[], float]]] = [
        ("call_one round trip, tiny", per_call_us(lambda: echo.ping.call_one().get(), 300)),
    ]
    for label, size in SIZES:
        payload = bytes(range(256)) * (size // 256)

        def one(payload: bytes = payload) -> None:
            back = echo.ping.call_one(payload).get()
            assert len(back) == len(payload)  # type: ignore[arg-type]

        figures.append((f"call_one echoing {label} (each way)", per_call_us(one, max(10, 40_000_000 // size // 4))))
    seen: dict[tuple[str, bool], list[float]] = {}
    for b in range(blocks + 1):
        for on in (False, True) if b % 2 else (True, False):
            mine, theirs = _set_lane(on), echo.lane.call_one(on).get(30)
            if not (mine and theirs):
                raise RuntimeError(f"no lane connection to switch (here {mine}, in the proc {theirs})")
            for name, block in figures:
                value = block()
                if b:  # the first round warms up
                    seen.setdefault((name, on), []).append(value)
    _set_lane(True)
    procs.stop().get(30)
    print(f"{'figure, us (median, quartiles of ' + str(blocks) + ' blocks)':50s} {'socket':>22s} {'shared-memory lane':>22s}")
    for name, _ in figures:
        cells = []
        for on in (False, True):
            q = statistics.quantiles(seen[(name, on)], n=4)
            cells.append(f"{statistics.median(seen[(name, on)]):,.0f} ({q[0]:,.0f}-{q[2]:,.0f})")
        print(f"{name:50s} {cells[0]:>22s} {cells[1]:>22s}")


def _faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


FRAME_SIZES = [32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024, 1 << 20, 4 << 20]
_SECRET = b"bench-bulk-secret-0123456789abcdef"


class _Echo:
    def __init__(self, forced: bool) -> None:
        self.forced = forced

    def __call__(self, conn: Any) -> _Echo:
        if self.forced:  # the echo sends big frames back through the lane at any size
            conn._lane_min = 1
        return self

    def frame_received(self, conn: Any, frame: memoryview) -> None:
        conn.send_nowait(bytes(frame))

    def connection_lost(self, conn: Any, exc: BaseException | None) -> None:
        pass


def _echo_server(path: str) -> None:
    import trio

    from regency.transports._sockets import SocketTransport

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for lane, where in ((True, path + ".lane"), (False, path + ".sock")):
                transport = SocketTransport(nursery, _SECRET, 1 << 30, shm_lane=lane)
                await transport.listen("unix://" + where, _Echo(lane))

    trio.run(main)


def frames(blocks: int) -> None:
    import trio

    from regency.transports._sockets import SocketTransport

    directory = tempfile.mkdtemp(prefix="regency-bench-")
    os.chmod(directory, 0o700)
    path = os.path.join(directory, "echo")
    server = multiprocessing.get_context("fork").Process(target=_echo_server, args=(path,), daemon=True)
    server.start()

    class Client:
        def __init__(self) -> None:
            self.arrived = trio.Event()

        def frame_received(self, conn: Any, frame: memoryview) -> None:
            bytes(frame)  # what a receiver does: one copy out
            self.arrived.set()

        def connection_lost(self, conn: Any, exc: BaseException | None) -> None:
            pass

    async def main() -> dict[tuple[int, bool], list[tuple[float, float, float]]]:
        seen: dict[tuple[int, bool], list[tuple[float, float, float]]] = {}
        async with trio.open_nursery() as nursery:
            transport = SocketTransport(nursery, _SECRET, 1 << 30)
            client = Client()
            while not os.path.exists(path + ".sock"):
                await trio.sleep(0.01)
            conns = {
                True: await transport.connect("unix://" + path + ".lane", client),
                False: await transport.connect("unix://" + path + ".sock", client),
            }
            assert conns[True].lane and not conns[False].lane  # type: ignore[attr-defined]
            conns[True]._lane_min = 1  # type: ignore[attr-defined]
            for size in FRAME_SIZES:
                data = os.urandom(size)
                n = max(10, 8_000_000 // size)
                for b in range(blocks + 1):
                    for lane in (False, True) if b % 2 else (True, False):
                        conn = conns[lane]
                        t0, c0, f0 = time.perf_counter(), time.thread_time(), _faults()
                        for _ in range(n):
                            client.arrived = trio.Event()
                            conn.send_nowait(data)
                            await client.arrived.wait()
                        if b:
                            wall = (time.perf_counter() - t0) / n * 1e6
                            cpu = (time.thread_time() - c0) / n * 1e6
                            faults = (_faults() - f0) / n
                            seen.setdefault((size, lane), []).append((wall, cpu, faults))
            nursery.cancel_scope.cancel()
        return seen

    try:
        seen = trio.run(main)
    finally:
        server.kill()
    print("round trip: median (min) of the blocks; client CPU in us; client page faults")
    print(f"{'frame echoed':>12s} {'socket: us':>16s} {'lane: us':>16s} {'socket: CPU':>14s} {'lane: CPU':>14s} {'socket: faults':>15s} {'lane: faults':>13s}")
    for size in FRAME_SIZES:
        cells = []
        for k in (0, 1, 2):
            for lane in (False, True):
                values = [v[k] for v in seen[(size, lane)]]
                cells.append(f"{statistics.median(values):,.0f} ({min(values):,.0f})" if k < 2 else f"{statistics.median(values):.1f}")
        print(f"{size // 1024:>8d} KiB {cells[0]:>16s} {cells[1]:>16s} {cells[2]:>14s} {cells[3]:>14s} {cells[4]:>15s} {cells[5]:>13s}")


if __name__ == "__main__":
    if "--frames" in sys.argv:
        tail = sys.argv[sys.argv.index("--frames") + 1 :]
        frames(int(tail[0]) if tail else 10)
    else:
        compare(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
