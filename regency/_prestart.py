"""The zygote, started at ``import regency`` so that it imports while the controller does.

A fresh interpreter's first ``spawn_procs`` used to wait for the zygote
(:mod:`regency.core._zygote`) to start and import the runtime: about a quarter of a second
here, most of the time to the first reply. Started here, before ``regency`` imports anything
heavy, it imports on the machine's other core while the controller imports, and is usually
ready by the time the script spawns. The controller's :class:`~regency.core._launcher.
ZygoteLauncher` adopts it (:func:`take`) and tells it what it learned later: the job
directory, torch. Each proc it forks gets the controller's environment and working directory
as they are at the spawn, not as they were at the import.

Not started: in a ``python -m ...`` process while it locates its module (the zygote, procs
and worker daemons run ``python -m regency...``), by the ``regency`` command except its
``worker``, off the main thread (the zygote's death
signal follows the thread that started it), off Linux, with ``REGENCY_ZYGOTE=0`` or
``REGENCY_RUNTIME=sim``. A zygote nobody adopted exits with this process: it reads EOF on
its stdin (and gets SIGTERM from ``PR_SET_PDEATHSIG``); at a clean exit it is also reaped. A
child forked from the controller never uses it (it is its parent's).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

#: Environment variables never handed to the zygote (see regency.core._launcher.PRIVATE_ENV).
_PRIVATE_ENV = ("REGENCY_SECRET",)


class Prestarted:
    """A zygote started at import: the process, the read end of its report pipe, and what
    fds 1 and 2 were when it started (a zygote whose stdout or stderr no longer matches the
    controller's is not adopted: procs inherit them from it)."""

    def __init__(self, popen: subprocess.Popen[bytes], report_fd: int) -> None:
        self.popen = popen
        self.report_fd = report_fd
        self.outputs = _outputs()
        #: The process that started it: a child forked from it must not use it.
        self.owner = os.getpid()

    def close(self) -> None:
        """Let it go, at once: a zygote nobody adopted has forked nothing and has no job
        directory to clean up, and may still be importing (EOF on its stdin would only be
        read after that, delaying a short script's exit)."""
        os.close(self.report_fd)
        self.popen.kill()
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        self.popen.wait()


_zygote: Prestarted | None = None
_lock = threading.Lock()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (``/proc/<pid>/stat`` field 22, clock ticks since boot): with the
    pid, an identity no later process can have. None when there is no such process, or only
    its zombie (it has exited), or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()  # the name may hold spaces, parens
        if fields[0] in (b"Z", b"X"):  # field 3, the state: exited
            return None
        return int(fields[19])  # field 22
    except (OSError, ValueError, IndexError):
        return None


def identity() -> str:
    """This process as the zygote's argv names its spawner: ``<pid>:<start time>`` (just
    the pid without ``/proc``). The zygote checks it when it starts: asked afterwards, its
    parent could already be init (see :mod:`regency.core._zygote`)."""
    pid = os.getpid()
    started = start_time(pid)
    return str(pid) if started is None else f"{pid}:{started}"


def _outputs() -> tuple[tuple[int, int] | None, ...]:
    found: list[tuple[int, int] | None] = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            found.append((st.st_dev, st.st_ino))
        except OSError:
            found.append(None)
    return tuple(found)


def wanted() -> bool:
    """Whether this import should start the zygote (see the module's docstring)."""
    argv = getattr(sys, "argv", ["-m"])  # embedded: no argv, no zygote
    return (
        sys.platform.startswith("linux")
        and argv[:1] != ["-m"]
        # the `regency` command: only its worker daemon spawns procs
        and (os.path.basename(argv[0]) != "regency" or argv[1:2] == ["worker"])
        and bool(sys.executable)
        and os.environ.get("REGENCY_ZYGOTE", "1") != "0"
        and os.environ.get("REGENCY_RUNTIME", "") != "sim"
        and threading.current_thread() is threading.main_thread()
    )


def start() -> None:
    """Start the zygote in the background, when :func:`wanted`. Never raises: without it the
    launcher starts one later, as before."""
    global _zygote
    if _zygote is not None or not wanted():
        return
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        return
    env = {k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", "regency.core._zygote", str(write_fd), identity()],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            close_fds=True,
            start_new_session=True,  # out of reach of the controller's SIGINT
            env=env,
        )
    except OSError:
        os.close(read_fd)
        return
    finally:
        os.close(write_fd)
    _zygote = Prestarted(popen, read_fd)
    atexit.register(_reap)


def take() -> Prestarted | None:
    """The zygote started at import, for the launcher to adopt (once); None when there is
    none, or when fds 1 or 2 changed since (then it is let go)."""
    global _zygote
    with _lock:
        found, _zygote = _zygote, None
    if found is None or found.owner != os.getpid():
        return None  # (a forked child: the zygote is its parent's)
    if found.popen.poll() is not None or found.outputs != _outputs():
        found.close()
        return None
    return found


def discard() -> None:
    """Let the zygote go (this process runs the simulator instead)."""
    found = take()
    if found is not None and found.owner == os.getpid():
        found.close()


def _reap() -> None:
    global _zygote
    with _lock:
        found, _zygote = _zygote, None
    if found is not None and found.owner == os.getpid():
        found.close()
