"""Starting procs: the ``ProcLauncher`` interface and its local-OS-process implementation.

The runtime starts procs only through this interface, so the simulator (and multi-host
workers) can provide their own.
"""

from __future__ import annotations

import abc
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ._bootstrap_command import BootstrapCommand

#: Environment variables never handed to a proc or the zygote: the job secret reaches procs
#: only through their bootstrap record (a pipe), never the environment, where any process of
#: the same user (and ``ps e`` for some) could read it.
PRIVATE_ENV = ("REGENCY_SECRET",)


def child_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``extra``, without :data:`PRIVATE_ENV`."""
    env = {**os.environ, **(extra or {})}
    for name in PRIVATE_ENV:
        env.pop(name, None)
    return env


def _reap_later(popen: subprocess.Popen[bytes]) -> None:
    """Wait for ``popen`` on a thread of its own, unless it has been waited for: a child
    that exits after the task that watched it was cancelled (the runtime stopped) would
    otherwise stay a zombie of this process for as long as it lives (a test run had 20)."""
    if popen.returncode is None:
        threading.Thread(target=popen.wait, name="regency-reap", daemon=True).start()


class ProcHandle(abc.ABC):
    pid: int
    #: True when the proc runs on another host: a kill cannot be confirmed locally.
    remote = False

    @abc.abstractmethod
    def kill(self) -> None: ...

    @abc.abstractmethod
    def terminate(self) -> None: ...


class ProcLauncher(abc.ABC):
    #: The address of the worker daemon that starts this launcher's procs (a host of
    #: ``attach_to_workers``); None: procs of this host, or the simulator's.
    worker: str | None = None

    def address_for(self, proc_id: str) -> str | None:
        """The address a new proc should listen on, when this launcher decides it (the
        simulator does); None lets the runtime pick one from its transport settings."""
        return None

    @abc.abstractmethod
    def launch(
        self,
        bootstrap: Mapping[str, Any],
        env: Mapping[str, str],
        on_exit: Callable[[int], None],
    ) -> ProcHandle:
        """Start a proc that runs :mod:`regency.core._bootstrap` with ``bootstrap``.

        ``on_exit(returncode)`` is called on the runtime's trio thread when it exits
        (negative: killed by that signal). Must be called on the runtime's trio thread.
        """


class _Popen(ProcHandle):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid

    def kill(self) -> None:
        try:
            self.popen.kill()
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        try:
            self.popen.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass


class LocalLauncher(ProcLauncher):
    """Starts each proc as ``python -m regency.core._bootstrap`` on this host.

    The bootstrap record (including the job secret) goes through the child's stdin, never the
    environment or argv, and stdin stays open: when this process dies, however it dies, the
    child reads EOF and exits. On Linux the child also sets ``PR_SET_PDEATHSIG``. The child
    runs in a session of its own and ignores SIGINT: the controller decides when it stops.
    ``Popen``
    runs on the runtime's own long-lived thread because the death signal follows the thread
    that forked, not the process.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        executable: str | None = None,
        command: BootstrapCommand | None = None,
    ) -> None:
        self._nursery = nursery
        #: The command procs run (``spawn_procs(bootstrap_command=...)``; else the Python
        #: interpreter of ``HostMesh.with_python_executable``, else this one).
        self._command = command or BootstrapCommand(executable or sys.executable)

    def launch(
        self,
        bootstrap: Mapping[str, Any],
        env: Mapping[str, str],
        on_exit: Callable[[int], None],
    ) -> ProcHandle:
        command = self._command
        child_env = child_environ({**command.env, **env})
        popen = subprocess.Popen(
            command.argv(),
            executable=command.program,
            stdin=subprocess.PIPE,
            env=child_env,
            close_fds=True,
            # A session of its own: a SIGINT meant for the controller's process group (a
            # terminal's Ctrl-C, Jupyter's Interrupt) must not reach procs.
            start_new_session=True,
        )
        assert popen.stdin is not None
        popen.stdin.write(json.dumps(dict(bootstrap)).encode() + b"\n")
        popen.stdin.flush()
        self._nursery.start_soon(self._watch, popen, on_exit)
        return _Popen(popen)

    async def _watch(self, popen: subprocess.Popen[bytes], on_exit: Callable[[int], None]) -> None:
        try:
            if hasattr(os, "pidfd_open"):
                fd = os.pidfd_open(popen.pid)
                try:
                    await trio.lowlevel.wait_readable(fd)
                finally:
                    trio.lowlevel.notify_closing(fd)
                    os.close(fd)
                code = popen.wait()
            else:  # pragma: no cover - macOS
                code = await trio.to_thread.run_sync(popen.wait, abandon_on_cancel=True)
        finally:
            if popen.stdin is not None:
                try:
                    popen.stdin.close()  # the proc reads EOF and exits
                except OSError:
                    pass
            _reap_later(popen)  # cancelled (the runtime stopped) before the proc exited
        on_exit(code)


class _ZygoteHandle(ProcHandle):
    def __init__(self, on_exit: Callable[[int], None]) -> None:
        self.pid = 0  # known once the zygote reports the fork
        self.on_exit = on_exit
        self._kill_when_known: int | None = None

    def _signal(self, sig: int) -> None:
        if self.pid == 0:
            self._kill_when_known = sig
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)


