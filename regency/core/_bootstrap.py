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


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch_stdin() -> None:
        try:
            while sys.stdin.buffer.read(65536):
                pass
        finally:
            os._exit(1)

    threading.Thread(target=watch_stdin, name="regency-parent-watch", daemon=True).start()


def main() -> None:
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit("regency proc: no bootstrap record on stdin (start procs with spawn_procs)")
    record: dict[str, Any] = json.loads(line)
    _die_with_parent(record["parent_pid"])
    os.environ.update(record["config"])
    for entry in reversed(record["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    logging.basicConfig(
        level=os.environ.get("REGENCY_LOG_LEVEL", "WARNING"),
        format=f"[{record['proc_id']}] %(levelname)s %(name)s: %(message)s",
    )

    import trio

    from . import _codec
    from ._config import current_config
    from ._runtime import Runtime, set_current_runtime

    rt = Runtime(
        record["proc_id"],
        secret=bytes.fromhex(record["secret"]),
        jobdir=record["jobdir"],
        config=current_config(),
        address=record["address"],
        parent_address=record["parent_address"],
    )
    set_current_runtime(rt)
    if record.get("boot"):
        boot = _codec.loads([bytes.fromhex(record["boot"])])
        result = boot()
        if hasattr(result, "__await__"):
            trio.run(lambda: result)  # an async bootstrap callable
    trio.run(rt.serve)
    # Actor threads may still be blocked in user code: do not wait for them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
