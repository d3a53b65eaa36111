"""The controller's job directory: ``$TMPDIR/regency-<pid>-<random>``, mode 0700, holding
its unix sockets.

The controller removes it at exit, and its zygote removes it when the controller dies
without doing so (a killed Jupyter kernel). What survives even that (no zygote, a machine
that lost power) is removed by the next controller of the same user: the pid in the name
says whose it was, and a directory whose process is gone is stale.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

_NAME = re.compile(r"regency-(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale(parent: str | None = None) -> list[str]:
    """Remove this user's ``regency-<pid>-*`` directories in ``parent`` (the temporary
    directory by default) whose process is gone; return the paths removed."""
    parent = parent or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    uid = os.getuid()
    for name in sorted(names):
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid or not os.path.isdir(path) or os.path.islink(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def make_jobdir() -> str:
    """Create this controller's job directory (after removing stale ones)."""
    remove_stale()
    path = tempfile.mkdtemp(prefix=f"regency-{os.getpid()}-")
    os.chmod(path, 0o700)
    return path
