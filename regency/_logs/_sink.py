"""The controller's side of log forwarding: the sink port that prints what procs send.

Batches arrive as PORT frames and are handled on arrival, on the runtime's trio thread, in
the order each proc sent them. Without a window each line prints at once as
``[{hostname} {proc}] [{rank}] line`` on the controller's stdout or stderr, matching where it
was written. With a window, lines are grouped per stream (:mod:`._aggregate`) and printed as
one block when the window closes or at a flush.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import trio

from ..core import _messages as M
from ..core._ports import PortBase
from ._aggregate import Aggregator
from ._leftovers import LeftoverWatch
from ._records import (
    SINK_PORT,
    STDERR,
    STDOUT,
    Flushed,
    LineBatch,
    PrintWindows,
    Streaming,
)

if TYPE_CHECKING:
    from ..core._runtime import Runtime


def _target(stream: int) -> TextIO:
    return sys.stderr if stream == STDERR else sys.stdout


class LogSink(PortBase):
    """A port handler in the root runtime (reserved id :data:`SINK_PORT`)."""

    dests: frozenset[str] = frozenset()

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: Per stream: the open window's aggregator and its length in seconds.
        self._windows: dict[int, tuple[Aggregator, float]] = {}
        #: Lines printed (or grouped), for tests and benchmarks.
        self.received = 0
        #: Each proc's latest mode, by proc id.
        self._streaming: dict[str, Streaming] = {}
        #: Text (and acknowledgements) waiting for the writer thread, in order.
        self._writer: queue.SimpleQueue[tuple[int | Callable[[], None], str]] | None = None

    def leftovers(self, proc_id: str, stream: int, lines: list[str]) -> None:
        """What a dead proc had written and nobody had read (on the trio thread)."""
        mode = self._streaming.get(proc_id)
        if mode is None or not mode.on:
            return
        self._lines(
            LineBatch(proc_id, mode.hostname, mode.rank, stream, tuple(lines), time.time(),
                      mode.window)
        )

    def deliver(self, index: int, status: int, value: Any) -> bool:
        message = value
        if isinstance(message, LineBatch):
            self._lines(message)
        elif isinstance(message, Streaming):
            self._streaming[message.proc_id] = message
        elif isinstance(message, Flushed):
            self._ack(message.reply, message.origin)
        elif isinstance(message, PrintWindows):
            self.flush()
            reply = message.reply
            # Acknowledged once everything before it is written out: the barrier holds.
            self._emit(lambda: self._ack(reply, None))
        return False

    def _ack(self, reply: tuple[str, int], value: str | None) -> None:
        try:
            self.rt.send_port(reply, 0, M.OK, value)
        except Exception:
            pass  # whoever asked is gone

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass

    def _lines(self, batch: LineBatch) -> None:
        self.received += len(batch.lines)
        if batch.window is None:
            prefix = f"[{batch.hostname} {batch.proc_id}] [{batch.rank}] "
            self._emit(batch.stream, "".join(f"{prefix}{line}\n" for line in batch.lines))
            return
        entry = self._windows.get(batch.stream)
        if entry is not None and entry[1] != batch.window:
            self._print_window(batch.stream)  # the window changed: close the old one
            entry = None
        if entry is None:
            entry = (Aggregator(), batch.window)
            self._windows[batch.stream] = entry
            self.rt.nursery.start_soon(self._close_after, batch.stream, entry)
        aggregator = entry[0]
        for line in batch.lines:
            aggregator.add(batch.rank, line, batch.timestamp)

    async def _close_after(self, stream: int, entry: tuple[Aggregator, float]) -> None:
        await trio.sleep(entry[1])
        if self._windows.get(stream) is entry:  # not already printed by a flush or a change
            self._print_window(stream)

    def _print_window(self, stream: int) -> None:
        entry = self._windows.pop(stream, None)
        if entry is not None and len(entry[0]):
            self._emit(stream, entry[0].render())

    def _emit(self, stream: int | Callable[[], None], text: str = "") -> None:
        """Write ``text`` to the controller's ``stream`` (or run a callable) in order: on a
        writer thread where there is one, so a controller output that blocks stalls only
        that thread, not the runtime; at once otherwise (the simulator, deterministic)."""
        writer = self._writer
        if writer is not None:
            writer.put((stream, text))
        elif callable(stream):
            stream()
        else:
            _write(_target(stream), text)

    def start_writer(self) -> None:
        self._writer = queue.SimpleQueue()
        threading.Thread(target=self._write_forever, name="regency-log-sink", daemon=True).start()

    def _write_forever(self) -> None:
        assert self._writer is not None
        while True:
            stream, text = self._writer.get()
            if callable(stream):
                stream()
            else:
                _write(_target(stream), text)

    def flush(self) -> None:
        """Print every open window now."""
        for stream in (STDOUT, STDERR):
            self._print_window(stream)


def _write(out: TextIO, text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        pass  # the controller's own output is closed


def sink_of(rt: Runtime) -> LogSink | None:
    handler: Any = rt.ports.get(SINK_PORT)
    return handler if isinstance(handler, LogSink) else None


def ensure_sink(rt: Runtime) -> None:
    """Open the sink port of a root runtime (on its trio thread; idempotent)."""
    if SINK_PORT in rt.ports:
        return
    sink = LogSink(rt)
    rt.ports[SINK_PORT] = sink
    if os.path.isdir(rt.jobdir):  # a real controller (the simulator's jobdir is fictional)
        sink.start_writer()

        def deliver(proc_id: str, stream: int, lines: list[str]) -> None:
            try:
                rt.call_soon(lambda: sink.leftovers(proc_id, stream, lines))
            except RuntimeError:
                pass  # the runtime has stopped (the program is exiting)

        try:
            LeftoverWatch(rt, deliver)
        except OSError as exc:
            logging.getLogger("regency.logs").info("no leftover watch: %s", exc)
