"""Starting procs: the ``ProcLauncher`` interface and its local-OS-process implementation.

The runtime starts procs only through this interface, so the simulator (and multi-host
workers) can provide their own.
"""

from __future__ import annotations

import abc
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import trio


class ProcHandle(abc.ABC):
    pid: int

    @abc.abstractmethod
    def kill(self) -> None: ...

    @abc.abstractmethod
    def terminate(self) -> None: ...


class ProcLauncher(abc.ABC):
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
    child reads EOF and exits. On Linux the child also sets ``PR_SET_PDEATHSIG``. ``Popen``
    runs on the runtime's own long-lived thread because the death signal follows the thread
    that forked, not the process.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def launch(
        self,
        bootstrap: Mapping[str, Any],
        env: Mapping[str, str],
        on_exit: Callable[[int], None],
    ) -> ProcHandle:
        child_env = {**os.environ, **env}
        popen = subprocess.Popen(
            [sys.executable, "-m", "regency.core._bootstrap"],
            stdin=subprocess.PIPE,
            env=child_env,
            close_fds=True,
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
                    popen.stdin.close()
                except OSError:
                    pass
        on_exit(code)
