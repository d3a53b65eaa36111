"""Log forwarding in the simulator: what simulated procs print, at the controller, in
virtual time.

Simulated procs share the test process's file descriptors, so there is no tee: while a
simulated cluster runs with forwarding on, ``sys.stdout`` and ``sys.stderr`` are replaced by
dispatchers that hand text written by a simulated proc's code (the runtime running it is the
current one) to that proc's :class:`SimProcLogs`; everything else passes through. Lines go to
the controller's sink as in a real job, stamped with virtual time, over the simulated network:
the same seed prints the same lines, in the same order, with the same timestamps.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from ..core import _messages as M
from ..core._ports import PortBase
from ._records import (
    CONTROL_PORT,
    MAX_LINE_BYTES,
    SINK_PORT,
    STDERR,
    STDOUT,
    TRUNCATED_MARK,
    Flush,
    Flushed,
    Init,
    LineBatch,
    Mode,
    SetMode,
)

if TYPE_CHECKING:
    from ..core._runtime import Runtime


def _cut(line: str) -> str:
    raw = line.encode()
    if len(raw) <= MAX_LINE_BYTES:
        return line
    return raw[:MAX_LINE_BYTES].decode("utf-8", "ignore") + TRUNCATED_MARK


class SimProcLogs(PortBase):
    """A simulated proc's control port and line buffers (no threads: all in lockstep)."""

    dests: frozenset[str] = frozenset()

    def __init__(self, rt: Runtime, host: str, now: Callable[[], float]) -> None:
        self.rt, self.host, self.now = rt, host, now
        self.mode = Mode(stream=False)
        self.rank: int | None = None
        self.sink: str | None = None
        self._partial = {STDOUT: "", STDERR: ""}
        self._backlog: list[tuple[int, str]] = []

    def deliver(self, index: int, status: int, value: Any) -> bool:
        message = value
        if isinstance(message, Init):
            self.rank, self.sink, self.mode = message.rank, message.sink, message.mode
            backlog, self._backlog = self._backlog, []
            for number in (STDOUT, STDERR):
                lines = [line for n, line in backlog if n == number]
                if lines:
                    self._forward(number, lines)
        elif isinstance(message, SetMode):
            self.mode = message.mode  # the level is process-wide here: left alone
            self.rt.send_port(message.reply, self.rank or 0, M.OK, None)
        elif isinstance(message, Flush):
            for number in (STDOUT, STDERR):
                rest, self._partial[number] = self._partial[number], ""
                if rest:
                    self._forward(number, [rest])
            self._send(Flushed(message.reply, self.rt.address))
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass

    def take(self, number: int, text: str) -> None:
        pending = self._partial[number] + text
        *lines, self._partial[number] = pending.split("\n")
        if lines:
            self._forward(number, lines)

    def _forward(self, number: int, lines: list[str]) -> None:
        lines = [_cut(line) for line in lines]
        if self.rank is None:
            self._backlog.extend((number, line) for line in lines)
            return
        if self.mode.stream:
            self._send(
                LineBatch(
                    self.rt.proc_id, self.host, self.rank, number, tuple(lines), self.now(),
                    self.mode.window,
                )
            )

    def _send(self, message: Any) -> None:
        if self.sink is not None:
            try:
                self.rt.send_port((self.sink, SINK_PORT), 0, M.OK, message)
            except Exception:
                pass  # the controller's link is gone (a simulated fault)


class _Dispatch(io.TextIOBase):
    """Stands in for ``sys.stdout``/``sys.stderr`` during a simulation."""

    def __init__(self, inner: TextIO, number: int) -> None:
        self.inner, self.number = inner, number

    def write(self, text: str) -> int:
        from ..core._current import current_runtime_or_none

        rt = current_runtime_or_none()
        handler = rt.ports.get(CONTROL_PORT) if rt is not None else None
        if isinstance(handler, SimProcLogs):
            handler.take(self.number, text)
            return len(text)
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def install_sim_proc(rt: Runtime, host: str, now: Callable[[], float]) -> None:
    """A simulated proc starts: with forwarding on, open its control port and make sure the
    dispatchers stand in for ``sys.stdout``/``sys.stderr``."""
    if not rt.config.enable_log_forwarding:
        from . import install_level_control

        install_level_control(rt, apply_level=False)  # process-wide here: left alone
        return
    rt.ports[CONTROL_PORT] = SimProcLogs(rt, host, now)
    if not isinstance(sys.stdout, _Dispatch):
        sys.stdout = _Dispatch(sys.stdout, STDOUT)
    if not isinstance(sys.stderr, _Dispatch):
        sys.stderr = _Dispatch(sys.stderr, STDERR)
