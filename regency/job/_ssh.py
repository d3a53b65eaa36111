"""SSHJob: Monarch's job over plain ssh, one ``run_worker_loop_forever`` worker per host.

``apply()`` runs ``ssh [ssh_args] HOST 'PYTHON -c ...'`` for each host of each mesh (each
``ssh`` in a session of its own, so it outlives the controller that applied the job and a
later controller reuses the workers through the state file, as with ``ProcessJob``). The job
secret goes down each ssh connection's stdin, never on a command line or in the remote
environment. A remote worker ends when its ssh session does (``kill()``, or the ``ssh``
process killed): it watches its parent, the session's process on the host, so no worker
outlives its connection.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence

from ..core._hosts import attach_to_workers, new_job_passphrase
from ._job import JobState, JobTrait

#: What each host runs (``python -c``): the secret from the first line of stdin, a watch on
#: the ssh session, then the worker. ``{address}`` is filled in.
REMOTE_WORKER = """\
import os, signal, sys, threading, time
os.environ["REGENCY_SECRET"] = sys.stdin.readline().strip()
parent = os.getppid()
def watch():
    while os.getppid() == parent:
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, daemon=True).start()
from regency.actor import run_worker_loop_forever
run_worker_loop_forever(address={address!r}, ca="trust_all_connections")
"""

#: Monarch's transports for SSHJob; Regency authenticates every link with the job secret.
_TRANSPORTS = ("tcp", "metatls", "metatls-hostname")


class SSHJob(JobTrait):
    """Monarch's SSHJob: ``add_mesh(name, hosts)`` then ``state()``. ``python_exe`` is the
    Python on the hosts (it must import Regency and the program's actors), ``ssh_args`` extra
    ``ssh`` options (``-i KEY``, ``-p PORT``, ``-o ...``), ``monarch_port`` (also ``port``)
    where each host's worker listens. ``transport``: ``"tcp"`` (Monarch's ``metatls*`` are
    refused: Regency's links are authenticated by the job secret; see docs/jobs.md)."""

    def __init__(
        self,
        python_exe: str = "python",
        ssh_args: Sequence[str] = (),
        monarch_port: int = 22222,
        transport: str = "tcp",
        *,
        port: int | None = None,
        lease: float = 10.0,
    ) -> None:
        super().__init__()
        if transport not in _TRANSPORTS:
            raise ValueError(
                f"SSHJob only supports the transports {_TRANSPORTS} (got {transport!r})"
            )
        if transport != "tcp":
            raise ValueError(
                f"SSHJob: transport {transport!r} (Meta's TLS) is not available in Regency; "
                "use 'tcp': every link is authenticated with the job secret (docs/transports.md)"
            )
        if port is not None:
            if monarch_port not in (22222, port):
                raise ValueError(
                    f"SSHJob: port and monarch_port name the same thing; give one "
                    f"(got port={port}, monarch_port={monarch_port})"
                )
            monarch_port = port
        if (
            not isinstance(monarch_port, int)
            or isinstance(monarch_port, bool)
            or not 0 < monarch_port < 65536
        ):
            raise ValueError(f"SSHJob: monarch_port must be an int in 1..65535 (got {monarch_port!r})")
        if not isinstance(python_exe, str) or not python_exe.strip():
            raise ValueError(f"SSHJob: python_exe must be a non-empty str (got {python_exe!r})")
        if isinstance(ssh_args, str) or not all(isinstance(a, str) for a in ssh_args):
            raise TypeError(
                f"SSHJob: ssh_args must be a list of str, e.g. ['-i', 'key'] (got {ssh_args!r})"
            )
        if not isinstance(lease, int | float) or isinstance(lease, bool) or lease <= 0:
            raise ValueError(f"SSHJob: lease must be positive seconds (got {lease!r})")
        self._python_exe = python_exe
        self._ssh_args = tuple(ssh_args)
        self._port = monarch_port
        self._transport = transport
        self._lease = float(lease)
        self._meshes: dict[str, list[str]] = {}
        self._secret = ""
        #: host -> (pid of its ssh, worker address)
        self._workers: dict[str, tuple[int, str]] = {}
        self._log_dir: str | None = None

    def add_mesh(self, name: str, hosts: Sequence[str]) -> None:
        """A mesh named ``name`` of these hosts (names or IPs ssh reaches, which also name
        them to the controller)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"SSHJob.add_mesh: name must be an identifier (got {name!r})")
        if isinstance(hosts, str) or not hosts or not all(
            isinstance(h, str) and h and not h.startswith("-") for h in hosts
        ):
            raise ValueError(
                f"SSHJob.add_mesh: hosts must be a non-empty list of host names (got {hosts!r})"
            )
        taken = [h for mesh in self._meshes.values() for h in mesh if h in hosts]
        if taken:
            raise ValueError(f"SSHJob.add_mesh: hosts {taken} are in another mesh already")
        self._meshes[name] = list(hosts)

    def _address(self, host: str) -> str:
        shown = f"[{host}]" if ":" in host else host
        return f"tcp://{shown}:{self._port}"

    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise ValueError("SSHJob runs no batch client (apply(client_script=...))")
        if not self._meshes:
            raise ValueError("SSHJob: add_mesh(name, hosts) before applying the job")
        ssh = shutil.which("ssh")
        if ssh is None:
            raise FileNotFoundError("SSHJob needs the OpenSSH client `ssh` on PATH")
        self._secret = new_job_passphrase()
        # Each connection's output goes to a file (a pipe would end the connection, and its
        # worker, with the controller that read it).
        self._log_dir = tempfile.mkdtemp(prefix="regency-ssh-job-")
        started: list[tuple[str, subprocess.Popen[bytes]]] = []
        try:
            for hosts in self._meshes.values():
                for host in hosts:
                    address = self._address(host)
                    program = REMOTE_WORKER.format(address=address)
                    remote = f"exec {shlex.quote(self._python_exe)} -u -c {shlex.quote(program)}"
                    with open(self._log_path(host), "wb") as out:
                        proc = subprocess.Popen(
                            [ssh, *self._ssh_args, host, remote],
                            stdin=subprocess.PIPE,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    assert proc.stdin is not None
                    proc.stdin.write(self._secret.encode() + b"\n")
                    proc.stdin.close()
                    started.append((host, proc))
                    self._workers[host] = (proc.pid, address)
            for host, proc in started:
                self._wait_listening(host, proc)
        except BaseException:
            self._kill()
            raise

    def _log_path(self, host: str) -> str:
        assert self._log_dir is not None
        return os.path.join(self._log_dir, host.replace("/", "_") + ".log")

    def _wait_listening(self, host: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with open(self._log_path(host), "rb") as f:
                text = f.read().decode(errors="replace")
            if "listening on" in text:
                return
            if proc.poll() is not None:
                raise RuntimeError(
                    f"SSHJob: the worker on {host} did not start (ssh exited with "
                    f"{proc.returncode}): {text.strip() or '(no output)'}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"SSHJob: the worker on {host} did not listen within {timeout} s: {text.strip()}"
                )
            time.sleep(0.02)

    def _state(self) -> JobState:
        dead = [host for host, (pid, _) in self._workers.items() if not _alive(pid)]
        if dead:
            raise RuntimeError(f"SSHJob: the ssh connections to {', '.join(dead)} are gone")
        return JobState(
            {
                name: attach_to_workers(
                    [self._workers[h][1] for h in hosts], self._secret, name=name, lease=self._lease
                )
                for name, hosts in self._meshes.items()
            }
        )

    def can_run(self, spec: JobTrait) -> bool:
        return (
            isinstance(spec, SSHJob)
            and spec._meshes == self._meshes
            and spec._python_exe == self._python_exe
            and spec._ssh_args == self._ssh_args
            and spec._port == self._port
            and bool(self._workers)
            and all(_alive(pid) for pid, _ in self._workers.values())
        )

    def _kill(self) -> None:
        """End each ssh connection (its worker ends with it, killing its procs)."""
        from ._local import stop_groups

        stop_groups([pid for pid, _ in self._workers.values()])
        self._workers.clear()
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None


def _alive(pid: int) -> bool:
    from ._local import _alive as alive

    return alive(pid)
