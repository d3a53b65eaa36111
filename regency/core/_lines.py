"""Whole lines from procs: ``sys.stdout``/``sys.stderr`` of a proc write each completed line
in one ``write(2)``.

Procs share their controller's stdout and stderr (a terminal, a Jupyter kernel's captured
pipe). Python's own streams do not keep a line together: block-buffered, they cut at 8 KiB
boundaries; line-buffered, ``print`` still writes the text and its newline in two system
calls. Either way another rank's output can land in between, fusing two lines into one. A
write of up to ``PIPE_BUF`` (4 KiB) bytes to a pipe is atomic, so writing whole lines in one
call keeps every line of up to 4 KiB intact, whatever the other ranks do.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from typing import Any


class WholeLines(io.TextIOBase):
    """A text stream over a file descriptor that holds back a partial line until its newline
    (or a flush) and writes completed lines in one call."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream
        self._fd: int = stream.fileno()
        self._pending: list[str] = []
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        encoding: str = self._stream.encoding
        return encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        errors: str | None = self._stream.errors
        return errors

    @property
    def buffer(self) -> Any:
        """The binary stream underneath (flushed of our text first, to keep the order)."""
        self.flush()
        return self._stream.buffer

    def __getattr__(self, name: str) -> Any:
        # The rest of the original stream's interface (name, mode, reconfigure, ...).
        return getattr(self._stream, name)

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._pending.append(text)
            if "\n" not in text:
                return len(text)
            joined = "".join(self._pending)
            cut = joined.rindex("\n") + 1
            self._pending = [joined[cut:]] if cut < len(joined) else []
            self._write(joined[:cut])
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                joined, self._pending = "".join(self._pending), []
                self._write(joined)

    def _write(self, text: str) -> None:
        self._stream.flush()  # anything written to the original stream goes first
        data = memoryview(text.encode(self.encoding, self.errors or "strict"))
        while data:
            data = data[os.write(self._fd, data) :]


def whole_lines() -> None:
    """Replace this process's ``sys.stdout`` and ``sys.stderr`` with :class:`WholeLines`."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, WholeLines):
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        setattr(sys, name, WholeLines(stream))
