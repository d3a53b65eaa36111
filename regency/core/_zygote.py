"""A pre-imported template process that forks procs on request (Linux).

Starting a proc from scratch costs a Python start plus importing trio and the runtime: about a
quarter of a second here, per proc, all of it CPU. The zygote pays that once; each proc is then
an ``os.fork()`` of it, ready in milliseconds.

Protocol (one JSON object per line):

* controller -> zygote, on the zygote's stdin: ``{"id": N, "record": {...}, "env": {...}}``
* zygote -> controller, on the pipe whose fd is ``argv[1]``: ``{"id": N, "pid": P}`` after each fork, and
  ``{"pid": P, "code": C}`` when a proc exits (C < 0: killed by signal -C).

Death: the zygote dies with its spawner (``PR_SET_PDEATHSIG`` and EOF on stdin) and kills its
procs first; each proc dies with the zygote (``PR_SET_PDEATHSIG``). The zygote stays
single-threaded so that forking it is safe.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
from typing import Any

from . import _bootstrap


def _report(out: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    try:
        while data:
            data = data[os.write(out, data) :]
    except BrokenPipeError:
        sys.exit(0)  # the spawner is gone; our finally clause kills the procs


def main() -> None:
    report_fd = int(sys.argv[1])
    parent = os.getppid()
    zygote = os.getpid()
    _bootstrap._die_with_parent(parent, watch_stdin=False)
    # Import what every proc needs before the first fork, then freeze it out of the GC.
    import trio  # noqa: F401

    from . import _proc_mesh, _runtime  # noqa: F401

    if "torch" in sys.argv[2:]:  # seconds of import paid once, not per proc (tensor engine)
        import torch  # noqa: F401

    gc.freeze()
    children: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin = sys.stdin.fileno()
    pending = b""
    try:
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
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _become(request, wake_r, wake_w, report_fd)
                children.add(pid)
                _report(report_fd, {"id": request["id"], "pid": pid})
    finally:
        if os.getpid() == zygote:  # not a proc's clean exit unwinding through our frames
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _become(request: dict[str, Any], *fds: int) -> None:
    """In the forked child: drop the zygote's plumbing and run the proc."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in fds:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        gc.unfreeze()
        _bootstrap._die_with_parent(os.getppid(), watch_stdin=False)
        _bootstrap.run(request["record"], request.get("env"))
    except _bootstrap._ProcExit:
        raise  # a clean stop: unwind to the top so that Python finalizes (zygote's frames pass it)
    except BaseException:
        pass
    os._exit(1)


if __name__ == "__main__":
    main()
