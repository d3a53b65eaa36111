"""``regency.job.shell`` from a real terminal: a controller whose stdin and stdout are a pty."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest

from regency.actor import HostMesh
from regency.job import shell
from regency.sim import simulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONTROLLER = textwrap.dedent(
    """
    import sys, termios
    from regency.actor import this_host
    from regency.job import shell
    before = termios.tcgetattr(0)
    status = shell(this_host(), env={"GREETING": "hello"}, workdir="/tmp")
    print("STATUS", status, "RESTORED", termios.tcgetattr(0) == before, file=sys.stderr)
    """
)


class _Terminal:
    """The user's side of a pty: what was written to it so far, read with deadlines."""

    def __init__(self, master: int, controller: subprocess.Popen[bytes]) -> None:
        self.master = master
        self.controller = controller
        self.seen = b""

    def why(self) -> str:
        if self.controller.poll() is None:
            return "the controller still runs"
        assert self.controller.stderr is not None
        return f"the controller exited: {self.controller.stderr.read().decode()}"

    def read_until(self, text: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never appeared; got {self.seen!r}"
            if select.select([self.master], [], [], left)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: every process let go of the terminal
                    chunk = b""
                assert chunk, f"{text!r} never appeared; got {self.seen!r} ({self.why()})"
                self.seen += chunk

    def type(self, line: bytes) -> None:
        os.write(self.master, line)


@pytest.mark.slow
def test_shell_on_a_real_terminal() -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "SHELL": "/bin/bash", "PYTHONPATH": ROOT},
        start_new_session=True,
    )
    os.close(slave)
    user = _Terminal(master, controller)
    try:
        user.read_until(b"\r")  # the terminal is raw now: what we type goes to the shell
        user.type(b"echo $GREETING-$((6*7)) in $(pwd); stty size\n")
        user.read_until(b"hello-42 in /tmp")
        user.read_until(b"33 101")  # the remote pty got our window size
        user.type(b"exit 3\n")
        _, err = controller.communicate(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
        os.close(master)
    assert controller.returncode == 0, err
    assert "STATUS 3 RESTORED True" in err.decode(), err


def test_shell_refuses_a_mesh_of_several_hosts() -> None:
    def program(hosts: HostMesh) -> str:
        with pytest.raises(ValueError, match=r"needs a singleton HostMesh \(one host; got 2\)"):
            shell(hosts)
        return "refused"

    assert simulate(program, hosts=2).value == "refused"


@pytest.mark.slow
def test_the_shell_command_on_a_host_of_the_applied_job(tmp_path: object) -> None:
    """``regency shell`` (Monarch's ``monarch shell``): ``--point``, ``-e``, ``--kill``."""
    from pathlib import Path

    from regency.job import job_load

    from ..conftest import pid_alive

    here = Path(str(tmp_path))
    (here / "shelljobs.py").write_text("from regency.job import ProcessJob\ntwo = ProcessJob({'hosts': 2})\n")
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env.update(SHELL="/bin/bash", PYTHONPATH=ROOT)
    applied = subprocess.run(
        [sys.executable, "-m", "regency", "apply", "shelljobs:two"], cwd=here, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    workers = [pid for pid, _ in job_load(str(here / ".regency/job_state.pkl"))._workers.values()]  # type: ignore[attr-defined]
    master, slave = pty.openpty()
    controller = subprocess.Popen(
        [sys.executable, "-m", "regency", "shell", "--point", "hosts=1", "-e", "GREETING=hi",
         "--workdir", "/tmp", "--kill"],
        stdin=slave, stdout=slave, stderr=subprocess.PIPE, cwd=here, env=env,
        start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    user = _Terminal(master, controller)
    try:
        user.read_until(b"\r")
        user.type(b"echo $GREETING-$((6*7)) in $(pwd)\n")
        user.read_until(b"hi-42 in /tmp")
        user.type(b"exit 4\n")
        _, err = controller.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in workers):  # --kill ended the job's workers
            assert time.monotonic() < deadline, "the job's workers outlived --kill"
            time.sleep(0.05)
    finally:
        if controller.poll() is None:
            controller.kill()
        os.close(master)
        for pid in workers:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    assert controller.returncode == 4, err
    assert not (here / ".regency/job_state.pkl").exists()
