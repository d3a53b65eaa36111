"""A pre-imported template process that forks procs on request (Linux).

Starting a proc from scratch costs a Python start plus importing trio and the runtime: about a
quarter of a second here, per proc, all of it CPU. The zygote pays that once; each proc is then
an ``os.fork()`` of it, ready in milliseconds.

Command line: ``python -m regency.core._zygote REPORT_FD SPAWNER [JOBDIR [torch]]``:
``REPORT_FD`` the pipe for reports (below), ``SPAWNER`` the process that started us as
``<pid>:<start time>`` (:func:`regency._prestart.identity`), ``JOBDIR`` its job directory
when it already has one, ``torch`` to import torch before the first fork.

Protocol (one JSON object per line):

* controller -> zygote, on the zygote's stdin: ``{"id": N, "record": {...}, "env": {...},
  "environ": {...}, "cwd": "..."}`` to fork a proc (``environ`` and ``cwd``: the controller's
  environment and working directory now; the proc replaces the zygote's with them, then applies
  ``env``); ``{"jobdir": "..."}`` names the job directory to remove should the spawner die
  without doing so; ``{"import": "torch"}`` imports a module before the next fork
* zygote -> controller, on the pipe whose fd is ``argv[1]``: ``{"id": N, "pid": P}`` after each fork, and
  ``{"pid": P, "code": C}`` when a proc exits (C < 0: killed by signal -C).

A zygote may start before its spawner knows its job directory or whether it will use torch
(:mod:`regency._prestart` starts one at ``import regency``); both then arrive as messages.

Death: the zygote dies with its spawner (``PR_SET_PDEATHSIG`` with SIGTERM, and EOF on stdin)
and kills its procs first; each proc dies with the zygote (``PR_SET_PDEATHSIG``). When the
spawner died without cleaning up (a killed Jupyter kernel), the zygote also removes the job
directory named by ``JOBDIR`` (or by a ``jobdir`` message, read on the way out too if it was
still in the pipe). A spawner that died before the zygote even ran (killed just after it
started it) is found by its identity: the zygote then removes the job directory at once and
exits. It runs in a session of its own and ignores SIGINT. The zygote stays single-threaded so
that forking it is safe.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import shutil
import signal
import sys
import time
from typing import Any

from .. import _prestart
from . import _bootstrap

_PR_SET_PDEATHSIG = 1


def _report(out: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    try:
        while data:
            data = data[os.write(out, data) :]
    except BrokenPipeError:
        sys.exit(0)  # the spawner is gone; our finally clause kills the procs


#: Seconds the zygote, on its way out, waits for the spawner to exit before leaving the job
#: directory to it.
_PARENT_EXIT_WAIT = 10.0


#: Set first thing in main's finally: a SIGTERM handled after that must not raise there.
_exiting = False


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # Unwinds through main's finally: procs killed, jobdir removed. Not once that finally
    # runs: a killed spawner closes our stdin (``_serve`` returns) and sends the death
    # signal at about the same time, and a SystemExit raised inside the finally cut the
    # clean-up short (the job directory stayed, sockets and all: a CI run, and 3 of 20 local
    # runs under load, of test_a_killed_kernel_takes_its_procs_and_directory_with_it).
    if not _exiting:
        raise SystemExit(0)


class _Spawner:
    """The process that started us, as it named itself on our command line (``<pid>:<start
    time>``, see :func:`regency._prestart.identity`).

    Not ``os.getppid()`` read once we run: the interpreter starts and imports for a good
    fraction of a second first, and a spawner that died meanwhile (a controller killed just
    after its start) has left us to init by then; we watched init, waited the whole
    :data:`_PARENT_EXIT_WAIT` on our way out and left its job directory behind. Named by
    pid and start time, a spawner that is already gone is known to be, whoever our parent
    is now."""

    def __init__(self, described: str) -> None:
        pid, _, start = described.partition(":")
        self.pid = int(pid)
        self._started = int(start) if start else None
        self._gone = False
        #: A pidfd of the spawner: readable once it has exited (None where unsupported).
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self._gone = True
        except (AttributeError, OSError):
            pass
        # Opened first, checked second: a pid that another process took since names that
        # process's start time (or none), so a pidfd that passes is the spawner's.
        now = None if self._gone else _prestart.start_time(self.pid)
        if self._started is not None and now != self._started:
            self._mark_gone()

    def _mark_gone(self) -> None:
        self._gone = True
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def gone(self, timeout: float = 0.0) -> bool:
        """Whether the spawner has exited, waiting up to ``timeout`` seconds for it to."""
        deadline = time.monotonic() + timeout
        while not self._gone:
            left = max(0.0, deadline - time.monotonic())
            if self.fd is not None:
                ready, _, _ = select.select([self.fd], [], [], left)
                if ready:
                    self._mark_gone()
                return self._gone
            # No pidfd: ask /proc (a zombie counts as gone), or the kill(0) probe without it.
            if self._started is not None:
                if _prestart.start_time(self.pid) != self._started:
                    self._mark_gone()
            else:
                try:
                    os.kill(self.pid, 0)
                except ProcessLookupError:
                    self._mark_gone()
                except PermissionError:
                    pass
            if self._gone or left <= 0:
                break
            time.sleep(min(0.05, left))
        return self._gone

    def reparented(self) -> None:
        """Our parent is no longer the spawner: it has exited (the kernel reparents a
        process's children as it exits)."""
        self._mark_gone()


def _set_death_signal(sig: signal.Signals) -> None:
    """``PR_SET_PDEATHSIG``: ``sig`` when the thread that started us ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _ours(jobdir: str) -> bool:
    """Whether ``jobdir`` is a job directory we may remove: a ``regency-*`` directory of
    this user's that exists."""
    if not os.path.basename(jobdir.rstrip("/")).startswith("regency-"):
        return False
    try:
        return os.stat(jobdir).st_uid == os.getuid()
    except OSError:
        return False  # gone (its owner removed it), or never made


def _remove_orphaned_jobdir(jobdir: str, spawner: _Spawner) -> None:
    """Remove the spawner's job directory once the spawner has exited (it removes the
    directory itself when it exits normally; killed, it cannot). Only a ``regency-*``
    directory of ours, never anything else.

    We get here when the spawner's runtime thread ended (the death signal) or its pipes
    closed, or at our start when the spawner had already gone: it is dying or about to, so
    waiting a moment for its exit is enough; we stop waiting as soon as the directory is
    gone (a spawner that lives on, its runtime stopped: a test, ``shutdown_context``,
    removes it itself). The death signal can come before the kernel has reparented us, so
    ``getppid`` cannot tell; the spawner's identity can. A spawner that stopped its runtime
    cleanly can still die before removing the directory (a worker killed by a second
    SIGTERM on its way out), so a clean stop is no reason to stop watching."""
    deadline = time.monotonic() + _PARENT_EXIT_WAIT
    while True:
        if not jobdir or not _ours(jobdir):
            return  # nothing (left) to remove
        if spawner.gone(min(0.05, max(0.0, deadline - time.monotonic()))):
            break
        if time.monotonic() >= deadline:
            return  # still alive: its own exit removes the directory
    # A few tries: a file created while the removal listed the directory (a dying
    # process's last write) leaves it behind, and nobody else would remove it.
    for _ in range(5):
        if not _ours(jobdir):
            return
        shutil.rmtree(jobdir, ignore_errors=True)
        if not os.path.exists(jobdir):
            return
        time.sleep(0.05)


class _State:
    """What the spawner told us so far, and the part of a line not yet read whole."""

    def __init__(self, jobdir: str) -> None:
        #: The job directory (argv or a ``jobdir`` message).
        self.jobdir = jobdir
        self.pending = b""


def _read_rest(state: _State) -> None:
    """On our way out: the control messages still in the pipe. A spawner that wrote its
    ``jobdir`` message and died at once, before we read it (not started yet, or the death
    signal came first), must still have its directory removed. Fork requests are dropped."""
    stdin = sys.stdin.fileno()
    try:
        os.set_blocking(stdin, False)
        while True:
            chunk = os.read(stdin, 65536)
            if not chunk:
                break
            state.pending += chunk
    except OSError:
        pass  # nothing more now (EAGAIN: a living spawner), or no stdin
    lines = state.pending.split(b"\n")
    state.pending = lines.pop()  # an incomplete last line: the spawner died writing it
    for line in lines:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if isinstance(request, dict) and "jobdir" in request:
            state.jobdir = str(request["jobdir"])


def main() -> None:
    report_fd = int(sys.argv[1])
    spawner = _Spawner(sys.argv[2])
    state = _State(sys.argv[3] if len(sys.argv) > 3 else "")
    zygote = os.getpid()
    children: set[int] = set()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    global _exiting
    try:
        if sys.platform.startswith("linux"):
            _set_death_signal(signal.SIGTERM)
        # After the death signal is set: a spawner that dies from here on sends it (or
        # closes our stdin); one that died before is gone now, or is no longer our parent.
        if os.getppid() != spawner.pid:
            spawner.reparented()
        if spawner.gone():
            return  # nobody to fork for: remove its job directory (finally) and exit
        _serve(report_fd, children, spawner, state)
    finally:
        _exiting = True  # before any call (where a pending signal's handler would run)
        if os.getpid() == zygote:  # not a proc's clean exit unwinding through our frames
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            # Reap them before removing the job directory: a proc that was still on its way
            # out (it saw its controller go) could otherwise create a file in the directory
            # after the removal listed it, and the directory stayed (seen once in 14 runs of
            # tests/notebooks/test_lifecycle.py).
            for pid in children:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
            _read_rest(state)
            _remove_orphaned_jobdir(state.jobdir, spawner)


def _serve(report_fd: int, children: set[int], spawner: _Spawner, state: _State) -> None:
    """Fork procs on request until the spawner goes; ``children`` holds the living ones."""
    # Import what every proc needs before the first fork, then freeze it out of the GC.
    import trio  # noqa: F401

    from .. import _actor_config  # noqa: F401
    from . import _lines, _proc_mesh, _runtime  # noqa: F401

    if "torch" in sys.argv[4:]:  # seconds of import paid once, not per proc (tensor engine)
        import torch  # noqa: F401

    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin = sys.stdin.fileno()
    inherited = (wake_r, wake_w, report_fd, *([] if spawner.fd is None else [spawner.fd]))
    while True:
        ready, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _report(report_fd, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})
        if stdin not in ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            return  # the spawner is gone
        state.pending += chunk
        while b"\n" in state.pending:
            # A line leaves ``pending`` once handled: a death signal meanwhile (SystemExit)
            # leaves it to :func:`_read_rest`, should it name the job directory.
            end = state.pending.index(b"\n")
            request = json.loads(state.pending[:end])
            if "id" not in request:
                _control(request, state)
            else:
                pid = os.fork()
                if pid == 0:
                    _become(request, *inherited)
                children.add(pid)
                _report(report_fd, {"id": request["id"], "pid": pid})
            state.pending = state.pending[end + 1 :]


