"""Big arguments between procs of one host: the shared-memory lane on and off (issue #13).

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
import statistics
import sys
import time
from collections.abc import Callable

from regency.actor import Actor, endpoint, this_host

SIZES = [("256 KiB", 256 * 1024), ("1 MiB", 1 << 20), ("4 MiB", 4 << 20)]


def _set_lane(on: bool) -> int:
    """Make every lane connection of this process send big frames through the lane (on)
    or the socket (off); how many connections have a lane. (A benchmark's switch: it
    finds the connections through the garbage collector.)"""
    from regency.transports import _sockets

    count = 0
    for obj in gc.get_objects():
        if isinstance(obj, _sockets.SocketConnection) and obj.lane:
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


if __name__ == "__main__":
    compare(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
