"""File capture (``enable_file_capture``): each proc's stdout and stderr, as written, also go
to files on its host.

Layout: ``<file_capture_dir>/<job>/<proc_id>.rank<R>.stdout`` and ``.stderr``, where the
directory defaults to ``$TMPDIR/regency-logs-<user>``, ``<job>`` is the controller's start
time and its proc id (``20260501-120000-c4242``: every proc of one job, nested ones and
those on other hosts included, writes under the same name), and ``R`` is the proc's rank in
the mesh it was spawned in. Directories are made 0700 and files 0600 (output may hold
secrets); an existing base directory that another user owns, or that is a symlink, is
refused.

A file that reaches ``file_capture_max_bytes`` is renamed with ``.1`` appended (replacing
the previous ``.1``) and started again, at a line's end where the chunk has one: a chatty
proc keeps at most twice that per stream. The bytes are the proc's own, unchanged (no
prefix, no timestamp).

The rank and the job's name come with the spawner's first message (``Init``), which
arrives right after the proc connects; what the proc writes before it is held (up to
:data:`_PENDING` bytes per stream) and written first. Everything here runs on the tee's
reader thread, or under its lock: it must never log (that writes to the very pipe the
thread drains), so a failure is said once on the host's own stderr, through the tee.
"""

from __future__ import annotations

import getpass
import os
import stat
import tempfile
import time
from collections.abc import Callable

from ._records import STDERR, STDOUT, STREAM_NAMES

#: Bytes held per stream before the rank is known.
_PENDING = 1 << 20


def default_dir() -> str:
    """``$TMPDIR/regency-logs-<user>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return os.path.join(tempfile.gettempdir(), f"regency-logs-{user}")


def job_name(proc_id: str, started: float | None = None) -> str:
    """A job's name from its controller's proc id and start time (local time)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    return f"{stamp}-{proc_id}"


def file_stem(proc_id: str, rank: int) -> str:
    return f"{proc_id}.rank{rank}"


def _private_dir(path: str, strict: bool) -> None:
    """Make ``path`` (mode 0700); an existing one must be a directory and, when ``strict``
    (the default directory, in a temporary directory all users share), ours, not a symlink
    and not writable by others."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(path) if strict else os.stat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symlink?)")
    if not strict:
        return
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o022:
        raise PermissionError(
            f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):o}); "
            "make it 0700 or set file_capture_dir"
        )


class _File:
    """One stream's file, rotated at ``limit`` bytes."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit
        self.fd = self._open(os.O_APPEND)
        self.size = os.fstat(self.fd).st_size

    @staticmethod
    def _flags() -> int:
        return os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC

    def _open(self, extra: int) -> int:
        return os.open(self.path, self._flags() | extra, 0o600)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.limit - self.size
            if len(view) <= room:
                self._write(view)
                return
            cut = bytes(view[: max(room, 0)]).rfind(b"\n") + 1
            if cut == 0:
                if self.size:
                    self._rotate()
                    continue
                cut = room  # one line longer than the limit: cut it
            self._write(view[:cut])
            view = view[cut:]
            self._rotate()

    def _write(self, view: memoryview) -> None:
        while view:
            written = os.write(self.fd, view)
            self.size += written
            view = view[written:]

    def _rotate(self) -> None:
        os.close(self.fd)
        os.replace(self.path, self.path + ".1")
        self.fd = self._open(os.O_TRUNC)
        self.size = 0

    def close(self) -> None:
        os.close(self.fd)


class FileCapture:
    """A proc's two capture files. ``complain(text)`` puts a line on the host's stderr
    without logging (see the module's docstring)."""

    def __init__(self, base: str, limit: int, proc_id: str, complain: Callable[[str], None]) -> None:
        self._base = base or default_dir()
        #: The default directory lies where every user may create files: trust no one's.
        self._strict = not base
        self._limit = limit
        self._proc_id = proc_id
        self._complain = complain
        self._files: dict[int, _File] | None = None
        self._pending: dict[int, bytearray] = {STDOUT: bytearray(), STDERR: bytearray()}
        self._held_back = 0
        #: Set when capture failed (the reason was said): nothing more is written.
        self.broken = False

    def write(self, stream: int, chunk: bytes) -> None:
        if self.broken:
            return
        files = self._files
        if files is None:
            pending = self._pending[stream]
            if len(pending) + len(chunk) > _PENDING:
                self._held_back += len(chunk)
            else:
                pending += chunk
            return
        try:
            files[stream].write(chunk)
        except OSError as exc:
            self._fail(f"could not write {files[stream].path}: {exc}")

    def open(self, job: str, rank: int) -> None:
        """The rank and job are known: open the files, write what was held."""
        if self._files is not None or self.broken:
            return
        directory = os.path.join(self._base, job or job_name(self._proc_id.split(".", 1)[0]))
        stem = os.path.join(directory, file_stem(self._proc_id, rank))
        try:
            os.makedirs(os.path.dirname(self._base) or ".", exist_ok=True)
            _private_dir(self._base, self._strict)
            _private_dir(directory, self._strict)
            self._files = {
                number: _File(f"{stem}.{STREAM_NAMES[number]}", self._limit)
                for number in (STDOUT, STDERR)
            }
        except OSError as exc:
            self._fail(f"could not open the capture files in {directory}: {exc}")
            return
        pending, self._pending = self._pending, {}
        if self._held_back:
            note = (
                f"[regency: {self._held_back} bytes written before the proc learned its rank "
                "are not in this file]\n"
            ).encode()
            pending[STDERR] += note
        for number, data in pending.items():
            if data:
                self.write(number, bytes(data))

    def _fail(self, why: str) -> None:
        self.broken = True
        self._pending = {}
        if self._files is not None:
            for file in self._files.values():
                try:
                    file.close()
                except OSError:
                    pass
        self._complain(f"[regency: file capture of proc {self._proc_id} is off: {why}]\n")
