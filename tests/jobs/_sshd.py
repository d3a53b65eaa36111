"""A real OpenSSH server on a virtual host (a network namespace) for the SSHJob tests.

Installs Debian's ``openssh-server`` with apt when it is missing and we are root (as the SLURM
fixture does), else skips with the reason. The server runs as ``sshd -D`` inside the
namespace, on the host's address, with a fresh host key, public-key login only, for a fresh
client key; everything is removed on exit.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest

from regency.testing import VirtualHost, virtual_hosts, virtual_hosts_available

SSHD = "/usr/sbin/sshd"


def _ensure_installed(timeout: float = 600) -> None:
    if os.access(SSHD, os.X_OK):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("openssh-server is not installed (and installing it needs root and apt)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "-o", "DPkg::Lock::Timeout=120", "update", "-qq"],
        [
            "apt-get", "-o", "DPkg::Lock::Timeout=120", "install", "-y", "-qq",
            "--no-install-recommends", "openssh-server",
        ],
    ):  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            pytest.skip(f"{' '.join(cmd)} failed: {done.stderr.strip()[-300:]}")


@attrs.frozen
class SshHost:
    host: VirtualHost
    #: ``ssh`` options that log in to it (key, no host-key prompts, batch mode).
    ssh_args: tuple[str, ...]


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
        capture_output=True,
    )  # fmt: skip


@contextmanager
def sshd_host(tmp: Path) -> Iterator[SshHost]:
    why = virtual_hosts_available()
    if why is not None:
        pytest.skip(why)
    _ensure_installed()
    tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    _keygen(tmp / "host_key")
    _keygen(tmp / "client_key")
    shutil.copy(tmp / "client_key.pub", tmp / "authorized_keys")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    with virtual_hosts(1) as [host]:
        config = tmp / "sshd_config"
        config.write_text(
            f"ListenAddress {host.ip}\nPort 22\nHostKey {tmp / 'host_key'}\n"
            f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nPidFile {tmp / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "AcceptEnv none\nPermitUserEnvironment no\n"
        )
        log = open(tmp / "sshd.log", "wb")  # noqa: SIM115 (closed below)
        server = subprocess.Popen(
            ["ip", "netns", "exec", host.name, SSHD, "-D", "-e", "-f", str(config)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with socket.create_connection((host.ip, 22), timeout=1):
                        break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"sshd did not start: {(tmp / 'sshd.log').read_text()}"
                        ) from None
                    time.sleep(0.05)
            yield SshHost(
                host,
                (
                    "-i", str(tmp / "client_key"), "-o", "BatchMode=yes",
                    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    "-o", "LogLevel=ERROR",
                ),
            )  # fmt: skip
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