def _control(request: dict[str, Any], state: _State) -> None:
    """A message that is not a fork request: the job directory, or a module to import."""
    if "jobdir" in request:
        state.jobdir = str(request["jobdir"])
    if request.get("import") == "torch":  # seconds, paid once here rather than per proc
        gc.unfreeze()
        try:
            import torch  # noqa: F401
        except ImportError:
            pass  # the procs will say so, where it matters
        gc.freeze()


def _fresh_random_state() -> None:
    """In the forked child, first thing: the random state a fresh interpreter would have.

    A fork copies the zygote's generators, so without this every proc drew the same numbers
    (torch's, when the zygote had imported torch; Monarch's procs, fresh processes, all
    differ). Only modules already imported are reseeded (one imported later seeds itself
    from the OS in this proc), each from OS entropy as at its import:

    * ``random``: its module-level generator already reseeds at fork (``os.register_at_fork``
      in the standard library); done again here so as not to rest on that.
    * ``numpy.random``'s global ``RandomState`` (numpy 2 imports ``numpy.random`` lazily, so
      it is usually imported in the proc; numpy 1 imports it with numpy, hence with torch).
    * torch's CPU generator (``torch.initial_seed()`` and ``torch.rand`` without a
      generator). Not ``torch.seed()``: it also queues ``manual_seed_all`` for CUDA, making
      the CUDA seed the CPU one and formatting a stack trace, per proc. CUDA needs nothing:
      the zygote never initialises it (a forked CUDA context is unusable), and the proc's
      CUDA generators, made when the proc first uses CUDA, each seed themselves from the OS
      (``getDefaultCUDAGenerator``), as in a fresh interpreter. Nothing here touches CUDA.
    """
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        numpy_random.seed()
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        generator.seed()


def _become(request: dict[str, Any], *fds: int) -> None:
    """In the forked child: drop the zygote's plumbing and run the proc."""
    try:
        _fresh_random_state()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        gc.unfreeze()
        if "environ" in request:  # the spawner's, as they are now, not at our start
            os.environ.clear()
            os.environ.update(request["environ"])
        if "cwd" in request:
            try:
                os.chdir(request["cwd"])
            except OSError:
                pass  # gone since: stay where the zygote is, as a fresh interpreter would
        _bootstrap._die_with_parent(os.getppid(), watch_stdin=False)
        _bootstrap.run(request["record"], request.get("env"))
    except _bootstrap._ProcExit:
        raise  # a clean stop: unwind to the top so that Python finalizes (zygote's frames pass it)
    except BaseException:
        pass
    os._exit(1)


if __name__ == "__main__":
    main()
