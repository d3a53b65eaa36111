"""Monarch 0.7's worker names: ``start_worker_loop_forever``, ``run_worker_loop_until_shutdown``,
ProcAddr worker addresses, and ``hosts_from_config``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from regency.actor import (
    ProcId,
    Uid,
    attach_to_workers,
    start_worker_loop_forever,
)

from ..conftest import TEST_SECRET, pid_alive
from ..jobs.actors import Probe

T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read() and pid_alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _wait_gone(text: str) -> None:
    deadline = time.monotonic() + T
    while _processes_naming(text):
        assert time.monotonic() < deadline, f"still running: {_processes_naming(text)}"
        time.sleep(0.1)


@pytest.mark.slow
def test_start_worker_loop_forever_serves_a_proc_addr_until_shutdown() -> None:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden")
    address = f"tcp://127.0.0.1:{_free_port()}"
    proc_addr = f"{ProcId(Uid.instance('service'))}@{address}"
    lifetime = start_worker_loop_forever(address=proc_addr, ca="trust_all_connections")
    try:
        assert not lifetime.done()  # listening, serving
        hosts = attach_to_workers(workers=[proc_addr], ca="trust_all_connections", name="started")
        probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
        assert probes.bump.call().get(T).values() == [1, 1]
        hosts.shutdown().get(T)
        assert lifetime.get(T) is None  # the host mesh was shut down: the worker is done
    finally:
        if not lifetime.done():
            for pid in _processes_naming(address):
                os.kill(pid, 15)
        _wait_gone(address)


@pytest.mark.slow
def test_start_worker_loop_forever_raises_what_stops_the_worker_at_start() -> None:
    with pytest.raises(ValueError, match="not a wildcard"):
        start_worker_loop_forever(address="tcp://*:4444", ca="trust_all_connections")
    with pytest.raises(ValueError, match="ca must be 'trust_all_connections'"):
        start_worker_loop_forever(address="tcp://127.0.0.1:4444", ca="/etc/ca.pem")


@pytest.mark.slow
def test_a_started_worker_stops_when_the_process_that_started_it_ends() -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    program = textwrap.dedent(
        f"""
        from regency.actor import start_worker_loop_forever
        start_worker_loop_forever(address={address!r}, ca="trust_all_connections")
        print("STARTED", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=T
    )
    assert done.returncode == 0, done.stderr
    assert "regency worker listening on" in done.stdout and "STARTED" in done.stdout
    _wait_gone(address)


@pytest.mark.slow
def test_run_worker_loop_until_shutdown_returns_to_its_caller() -> None:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden")
    address = f"tcp://127.0.0.1:{_free_port()}"
    proc_addr = f"{ProcId(Uid.instance('service'))}@{address}"
    program = textwrap.dedent(
        f"""
        from regency.actor import run_worker_loop_until_shutdown
        run_worker_loop_until_shutdown(address={proc_addr!r}, ca="trust_all_connections")
        print("RETURNED", flush=True)
        """
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", program], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        assert "listening on" in worker.stdout.readline()
        hosts = attach_to_workers(workers=[address], ca="trust_all_connections")
        assert hosts.spawn_procs().spawn("probe", Probe).bump.call_one().get(T) == 1
        hosts.shutdown().get(T)
        out, err = worker.communicate(timeout=T)
        assert worker.returncode == 0, err
        assert "RETURNED" in out
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.mark.slow
def test_hosts_from_config_gives_two_hosts_without_any_setup() -> None:
    program = textwrap.dedent(
        """
        from regency.job import hosts_from_config
        from tests.jobs.actors import Probe
        hosts = hosts_from_config("MONARCH_HOSTS")
        print("EXTENT", dict(hosts.extent), flush=True)
        probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
        workers = {worker for _, _, worker in probes.where.call().get(30).values()}
        print("WORKERS", len(workers), flush=True)
        hosts.shutdown().get(30)
        print("DONE", flush=True)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}  # none needed
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=2 * T,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "EXTENT {'hosts': 2}" in done.stdout
    assert "WORKERS 2" in done.stdout and "DONE" in done.stdout
