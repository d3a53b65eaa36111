"""A zygote whose spawner dies just before or just after the zygote starts
removes the spawner's job directory at once and exits (it used to record init as its parent,
wait 10 s on its way out and leave the directory behind).

A parent process (a small script) starts the zygote the way a controller does (the one
``import regency`` starts and the launcher adopts, or one the launcher starts itself), gives
it its job directory and kills itself. The races are made deterministic, not timed: the
zygote is held in its interpreter's start (a ``sitecustomize`` that waits for a file) until
the test lets it go, and "started" means the zygote is serving (its SIGCHLD handler, set
just before its loop, shows in ``/proc/<pid>/status``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote is Linux-only"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = 30.0
#: "Promptly": the zygote used to wait 10 s (``_PARENT_EXIT_WAIT``) before giving up.
PROMPTLY = 5.0

#: Imported by every interpreter that has the test's directory on its path: the zygote
#: (which inherits the variable from its spawner) waits until the test lets it go.
SITECUSTOMIZE = """
import os, time
_hold = os.environ.pop("REGENCY_TEST_HOLD_ZYGOTE", "")
while _hold and not os.path.exists(_hold):
    time.sleep(0.005)
"""

PARENT = textwrap.dedent(
    """
    import fcntl, os, signal, struct, sys, tempfile, termios, time
    how, when, where, hold = sys.argv[1:5]
    os.environ["REGENCY_TEST_HOLD_ZYGOTE"] = hold  # for the zygote, not for us (started)
    jobdir = tempfile.mkdtemp(prefix=f"regency-{os.getpid()}-", dir=where)
    open(os.path.join(jobdir, "c0.sock"), "w").close()  # what a controller keeps there
    import trio
    from regency import _prestart  # `import regency` starts a zygote (unless "launcher")
    from regency.core._launcher import ZygoteLauncher

    def status(pid, field):
        with open(f"/proc/{pid}/status") as f:
            return next(l.split()[1] for l in f if l.startswith(field + ":"))

    def wait_serving(pid):  # its SIGCHLD handler is set just before its loop
        open(hold, "w").close()
        deadline = time.monotonic() + 30
        while not int(status(pid, "SigCgt"), 16) & (1 << (signal.SIGCHLD - 1)):
            assert time.monotonic() < deadline, "the zygote did not start"
            time.sleep(0.005)

    def unread(fd):
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"0000"))[0]

    async def main():
        async with trio.open_nursery() as nursery:
            launcher = ZygoteLauncher(nursery)
            launcher.remove_when_orphaned(jobdir)
            early = _prestart._zygote
            if how == "prestart":
                assert early is not None, "import regency started no zygote"
                if when != "before":
                    wait_serving(early.popen.pid)
                if when == "unread":  # it reads nothing more until the test continues it
                    os.kill(early.popen.pid, signal.SIGSTOP)
                    while status(early.popen.pid, "State") != "T":
                        time.sleep(0.001)
            else:
                assert early is None
            launcher.start()  # adopts the early zygote (sends the jobdir), or starts one
            zygote = launcher._popen
            assert zygote is not None and zygote.stdin is not None
            assert (zygote is early.popen) if early else True
            if when == "after":
                wait_serving(zygote.pid)
                deadline = time.monotonic() + 30
                while unread(zygote.stdin.fileno()):  # it has read the jobdir message
                    assert time.monotonic() < deadline, "the zygote reads nothing"
                    time.sleep(0.005)
            print(zygote.pid, jobdir, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # no atexit, nothing

    trio.run(main)
    """
)


@pytest.mark.parametrize(
    ("how", "when"),
    [
        ("prestart", "before"),
        ("prestart", "after"),
        ("prestart", "unread"),
        ("launcher", "before"),
        ("launcher", "after"),
    ],
)
def test_a_zygote_whose_spawner_dies_removes_the_job_directory_at_once(
    tmp_path: Path, how: str, when: str
) -> None:
    """before: the spawner dies before the zygote's interpreter ran a line of ours; after:
    once the zygote serves and has read its job directory; unread: once it serves, with the
    ``jobdir`` message still in the pipe (the zygote was stopped)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    where = tmp_path / "tmp"
    where.mkdir()
    hold = tmp_path / "go"
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), ROOT])}
    for name in ("REGENCY_ZYGOTE", "REGENCY_RUNTIME", "REGENCY_TEST_HOLD_ZYGOTE"):
        environ.pop(name, None)
    if how == "launcher":
        environ["REGENCY_ZYGOTE"] = "0"  # no zygote at import: the launcher starts its own
    # Its stderr in a file: the zygote inherits it (and stdout), so no EOF while it lives.
    errors = tmp_path / "stderr"
    with open(errors, "w") as err:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, how, when, str(where), str(hold)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=environ,
            cwd=ROOT,
        )
    pidfd = -1
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline().split()
        assert parent.wait(T) == -signal.SIGKILL, errors.read_text()
        started = time.monotonic()
        zygote, jobdir = int(line[0]), line[1]
        try:
            pidfd = os.pidfd_open(zygote)  # not our child: its exit, whoever reaps it
        except ProcessLookupError:  # "after": it may be done already
            assert when == "after"
        if when != "after":  # held or stopped: nothing could have removed it
            assert os.path.isdir(jobdir)
            # The spawner is dead (reaped: its pid may be anyone's now). Let the zygote go.
            started = time.monotonic()
            hold.touch()
        if when == "unread":
            signal.pidfd_send_signal(pidfd, signal.SIGCONT)
        ready, _, _ = select.select([pidfd], [], [], T) if pidfd >= 0 else ([True], [], [])
        took = time.monotonic() - started
        assert ready, f"the zygote outlived its dead spawner by {T} s"
        assert not os.path.exists(jobdir), "the zygote left its dead spawner's job directory"
        assert took < PROMPTLY, f"the zygote outlived its dead spawner by {took:.1f} s"
    finally:
        hold.touch()
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(pidfd)
