"""Entry point of a proc: ``python -m regency.core._bootstrap``.

The spawner writes one JSON line on our stdin (the bootstrap record, secret included) and
keeps the pipe open for our whole life. We exit when it closes (the spawner died, however it
died), and on Linux also through ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int, watch_stdin: bool) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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


def main() -> None:
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit("regency proc: no bootstrap record on stdin (start procs with spawn_procs)")
    record: dict[str, Any] = json.loads(line)
    _die_with_parent(record["parent_pid"], watch_stdin=True)
    run(record)


def run(record: dict[str, Any], env: dict[str, str] | None = None) -> None:
    """Become the proc ``record`` describes; never returns."""
    os.environ.update(record["config"])
    if env:
        os.environ.update(env)
    for entry in reversed(record["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
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
    code = 0
    try:
        if record.get("boot"):
            boot = _codec.loads([bytes.fromhex(record["boot"])])
            result = boot()
            if hasattr(result, "__await__"):
                trio.run(lambda: result)  # an async bootstrap callable
        trio.run(rt.serve)
    except BaseException:
        logging.getLogger("regency.proc").exception("proc %s failed", record["proc_id"])
        code = 1
    finally:
        # Actor threads may still be blocked in user code: do not wait for them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
