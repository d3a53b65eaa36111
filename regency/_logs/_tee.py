"""The proc's side of log forwarding: an fd-level tee of stdout and stderr.

At bootstrap, fds 1 and 2 become pipes, so everything the proc writes (Python, C extensions,
subprocesses that inherit the fds) passes through one reader thread. That thread sends
complete lines in batches to the controller's sink port (when streaming is on) and queues
each chunk for a second thread, which copies it to the original fd (the host's own output):
an output nobody reads stalls only that copy. Threads, not trio tasks: they keep forwarding
while the trio loop is busy, and a full pipe never blocks the loop.

Mode changes and flushes arrive on the control port and are applied as their frame is
dispatched (on the trio thread), after draining both pipes under the readers' lock: what was
written before a change is forwarded under the old mode, what is written after under the new
one.

The same reader also appends each line to the proc's output tail (``tail_log_lines``,
``core/_output_tail.py``) and each chunk to its capture files (``enable_file_capture``,
:mod:`._capture`); the tee runs when any of the three is on.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ..core import _messages as M
from ..core._output_tail import TailRing, tail_path
from ..core._ports import PortBase
from ._capture import FileCapture
from ._leftovers import cut_line, hand_over
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
    Streaming,
)

if TYPE_CHECKING:
    from ..core._runtime import Runtime

log = logging.getLogger("regency.logs")

#: Lines kept from before the spawner's Init arrives (sent then, if streaming is on).
_BACKLOG = 1000
#: Bytes held for a host output that does not drain; beyond, the host copy drops (the
#: controller still gets every line).
_HOST_BACKLOG = 16 << 20
_CHUNK = 65536


class _Stream:
    """One captured fd: the pipe we read and the host output we copy to."""

    def __init__(self, number: int, read_fd: int, host_fd: int) -> None:
        self.number = number
        self.read_fd = read_fd
        self.host_fd: int | None = host_fd
        self.partial = bytearray()
        #: Inside an over-long line whose head was already sent: drop until its newline.
        self.skipping = False
        #: Chunks read and not yet copied to the host's output (only the reader thread
        #: writes there, holding no lock: a stuck host output stalls nothing else).
        self.to_host: deque[bytes] = deque()
        self.to_host_bytes = 0
        self.dropped = 0

    def queue_for_host(self, chunk: bytes, ready: threading.Condition) -> None:
        if self.host_fd is None:
            return
        with ready:
            if self.to_host_bytes > _HOST_BACKLOG:
                self.dropped += len(chunk)  # the host's output has not drained for long
                return
            self.to_host.append(chunk)
            self.to_host_bytes += len(chunk)
            ready.notify()

    def copy_to_host(self, chunk: bytes) -> None:
        fd = self.host_fd
        if fd is None:
            return
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            self.host_fd = None  # the host's output is gone (a closed terminal or pipe)

    def split(self, chunk: bytes) -> list[str]:
        """Complete lines in ``chunk`` (with what came before), cut at MAX_LINE_BYTES."""
        lines: list[str] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self.skipping:
                self.skipping = False
            else:
                self.partial += chunk[start:end]
                lines.append(_decode(self.partial))
            self.partial.clear()
            start = end + 1
        if not self.skipping:
            self.partial += chunk[start:]
            if len(self.partial) > MAX_LINE_BYTES:
                lines.append(_decode(self.partial))
                self.partial.clear()
                self.skipping = True
        return lines

    def rest(self) -> list[str]:
        """An unterminated last line, at a flush."""
        if not self.partial:
            return []
        line = _decode(self.partial)
        self.partial.clear()
        return [line]


_decode = cut_line


class ProcLogs(PortBase):
    """The control port handler and the reader thread of one proc.

    ``_io`` serialises reading the pipes: the reader thread holds it while it reads and
    forwards a chunk; a control message (on the trio thread, as its frame is dispatched)
    holds it while it drains what the pipes hold and applies itself. So bytes written before
    a message arrived go out under the old mode, bytes written after (a later call's
    output) under the new one.
    """

    dests: frozenset[str] = frozenset()  # a link loss never fails this port

    def __init__(self, rt: Runtime, streams: list[_Stream]) -> None:
        self.rt = rt
        self.hostname = socket.gethostname()
        self.streams = streams
        self.mode = Mode(stream=False)
        self.rank: int | None = None
        self.sink: str | None = None
        #: The job's name, from the spawner's Init (procs this proc spawns get it too).
        self.job = ""
        #: The output tail (``tail_log_lines``) and capture files, when on.
        self.tail: TailRing | None = None
        self.capture: FileCapture | None = None
        self._backlog: deque[tuple[int, str, float]] = deque(maxlen=_BACKLOG)
        self._io = threading.Lock()
        #: Signals chunks queued for the host's output (its own lock, never held long).
        self._host_ready = threading.Condition()
        self._threads = [
            threading.Thread(target=self._run, name="regency-log-tee", daemon=True),
            threading.Thread(target=self._host_writer, name="regency-log-host", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    # -- control (on the trio thread) --------------------------------------------------------

    def deliver(self, index: int, status: int, value: Any) -> bool:
        message = value
        if not isinstance(message, (Init, SetMode, Flush)):
            raise TypeError(f"log control port takes Init, SetMode or Flush (got {message!r})")
        if isinstance(message, Flush):
            # Text Python still buffers (a print without a newline) belongs to the flush.
            # Only then: the loop must not wait on a pipe that a stuck host output filled.
            _flush_python_streams()
        with self._io:
            self._drain()
            self._obey(message)
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass

    # -- the reader thread -------------------------------------------------------------------

    def _run(self) -> None:
        fds = [s.read_fd for s in self.streams]
        by_fd = {s.read_fd: s for s in self.streams}
        while fds:
            try:
                ready, _, _ = select.select(fds, [], [])
            except InterruptedError:
                continue
            with self._io:
                for fd in ready:
                    try:
                        chunk = os.read(fd, _CHUNK)
                    except BlockingIOError:
                        continue  # a control message drained it first
                    if not chunk:  # every writer closed it: nothing more will come
                        fds.remove(fd)
                        continue
                    self._take(by_fd[fd], chunk)

    def _host_writer(self) -> None:
        """Its own thread: a host output that blocks (a pipe nobody reads) stalls only this
        copy, never the reading, the forwarding or the loop."""
        while True:
            with self._host_ready:
                while not any(s.to_host or s.dropped for s in self.streams):
                    self._host_ready.wait()
            self._copy_to_host()

    def _copy_to_host(self) -> None:
        for stream in self.streams:
            with self._host_ready:
                dropped, stream.dropped = stream.dropped, 0
            if dropped:
                stream.copy_to_host(
                    f"[regency: {dropped} bytes not copied here: this output was not being "
                    "read; the controller got every line]\n".encode()
                )
            while True:
                with self._host_ready:
                    if not stream.to_host:
                        break
                    chunk = stream.to_host.popleft()
                    stream.to_host_bytes -= len(chunk)
                stream.copy_to_host(chunk)

    def _take(self, stream: _Stream, chunk: bytes) -> None:
        stream.queue_for_host(chunk, self._host_ready)
        if self.capture is not None:
            self.capture.write(stream.number, chunk)
        lines = stream.split(chunk)
        if lines:
            self._lines(stream.number, lines)

    def _lines(self, number: int, lines: list[str]) -> None:
        """Lines as read, in order: into the tail, then forwarded."""
        if self.tail is not None:
            self.tail.append(number, lines)
        self._forward(number, lines)

    def complain(self, text: str) -> None:
        """Say ``text`` on the host's stderr (never through logging: see _capture)."""
        self.streams[-1].queue_for_host(text.encode(), self._host_ready)

    def _drain(self, *, final: bool = False) -> None:
        """Read what the pipes hold now: everything written before this call."""
        for stream in self.streams:
            while True:
                try:
                    chunk = os.read(stream.read_fd, _CHUNK)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                self._take(stream, chunk)
            if final:
                self._forward_rest(stream)

    def _forward_rest(self, stream: _Stream) -> None:
        rest = stream.rest()
        if rest:
            self._lines(stream.number, rest)

    def _forward(self, number: int, lines: list[str]) -> None:
        now = time.time()
        if self.rank is None:
            self._backlog.extend((number, line, now) for line in lines)
            return
        if self.mode.stream:
            batch = LineBatch(
                self.rt.proc_id, self.hostname, self.rank, number, tuple(lines), now,
                self.mode.window,
            )
            self._send(batch)

    def _send(self, message: Any) -> None:
        if self.sink is None:
            return
        try:
            self.rt.send_port((self.sink, SINK_PORT), 0, M.OK, message)
        except Exception as exc:  # the controller is gone: keep teeing to the host
            log.debug("could not forward log lines: %s", exc)

    def _announce(self) -> None:
        """Tell the sink whether we stream (it prints a dead proc's leftovers only then)."""
        assert self.rank is not None
        self._send(
            Streaming(self.rt.proc_id, self.hostname, self.rank, self.mode.stream, self.mode.window)
        )

    def _obey(self, message: Init | SetMode | Flush) -> None:
        if isinstance(message, Init):
            self.rank, self.sink, self.mode = message.rank, message.sink, message.mode
            self.job = message.job
            backlog, self._backlog = list(self._backlog), deque(maxlen=_BACKLOG)
            if self.capture is not None:
                self.capture.open(message.job, message.rank)
            if self.sink is None:  # teed for capture or a tail only: not forwarding
                return
            logging.getLogger().setLevel(message.mode.level)
            self._announce()
            if self.mode.stream:
                for number in (STDOUT, STDERR):
                    lines = [line for n, line, _ in backlog if n == number]
                    if lines:
                        self._forward(number, lines)
        elif isinstance(message, SetMode):
            logging.getLogger().setLevel(message.mode.level)
            self.mode = message.mode
            self._announce()
            try:
                self.rt.send_port(message.reply, self.rank or 0, M.OK, None)
            except Exception as exc:
                log.debug("could not acknowledge a log mode change: %s", exc)
        else:
            for stream in self.streams:
                self._forward_rest(stream)
            self._send(Flushed(message.reply, self.rt.address))

    # -- the end -----------------------------------------------------------------------------

    def final_drain(self, timeout: float = 2.0) -> None:
        """Forward what is still in the pipes (the proc is about to exit), from any thread;
        then, when the trio loop can still deliver its answer, wait (at most ``timeout``)
        for the sink to confirm it has the lines."""
        _flush_python_streams()
        if not self._io.acquire(timeout=timeout):
            return
        try:
            self._drain(final=True)
        finally:
            self._io.release()
        self._copy_to_host()  # the host writer may not run again
        rt = self.rt
        if self.sink is None or not self.mode.stream or rt.on_runtime_thread():
            return
        from ..core._future import Future

        confirmed: Future[None] = Future()
        try:
            port = rt.open_port(_Confirm(confirmed))
            self._send(Flushed(port, rt.address))
            confirmed.get(timeout)
        except Exception:
            pass


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


