"""The thread-read seam's conformance check (``regency.testing.check_thread_reads``), run
against every backend: unix sockets and unsealed TCP are read by threads; sealed TCP, nng and
in-process connections declare they are not and deliver through their loop. The simulated
network runs it too, in a world of its own: each thread-side call runs on its loop (in
lockstep with its deliveries, as its lockstep threads do), and a wait for readability
watches the connection."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from regency.core._future import Future
from regency.sim import SimNetwork
from regency.testing import check_thread_reads
from regency.transports import ThreadReadable, open_transport

T = TypeVar("T")

SECRET = b"r" * 32

#: backend -> (open_transport keywords, address, readable by threads)
BACKENDS: dict[str, tuple[dict[str, bool], str, bool]] = {
    "unix": ({}, "unix://{d}/seam.sock", True),
    "unix without a lane": ({"shm_lane": False}, "unix://{d}/seam.sock", True),
    "tcp unsealed": ({"protect_tcp": False}, "tcp://127.0.0.1:0", True),
    # Sealed records are opened in sequence by the reader task's opener alone.
    "tcp sealed": ({}, "tcp://127.0.0.1:0", False),
    "nng+tcp": ({}, "nng+tcp://127.0.0.1:0", False),
    "nng+ipc": ({}, "nng+ipc://{d}/seam.ipc", False),
    "inproc": ({}, "inproc://", False),
    "sim": ({}, "sim://h0/", True),
}


class SimWorld:
    """The simulated network's world, outside a simulation (a real clock)."""

    async def on_thread(self, fn: Callable[[], T]) -> T:
        return fn()

    async def readable(self, conn: ThreadReadable, timeout: float) -> bool:
        sim: Any = conn
        if sim.ready():
            return True
        wake: Future[None] = Future()
        sim.watch(wake)
        try:
            with trio.move_on_after(timeout):
                await wake.wait_on_loop()
        finally:
            sim.unwatch(wake)
        return bool(sim.ready())

    async def settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("seed", [0, 1])
async def test_the_seam_keeps_its_contract(backend: str, seed: int, sockdir: str) -> None:
    options, address, expected = BACKENDS[backend]
    address = address.format(d=sockdir)
    if backend == "sim":
        async with trio.open_nursery() as nursery:
            transport = SimNetwork(random.Random(seed)).transport("h0", nursery)
            readable = await check_thread_reads(transport, address, world=SimWorld(), seed=seed)
            nursery.cancel_scope.cancel()
        assert readable
        return
    async with open_transport(SECRET, **options) as transport:
        readable = await check_thread_reads(transport, address, seed=seed)
    assert readable is expected
