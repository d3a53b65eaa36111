"""A proc's last lines of output (``tail_log_lines``), kept where its spawner can read them
after the proc is gone, however it died.

The proc's log tee (``regency/_logs/_tee.py``) appends every line it reads from fds 1 and 2
to a ring in a file of the job directory, ``<jobdir>/<proc_id>.tail`` (mode 0600, in a
directory only the user can open), mapped into the proc's memory: appending is a copy into
the page cache, no system call. The pages belong to the file, not to the process, so a proc
killed by ``SIGKILL`` leaves them behind; when the spawner learns of the exit it reads the
ring (:func:`read_tail`) and removes the file.

The ring: a header (magic, lines kept, bytes ever written), then the data, records of one
stream byte (1 stdout, 2 stderr), the line's UTF-8 bytes (cut at the line limit) and
``\\n``. A line never holds ``\\n``, so after a wrap the first (partial) record is dropped at
its newline and the rest parse. A proc killed in the middle of an append (a window of
microseconds) can leave one garbled line at the oldest end.
"""

from __future__ import annotations

import mmap
import os
import struct

__all__ = ["STREAM_NAMES", "TailRing", "format_tail", "read_tail", "tail_path"]

_MAGIC = b"RGT1"
#: magic, lines kept, bytes written since the start (the write position is that modulo
#: the capacity).
_HEADER = struct.Struct("<4sIQ")
#: The most a ring takes (a sparse file: only pages written to are ever allocated).
MAX_RING_BYTES = 64 << 20

#: The streams by the number a record starts with (``regency._logs`` numbers them alike).
STREAM_NAMES = {1: "stdout", 2: "stderr"}


def tail_path(jobdir: str, proc_id: str) -> str:
    """Where the proc ``proc_id`` keeps its tail, in the job directory of its host."""
    return os.path.join(jobdir, f"{proc_id}.tail")


class TailRing:
    """The writer, in the proc: the last ``lines`` lines of its output, each cut at
    ``line_bytes`` bytes. Not thread-safe: the tee's reader calls it under its lock."""

    def __init__(self, path: str, lines: int, line_bytes: int) -> None:
        if lines <= 0:
            raise ValueError(f"a tail keeps at least one line (got {lines!r})")
        self._line_bytes = line_bytes
        # Room for one more record than kept: after a wrap the oldest one is partial.
        self._capacity = min((lines + 1) * (line_bytes + 2), MAX_RING_BYTES)
        # A record takes 2 bytes at least: more lines than that never fit (and the header
        # holds a 32-bit count).
        lines = min(lines, self._capacity // 2)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _HEADER.size + self._capacity)
            self._map = mmap.mmap(fd, _HEADER.size + self._capacity)
        finally:
            os.close(fd)
        self._lines = lines
        self._written = 0
        self._map[: _HEADER.size] = _HEADER.pack(_MAGIC, lines, 0)

    def append(self, stream: int, lines: list[str]) -> None:
        limit = self._line_bytes
        blob = b"".join(
            bytes((stream,)) + line.encode("utf-8", "replace")[:limit] + b"\n" for line in lines
        )
        capacity = self._capacity
        if len(blob) > capacity:  # only the newest bytes can stay
            self._written += len(blob) - capacity
            blob = blob[-capacity:]
        start = self._written % capacity
        first = min(capacity - start, len(blob))
        base = _HEADER.size
        self._map[base + start : base + start + first] = blob[:first]
        if first < len(blob):
            self._map[base : base + len(blob) - first] = blob[first:]
        self._written += len(blob)
        # The count last: a reader never sees a position past what was copied.
        self._map[: _HEADER.size] = _HEADER.pack(_MAGIC, self._lines, self._written)


def read_tail(path: str, remove: bool = True) -> tuple[tuple[str, str], ...]:
    """The ``(stream name, line)`` pairs a proc's ring at ``path`` holds, oldest first;
    ``()`` when there is no ring (tails were off, or another host's proc). Removes the file
    unless told not to."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ()
    if remove:
        try:
            os.unlink(path)
        except OSError:
            pass
    if len(data) < _HEADER.size:
        return ()
    magic, lines, written = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        return ()
    ring = data[_HEADER.size :]
    capacity = len(ring)
    if written <= capacity:
        body = ring[:written]
    else:
        start = written % capacity
        body = ring[start:] + ring[:start]
        body = body[body.find(b"\n") + 1 :]  # the oldest record may be partial
    records = body.split(b"\n")[:-1]  # every record ends with a newline
    out = []
    for record in records[-lines:] if lines else []:
        if not record:
            continue
        name = STREAM_NAMES.get(record[0], "output")
        out.append((name, record[1:].decode("utf-8", "replace")))
    return tuple(out)


def format_tail(tail: tuple[tuple[str, str], ...]) -> str:
    """The text a failure's message ends with: ``""`` for no lines, else a colon and one
    indented line each, ``[stdout] ...`` or ``[stderr] ...``."""
    if not tail:
        return ""
    count = len(tail)
    head = f"; its last {count} line{'s' if count != 1 else ''} of output:"
    return head + "".join(f"\n    [{name}] {line}" for name, line in tail)