class ZygoteLauncher(ProcLauncher):
    """Forks procs from a pre-imported zygote process (Linux): milliseconds per proc instead
    of a fresh interpreter and imports each. See :mod:`regency.core._zygote`.

    Falls back to :class:`LocalLauncher` if the zygote cannot start or dies.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        #: Removed by the zygote when the controller dies without cleaning up ("" for none).
        self._jobdir = ""
        self._fallback = LocalLauncher(nursery)
        self._popen: subprocess.Popen[bytes] | None = None
        self._ids = itertools.count()
        self._by_id: dict[int, _ZygoteHandle] = {}
        self._by_pid: dict[int, _ZygoteHandle] = {}
        self._broken = False

    def remove_when_orphaned(self, jobdir: str) -> None:
        """Have the zygote remove ``jobdir`` if this process dies without doing so. Before
        :meth:`start`."""
        self._jobdir = jobdir

    def start(self) -> None:
        """Start the zygote now (it imports in the background), or adopt the one started at
        ``import regency`` (:mod:`regency._prestart`). Idempotent."""
        if self._popen is not None or self._broken:
            return
        from .. import _prestart

        early = _prestart.take()
        if early is not None:
            self._popen = early.popen
            control = []
            if self._jobdir:
                control.append({"jobdir": self._jobdir})
            if "torch" in sys.modules:  # as a zygote started now would (see _zygote)
                control.append({"import": "torch"})
            try:
                assert early.popen.stdin is not None
                for message in control:
                    early.popen.stdin.write(json.dumps(message).encode() + b"\n")
                early.popen.stdin.flush()
            except OSError:
                pass  # it died: _read_reports sees EOF and falls back
            self._nursery.start_soon(self._read_reports, early.report_fd, early.popen)
            return
        read_fd, write_fd = os.pipe()
        try:
            self._popen = subprocess.Popen(
                # A controller that imported torch forks procs with torch imported too.
                [sys.executable, "-m", "regency.core._zygote", str(write_fd),
                 _prestart.identity(), self._jobdir]
                + (["torch"] if "torch" in sys.modules else []),
                stdin=subprocess.PIPE,
                pass_fds=(write_fd,),
                close_fds=True,
                start_new_session=True,  # out of reach of the controller's SIGINT
                env=child_environ(),
            )
        except OSError:
            os.close(read_fd)
            self._broken = True
            return
        finally:
            os.close(write_fd)
        self._nursery.start_soon(self._read_reports, read_fd, self._popen)

    def launch(
        self,
        bootstrap: Mapping[str, Any],
        env: Mapping[str, str],
        on_exit: Callable[[int], None],
    ) -> ProcHandle:
        self.start()
        if self._broken or self._popen is None or self._popen.stdin is None:
            return self._fallback.launch(bootstrap, env, on_exit)
        request_id = next(self._ids)
        handle = _ZygoteHandle(on_exit)
        self._by_id[request_id] = handle
        request: dict[str, Any] = {
            "id": request_id,
            "record": dict(bootstrap),
            "env": {k: v for k, v in env.items() if k not in PRIVATE_ENV},
            # The zygote may have started long before (at import): the proc gets this
            # process's environment and directory as they are now, like a fresh interpreter.
            "environ": child_environ(),
        }
        try:
            request["cwd"] = os.getcwd()
        except OSError:
            pass  # our directory was removed: the proc stays in the zygote's
        try:
            self._popen.stdin.write(json.dumps(request).encode() + b"\n")
            self._popen.stdin.flush()
        except OSError:
            del self._by_id[request_id]
            self._broken = True
            return self._fallback.launch(bootstrap, env, on_exit)
        return handle

    async def _read_reports(self, fd: int, popen: subprocess.Popen[bytes]) -> None:
        buffer = b""
        ended = False  # the zygote closed its end: it has exited (or is exiting)
        try:
            while True:
                await trio.lowlevel.wait_readable(fd)
                chunk = os.read(fd, 65536)
                if not chunk:
                    ended = True
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._on_report(json.loads(line))
        finally:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
            if popen.stdin is not None:
                try:
                    popen.stdin.close()  # EOF: the zygote kills its procs and exits
                except OSError:
                    pass
            if not ended:  # cancelled (the runtime stopped): it exits after this
                _reap_later(popen)
        # The zygote is gone: its procs died with it (PR_SET_PDEATHSIG).
        self._broken = True
        popen.wait()
        for handle in [*self._by_id.values(), *self._by_pid.values()]:
            handle.on_exit(-signal.SIGKILL)
        self._by_id.clear()
        self._by_pid.clear()

    def _on_report(self, report: dict[str, Any]) -> None:
        if "id" in report:
            handle = self._by_id.pop(report["id"])
            handle.pid = report["pid"]
            self._by_pid[handle.pid] = handle
            if handle._kill_when_known is not None:
                handle._signal(handle._kill_when_known)
        else:
            exited = self._by_pid.pop(report["pid"], None)
            if exited is not None:
                exited.on_exit(report["code"])


def default_launcher(nursery: trio.Nursery) -> ProcLauncher:
    """The zygote where procs can die with their parent (Linux), fresh interpreters elsewhere."""
    if sys.platform.startswith("linux") and os.environ.get("REGENCY_ZYGOTE", "1") != "0":
        return ZygoteLauncher(nursery)
    return LocalLauncher(nursery)
