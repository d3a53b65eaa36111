"""An interactive shell on a remote host (Monarch's ``monarch.job.shell``).

``shell(host)`` starts a proc on ``host`` (a one-host mesh), and in it an interactive shell on
a fresh pseudo-terminal; this process's terminal is put in raw mode and wired to it through
two actor ports (keystrokes and window sizes one way, output and the exit status the other).
Returns the shell's exit status (128 + N when a signal N ended it).

EOF on this side's stdin hangs up the remote terminal: the shell and its foreground job get
SIGHUP, then SIGTERM and SIGKILL if they linger. A failure to write this side's stdout
(``BrokenPipeError``) ends the session and is raised.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import signal
import struct
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from typing import Any, NamedTuple

import trio

from ..core._channel import Channel, Port, PortReceiver
from ..core._context import current_rank
from ..core._endpoint import Actor, endpoint
from ._background import Background

_CHUNK = 16 * 1024
#: Seconds a hung-up shell gets before SIGTERM, and again before SIGKILL.
_GRACE = 1.0


# Keyboard side -> shell.
class _Keys(NamedTuple):
    data: bytes


class _Resize(NamedTuple):
    rows: int
    columns: int


class _HangUp(NamedTuple):
    """The user's stdin ended: hang up the terminal."""


# Shell -> screen side.
class _Screen(NamedTuple):
    data: bytes


class _Exited(NamedTuple):
    status: int


class _Broke(NamedTuple):
    message: str


def _set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _terminal_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


def _exit_status(returncode: int) -> int:
    return returncode if returncode >= 0 else min(128 - returncode, 255)


