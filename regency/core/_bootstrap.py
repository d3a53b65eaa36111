"""Entry point of a proc: ``python -m regency.core._bootstrap``.

The spawner writes one JSON line on our stdin (the bootstrap record, secret included) and
keeps the pipe open for our whole life. We exit when it closes (the spawner died, however it
died), and on Linux also through ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

# At import (a zygote imports this module before it forks): a proc does not pay for it.
from ._workspace_files import add_synced_paths

_PR_SET_PDEATHSIG = 1


def _die_with_parent(
    parent_pid: int, watch_stdin: bool, sig: signal.Signals = signal.SIGKILL
) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    if not watch_stdin:
        return

    def exit_on_eof() -> None:
        try:
            while sys.stdin.buffer.read(65536):
                pass
        finally:
            os._exit(1)

    threading.Thread(target=exit_on_eof, name="regency-parent-watch", daemon=True).start()


def _install_services(rt: Any) -> None:
    """What the packages above core install in a new proc (log forwarding's tee or level
    control, the remote ``breakpoint()`` hook): see :mod:`._extensions`."""
    from ._extensions import install_in_proc

    install_in_proc(rt)


def main() -> None:
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit("regency proc: no bootstrap record on stdin (start procs with spawn_procs)")
    record: dict[str, Any] = json.loads(line)
    _die_with_parent(record["parent_pid"], watch_stdin=True)
    run(record)


def run(record: dict[str, Any], env: dict[str, str] | None = None) -> NoReturn:
    """Become the proc ``record`` describes; never returns (a clean stop raises
    ``SystemExit`` so that Python finalizes, anything else ends in ``os._exit``)."""
    # The controller decides when procs stop: a SIGINT aimed at its process group (Ctrl-C,
    # Jupyter's Interrupt) is not for us (procs also run in a session of their own).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Whole lines in one write each, so the lines of procs that share the controller's
    # stdout (a terminal, a notebook cell) never fuse.
    from ._lines import whole_lines

    whole_lines()
    os.environ.update(record["config"])
    if env:
        os.environ.update(env)
    from ._launcher import PRIVATE_ENV

    for name in PRIVATE_ENV:  # the secret came in the record; keep it out of os.environ
        os.environ.pop(name, None)
    for entry in reversed(record["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    add_synced_paths(record)  # workspaces synced to this host (HostMesh.sync_workspace)
    logging.basicConfig(
        level=os.environ.get("REGENCY_LOG_LEVEL", "WARNING"),
        format=f"[{record['proc_id']}] %(levelname)s %(name)s: %(message)s",
    )

    import trio

    from . import _codec, _config
    from ._current import set_current_runtime
    from ._runtime import Runtime

    _config._current = None  # the environment may have changed since a zygote imported us
    rt = Runtime(
        record["proc_id"],
        secret=bytes.fromhex(record["secret"]),
        jobdir=record["jobdir"],
        config=_config.current_config(),
        address=record["address"],
        parent_address=record["parent_address"],
    )
    set_current_runtime(rt)
    from .._actor_config import install_log_prefix

    install_log_prefix()
    rt.root_address = record.get("root_address")
    _install_services(rt)
    code = 0
    try:
        if record.get("boot"):
            rt.boot = _codec.loads([bytes.fromhex(record["boot"])])  # run by rt.serve
        # What is alive now (the imports: trio, Regency, the boot callable's modules; about
        # 30,000 objects) leaves the collector's full collections, as in the controller
        # (``_controller._freeze_heap``): calls queued by the thousand (pipelined) trigger
        # several, each of which traversed it all (about 1 us a call). A zygote's child
        # unfroze the zygote's heap when it forked; this freezes it again with ours.
        gc.freeze()
        trio.run(rt.serve)
    except BaseException:
        logging.getLogger("regency.proc").exception("proc %s failed", record["proc_id"])
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if code != 0:
            os._exit(code)
    # The actor threads were told to stop (their mailboxes abandoned) but may still be on
    # their way out: finalizing under them lost module-level __del__ calls. Threads on
    # their way out end in microseconds; one blocked in user code never will, so the wait
    # is short.
    rt.executor.join_threads(min(1.0, rt.config.stop_timeout / 2))
    _finalize_then_exit(rt.config.stop_timeout)


def _finalize_then_exit(grace: float) -> NoReturn:
    """A proc told to stop exits the way a Python program does, so module-level objects'
    ``__del__`` and ``atexit`` handlers run (Monarch's procs do the same). ``SystemExit``
    unwinds to the top of the process: in a zygote's child that passes through the zygote's
    frames, which know to let it by. Actor threads may still be blocked in user code, and a
    finalizer may block: past ``grace`` seconds the proc exits anyway."""

    def force() -> None:
        time.sleep(grace)
        os._exit(0)

    threading.Thread(target=force, name="regency-exit-watch", daemon=True).start()
    raise _ProcExit(0)


class _ProcExit(SystemExit):
    """A proc's clean exit, unwinding to the top of the process (see _finalize_then_exit)."""


if __name__ == "__main__":
    main()
