"""Memory on the socket transport follows the bytes: a peer's length header does not make the
receiver allocate, and large frames leave nothing behind once delivered. Real
sockets; the measure is this process's resident set."""

from __future__ import annotations

import fcntl
import gc
import os
import termios
from collections.abc import Callable
from typing import Any

import pytest
import trio

from regency.transports import Connection, open_transport

from .test_conformance import SECRET, address_for

MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Sizes:
    """A sink that keeps only the size of what it receives (and the connection)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.conns: list[Connection] = []
        self.changed = trio.Event()

    def __call__(self, conn: Connection) -> _Sizes:
        self.conns.append(conn)
        return self

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        self.sizes.append(len(frame))
        self.changed.set()
        self.changed = trio.Event()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        pass

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        with trio.fail_after(60):
            while not pred():
                await self.changed.wait()


async def _drained(conn: Any) -> None:
    """Until the kernel holds no unread bytes for ``conn`` (its reader took them all)."""
    with trio.fail_after(30):
        while True:
            pending = fcntl.ioctl(conn._sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
            if int.from_bytes(pending, "little") == 0:
                return
            await trio.sleep(0.001)


async def test_a_length_header_does_not_make_the_receiver_allocate(sockdir: str) -> None:
    async with open_transport(SECRET) as transport:
        server = _Sizes()
        listener = await transport.listen(address_for("unix", sockdir), server)
        conn = await transport.connect(listener.address, _Sizes())
        # An authenticated (buggy) peer declares a 1 GiB frame and sends 1 MiB of it.
        gc.collect()
        before = _rss()
        conn._sock.send((1 << 30).to_bytes(4, "little") + bytes(MiB))  # type: ignore[attr-defined]
        while not server.conns:
            await trio.sleep(0.001)
        await _drained(server.conns[0])
        grew = _rss() - before
        assert grew < 64 * MiB, f"the receiver grew {grew >> 20} MiB for 1 MiB received"
        assert server.sizes == []


@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_large_frames_leave_nothing_behind(kind: str, sockdir: str) -> None:
    async with open_transport(SECRET) as transport:
        server = _Sizes()
        listener = await transport.listen(address_for(kind, sockdir), server)
        conn = await transport.connect(listener.address, _Sizes())
        conn.send_nowait(b"warm up")
        await server.wait_for(lambda: len(server.sizes) == 1)
        gc.collect()
        before = _rss()
        for n in (1, 2):
            data = os.urandom(48 * MiB)
            conn.send_nowait([data[:MiB], memoryview(data)[MiB:]])
            del data
            await server.wait_for(lambda n=n: len(server.sizes) == 1 + n)  # type: ignore[misc]
        assert server.sizes[1:] == [48 * MiB, 48 * MiB]
        # The receiver keeps its big buffer while big frames keep coming, and gives it back
        # after _KEEP_BIG (1 s) without one.
        with trio.move_on_after(10):
            while True:
                gc.collect()
                kept = _rss() - before
                if kept < 24 * MiB:
                    break
                await trio.sleep(0.1)
        assert kept < 24 * MiB, f"{kept >> 20} MiB kept after two 48 MiB frames over {kind}"
