"""Tests of the simulated cluster, and the sinks they share.

Every test here is a plain function that runs its own ``trio.run`` on a mock clock through
``run_deterministic``: nothing waits on real time, so the folder runs in seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from regency.transports import Connection


class Recorder:
    """A sink that records, in order, every frame and loss it hears of, and can echo."""

    def __init__(self, echo: bool = False, explode_on: bytes | None = None) -> None:
        #: ("frame", bytes) and ("lost", exception or None), in the order they arrived.
        self.log: list[tuple[str, object]] = []
        self.times: list[float] = []
        #: Frames that arrived although the connection was already closed: must stay empty.
        self.late: list[bytes] = []
        self.echo = echo
        self.explode_on = explode_on
        self.changed = trio.Event()

    @property
    def frames(self) -> list[bytes]:
        return [item for kind, item in self.log if kind == "frame"]  # type: ignore[misc]

    @property
    def lost(self) -> list[BaseException | None]:
        return [item for kind, item in self.log if kind == "lost"]  # type: ignore[misc]

    def frame_received(self, conn: Connection, frame: memoryview) -> None:
        data = bytes(frame)
        if conn.closed:
            self.late.append(data)
        if self.explode_on is not None and data == self.explode_on:
            raise ValueError("sink refuses this frame")
        self.log.append(("frame", data))
        self.times.append(trio.current_time())
        if self.echo:
            conn.send_nowait(data)
        self._poke()

    def connection_lost(self, conn: Connection, exc: BaseException | None) -> None:
        self.log.append(("lost", exc))
        self._poke()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, pred: Callable[[], object], timeout: float = 60) -> None:
        """Wait, in virtual time, until ``pred()`` holds."""
        with trio.fail_after(timeout):
            while not pred():
                await self.changed.wait()


class Server:
    """A sink factory: every accepted connection gets an echoing Recorder."""

    def __init__(self, echo: bool = True) -> None:
        self.sinks: list[Recorder] = []
        self.conns: list[Connection] = []
        self.echo = echo
        self.accepted = trio.Event()

    def __call__(self, conn: Connection) -> Recorder:
        r = Recorder(echo=self.echo, explode_on=b"explode")
        self.sinks.append(r)
        self.conns.append(conn)
        self.accepted.set()
        return r
