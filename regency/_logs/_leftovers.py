"""What a proc wrote just before it died: read from its pipes after it is gone.

A proc's tee thread forwards each chunk the moment it is written, but a proc killed by a
signal (``SIGKILL``, a segfault) takes with it whatever its thread had not read yet. So each
proc on the controller's host also hands duplicates of its pipes' read ends to the
controller (``SCM_RIGHTS`` over a unix socket in the job directory, which only the user can
open). The controller never reads them while the proc lives: one thread polls them for
``POLLHUP``, which a pipe reports once every writer is gone (the proc and any subprocess that
inherited its output), and only then reads what is left and hands it to the sink.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._records import MAX_LINE_BYTES, STDERR, STDOUT, TRUNCATED_MARK

if TYPE_CHECKING:
    from ..core._runtime import Runtime

SOCKET_NAME = "logs.sock"

#: (proc_id, stream, complete lines) of a dead proc's last output.
Leftovers = Callable[[str, int, list[str]], None]


def hand_over(jobdir: str, proc_id: str, fds: list[int]) -> None:
    """In a proc: give the controller duplicates of ``fds`` (stdout's and stderr's read
    ends). Best effort: a proc on another host, or an old controller, has no socket."""
    path = os.path.join(jobdir, SOCKET_NAME)
    if not os.path.exists(path):
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            socket.send_fds(sock, [proc_id.encode()], fds)
            sock.recv(1)  # the controller holds them now
    except OSError:
        pass


def cut_line(raw: bytes | bytearray) -> str:
    """A line as forwarded: decoded, cut at MAX_LINE_BYTES and marked."""
    if len(raw) > MAX_LINE_BYTES:
        return bytes(raw[:MAX_LINE_BYTES]).decode("utf-8", "replace") + TRUNCATED_MARK
    return raw.decode("utf-8", "replace").rstrip("\r")


class LeftoverWatch:
    """In the controller: receives procs' read ends and reads each once its proc is gone."""

    def __init__(self, rt: Runtime, deliver: Leftovers) -> None:
        self._deliver = deliver
        self._path = os.path.join(rt.jobdir, SOCKET_NAME)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._path)
        self._listener.listen(64)
        self._poll = select.poll()
        self._watched: dict[int, tuple[str, int]] = {}  # fd -> (proc_id, stream)
        self._poll.register(self._listener.fileno(), select.POLLIN)
        threading.Thread(target=self._run, name="regency-log-leftovers", daemon=True).start()

    def _run(self) -> None:
        listener = self._listener.fileno()
        while True:
            for fd, events in self._poll.poll():
                if fd == listener:
                    self._accept()
                elif events & (select.POLLHUP | select.POLLERR):
                    self._drain(fd)

    def _accept(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.settimeout(5)
            try:
                message, fds, _, _ = socket.recv_fds(conn, 1024, 2)
                conn.sendall(b"k")
            except OSError:
                return
        proc_id = message.decode(errors="replace")
        for fd, stream in zip(fds, (STDOUT, STDERR), strict=False):
            self._watched[fd] = (proc_id, stream)
            self._poll.register(fd, 0)  # POLLHUP and POLLERR are always reported

    def _drain(self, fd: int) -> None:
        self._poll.unregister(fd)
        proc_id, stream = self._watched.pop(fd)
        os.set_blocking(fd, False)
        data = b""
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        finally:
            os.close(fd)
        if data:
            raw = data.split(b"\n")
            if raw[-1] == b"":
                raw.pop()
            self._deliver(proc_id, stream, [cut_line(line) for line in raw])