class _Confirm(PortBase):
    dests: frozenset[str] = frozenset()

    def __init__(self, fut: Any) -> None:
        self.fut = fut

    def deliver(self, index: int, status: int, value: Any) -> bool:
        self.fut.set_result(None)
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(exc)


_installed: ProcLogs | None = None


def install_tee(rt: Runtime) -> ProcLogs:
    """Capture fds 1 and 2 of this proc and serve the control port. Call once, in the proc,
    before its runtime serves."""
    global _installed
    assert _installed is None, "the log tee is installed once per process"
    streams = []
    for number in (STDOUT, STDERR):
        read_fd, write_fd = os.pipe()
        host_fd = os.dup(number)
        os.set_inheritable(host_fd, False)
        os.dup2(write_fd, number)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        streams.append(_Stream(number, read_fd, host_fd))
    for stream in (sys.stdout, sys.stderr):
        reconfigure: Callable[..., None] | None = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)  # a print is a write(2), as on a terminal
    # `level` is the user's: Regency's own loggers keep REGENCY_LOG_LEVEL (a root logger at
    # INFO must not make the runtime chatty).
    logging.getLogger("regency").setLevel(os.environ.get("REGENCY_LOG_LEVEL", "WARNING"))
    logs = ProcLogs(rt, streams)
    config = rt.config
    if config.tail_log_lines:
        try:
            logs.tail = TailRing(
                tail_path(rt.jobdir, rt.proc_id),
                config.tail_log_lines,
                MAX_LINE_BYTES + len(TRUNCATED_MARK),
            )
        except OSError as exc:
            logs.complain(f"[regency: no output tail for proc {rt.proc_id}: {exc}]\n")
    if config.enable_file_capture:
        logs.capture = FileCapture(
            config.file_capture_dir, config.file_capture_max_bytes, rt.proc_id, logs.complain
        )
    rt.ports[CONTROL_PORT] = logs
    hand_over(rt.jobdir, rt.proc_id, [s.read_fd for s in streams])
    logs.start()
    _installed = logs
    if logs.tail is not None or logs.capture is not None:
        # A proc told to stop exits through Python's finalization: what it wrote last
        # still reaches its files and its tail (forwarding has had its flush barrier).
        atexit.register(_drain_at_exit, logs)
    real_exit = os._exit

    def exit_after_drain(status: int) -> NoReturn:
        # os._exit skips every cleanup; the lines printed just before it matter most.
        try:
            logs.final_drain()
        finally:
            real_exit(status)

    os._exit = exit_after_drain
    return logs


def _drain_at_exit(logs: ProcLogs) -> None:
    logs.sink = None  # the runtime has stopped: nothing more is sent, nor confirmed
    logs.final_drain(timeout=1.0)


def installed() -> ProcLogs | None:
    return _installed
