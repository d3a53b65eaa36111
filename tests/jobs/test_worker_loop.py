"""Monarch's worker API: run_worker_loop_forever and attach_to_workers in keyword form."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from regency.actor import attach_to_workers, run_worker_loop_forever

from ..conftest import TEST_SECRET, pid_alive
from .actors import Probe

T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _loopback_only_name() -> str:
    """A host name that resolves only to 127.0.0.1 (Monarch 0.7 panics on one)."""
    for name in (socket.gethostname(), "localhost"):
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(name, 1, type=socket.SOCK_STREAM)}
        except socket.gaierror:
            continue
        if addresses == {"127.0.0.1"}:
            return name
    pytest.skip("no host name here resolves only to 127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_worker(
    address: str, secret: str | None, home: str | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    if secret is not None:
        env["REGENCY_SECRET"] = secret
    if home is not None:
        env["HOME"] = home
    program = (
        "from regency.actor import run_worker_loop_forever; "
        f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", program], env=env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    return worker


@pytest.mark.slow
def test_keyword_forms_on_a_loopback_only_host_name_and_shutdown_ends_the_worker() -> None:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden")
    address = f"tcp://{_loopback_only_name()}:{_free_port()}"
    worker = _start_worker(address, TEST_SECRET)
    try:
        assert worker.stdout is not None
        assert "listening on" in worker.stdout.readline()
        hosts = attach_to_workers(workers=[address], ca="trust_all_connections", name="solo")
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        probes = procs.spawn("probes", Probe)
        assert probes.bump.call().get(T).values() == [1, 1]
        # The worker took the secret out of its environment: its procs never see it.
        assert probes.secret_in_env.call().get(T).values() == [False, False]
        pids = [pid for pid, *_ in probes.where.call().get(T).values()]
        hosts.shutdown().get(T)
        assert worker.wait(T) == 0, worker.stderr.read() if worker.stderr else ""
        deadline = time.monotonic() + T
        while any(pid_alive(pid) for pid in pids):  # they die with their worker
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    # Attaching again after every host was shut down: our address is TCP again (a unix
    # address would reach remote procs only through a shared file system).
    from regency.core._controller import current_runtime

    assert not current_runtime().address.startswith("tcp://")
    address = f"tcp://127.0.0.1:{_free_port()}"
    again = _start_worker(address, TEST_SECRET)
    try:
        assert again.stdout is not None and "listening on" in again.stdout.readline()
        hosts = attach_to_workers([address], TEST_SECRET)  # the positional form
        assert current_runtime().address.startswith("tcp://127.0.0.1:")
        probe = hosts.spawn_procs().spawn("again", Probe)
        assert probe.bump.call_one().get(T) == 1
        hosts.shutdown().get(T)
        assert again.wait(T) == 0
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()


@pytest.mark.slow
def test_a_secret_file_others_can_read_is_refused_by_both_sides(tmp_path: Path) -> None:
    """Without REGENCY_SECRET both sides use this user's ~/.regency/secret (made when
    missing: tests/compat/test_monarch_07_fixes.py); one that others can read is refused,
    naming the file, by the worker and by the controller."""
    home = tmp_path / "home"
    (home / ".regency").mkdir(parents=True, mode=0o700)
    secret = home / ".regency" / "secret"
    secret.write_text("a-secret-that-others-can-read-0123456789\n")
    secret.chmod(0o644)
    worker = _start_worker(f"tcp://127.0.0.1:{_free_port()}", None, home=str(home))
    _, err = worker.communicate(timeout=T)
    assert worker.returncode != 0
    assert str(secret) in err and "mode 0644" in err, err
    controller = textwrap.dedent(
        """
        from regency.actor import attach_to_workers
        try:
            attach_to_workers(workers=["tcp://127.0.0.1:9"], ca="trust_all_connections")
        except (RuntimeError, PermissionError) as exc:
            print(exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["HOME"] = str(home)
    out = subprocess.run(
        [sys.executable, "-c", controller], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=T,
    )  # fmt: skip
    assert str(secret) in out.stdout and "mode 0644" in out.stdout, (out.stdout, out.stderr)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ca": "/etc/ca.pem"}, "ca must be 'trust_all_connections'"),
        ({"ca": "trust_all_connections", "private_key": b"k"}, "private_key must be None"),
        ({"ca": "trust_all_connections", "address": "tcp://*:4444"}, "not a wildcard"),
        ({"ca": "trust_all_connections", "address": "tcp://host"}, "SCHEME://HOST:PORT"),
        ({"ca": "trust_all_connections", "address": "ipc://x"}, "ipc:///ABSOLUTE/PATH"),
        ({"ca": "trust_all_connections", "address": "tcp://127.0.0.1:fdx"}, "SCHEME://HOST:PORT"),
    ],
)
def test_bad_worker_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"address": "tcp://127.0.0.1:4444", **kwargs}
    with pytest.raises(ValueError, match=message):
        run_worker_loop_forever(**arguments)  # type: ignore[arg-type]
    assert os.environ.get("REGENCY_SECRET")  # refused before it took the secret


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"workers": ["tcp://h:1"], "ca": "x"}, ValueError, "ca must be 'trust_all_connections'"),
        ({"workers": "tcp://h:1", "ca": "trust_all_connections"}, TypeError, "not one string"),
        ({"workers": [], "ca": "trust_all_connections"}, ValueError, "at least one worker"),
        ({"workers": ["h:1"], "ca": "trust_all_connections"}, ValueError, "SCHEME://HOST:PORT"),
    ],
)
def test_bad_attach_arguments_are_refused(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        attach_to_workers(**kwargs)  # type: ignore[arg-type]