class _ShellSession(Actor):
    """Runs one interactive shell on a pseudo-terminal in its proc."""

    def __init__(self) -> None:
        self._tasks = Background()
        self._started = False

    @endpoint
    async def start(
        self,
        screen: Port[Any],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        term: str,
        size: tuple[int, int],
    ) -> Port[Any]:
        """Start the shell; output goes to ``screen``; returns the port keystrokes go to."""
        if self._started:
            raise RuntimeError("this shell session has already started a shell")
        self._started = True
        point = current_rank()
        child_env = {
            **os.environ,
            **{f"REGENCY_RANK_{dim}": str(point[dim]) for dim in point},
            **{
                f"REGENCY_SIZE_{dim}": str(n)
                for dim, n in zip(point.extent.labels, point.extent.sizes, strict=True)
            },
            **(env or {}),
            "TERM": term,
        }
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        program = child_env.get("SHELL") or "/bin/sh"
        master, slave = os.openpty()
        try:
            _set_size(master, *size)
            setsid = shutil.which("setsid")
            # The shell leads a session of its own whose controlling terminal is the pty, so
            # job control works and a hang-up reaches it and its jobs.
            if setsid is not None:
                argv, preexec = [setsid, "--ctty", program, "-i"], None
            else:
                argv, preexec = [program, "-i"], _take_terminal
            process = await trio.lowlevel.open_process(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=child_env,
                preexec_fn=preexec,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        keys, keyboard = Channel[Any].open()
        await self._tasks.start_soon(_run_session, master, process, keyboard, screen)
        return keys

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await self._tasks.aclose()


def _take_terminal() -> None:  # pragma: no cover - only where setsid(1) is missing
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _groups(master: int, process: trio.Process) -> set[int]:
    """The process groups to hang up: the shell's and the terminal's foreground job."""
    groups = {process.pid}
    with contextlib.suppress(OSError):
        groups.add(os.tcgetpgrp(master))
    groups.discard(os.getpgrp())
    return {g for g in groups if g > 1}


def _signal(groups: set[int], sig: int) -> set[int]:
    """Send ``sig`` to each group (0: only look); the groups that still exist."""
    alive = set()
    for group in groups:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        alive.add(group)
    return alive


async def _hang_up(master: int, process: trio.Process) -> None:
    """SIGHUP the shell and its foreground job; SIGTERM, then SIGKILL, what lingers."""
    groups = _groups(master, process)
    for sig in (signal.SIGHUP, signal.SIGTERM):
        groups = _signal(groups, sig)
        if not groups:
            return
        with trio.move_on_after(_GRACE):
            await process.wait()
            while groups := _signal(groups, 0):  # a job may outlive its shell briefly
                await trio.sleep(0.02)
            return
    _signal(groups, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


async def _run_session(
    master: int, process: trio.Process, keyboard: PortReceiver[Any], screen: Port[Any]
) -> None:
    terminal = trio.lowlevel.FdStream(master)  # owns (and closes) the master fd

    async def to_screen() -> None:
        while True:
            try:
                data = await terminal.receive_some(_CHUNK)
            except trio.BrokenResourceError as error:
                if getattr(error.__cause__, "errno", None) == errno.EIO:
                    break  # every process let go of the terminal
                raise
            if not data:
                break
            screen.send(_Screen(data))
        screen.send(_Exited(_exit_status(await process.wait())))

    async def from_keyboard() -> None:
        while True:
            message = await keyboard.recv()
            if isinstance(message, _Keys):
                await terminal.send_all(message.data)
            elif isinstance(message, _Resize):
                _set_size(master, message.rows, message.columns)
            elif isinstance(message, _HangUp):
                await _hang_up(master, process)
                return

    try:
        async with trio.open_nursery() as nursery:

            async def then_done() -> None:
                await to_screen()
                nursery.cancel_scope.cancel()

            nursery.start_soon(then_done)
            nursery.start_soon(from_keyboard)
    except Exception as error:
        with contextlib.suppress(Exception):
            screen.send(_Broke(f"{type(error).__name__}: {error}"))
        raise
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                await _hang_up(master, process)
            await process.wait()
            await terminal.aclose()


# -- the user's side -----------------------------------------------------------------------


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _on_resize(stdin: int, keys: Port[Any]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers live on the main thread only
        return

    def resized(signum: int, frame: Any) -> None:
        keys.send(_Resize(*_terminal_size(stdin)))

    previous = signal.signal(signal.SIGWINCH, resized)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)


def _pump_keys(stdin: int, keys: Port[Any], wake: int) -> None:
    """Forward stdin to the shell until EOF (then hang up) or until ``wake`` is readable."""
    while True:
        ready, _, _ = select.select([stdin, wake], [], [])
        if wake in ready:
            return
        try:
            data = os.read(stdin, _CHUNK)
        except OSError:
            data = b""
        if not data:
            keys.send(_HangUp())
            return
        keys.send(_Keys(data))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def shell(
    host_mesh_singleton: Any, *, env: dict[str, str] | None = None, workdir: str | None = None
) -> int:
    """Run an interactive shell on the one host of ``host_mesh_singleton``; its exit status.

    ``env`` adds environment variables; ``workdir`` is where it starts (default: this
    process's working directory, where that exists on the remote host)."""
    if host_mesh_singleton.size() != 1:
        raise ValueError(
            "shell() needs a singleton HostMesh (one host; got "
            f"{host_mesh_singleton.size()}): slice the mesh to one host first"
        )
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout.flush()
    screen, display = Channel[Any].open()
    procs = host_mesh_singleton.spawn_procs()
    wake_r, wake_w = os.pipe()
    pump: threading.Thread | None = None
    try:
        session = procs.spawn("shell", _ShellSession)
        keys: Port[Any] = session.start.call_one(
            screen,
            env,
            workdir,
            os.getcwd(),
            os.environ.get("TERM", "xterm-256color"),
            _terminal_size(stdin),
        ).get()
        with _raw(stdin), _on_resize(stdin, keys):
            pump = threading.Thread(
                target=_pump_keys, args=(stdin, keys, wake_r), name="regency-shell-keys"
            )
            pump.start()
            _write_all(stdout, b"\r")
            while True:
                message = display.recv().get()
                if isinstance(message, _Screen):
                    try:
                        _write_all(stdout, message.data)
                    except OSError:
                        with contextlib.suppress(Exception):
                            keys.send(_HangUp())
                        raise
                elif isinstance(message, _Exited):
                    return int(message.status)
                elif isinstance(message, _Broke):
                    raise RuntimeError(f"the remote shell session failed: {message.message}")
    finally:
        os.write(wake_w, b"x")
        if pump is not None:
            pump.join()
        os.close(wake_r)
        os.close(wake_w)
        procs.stop().get()
