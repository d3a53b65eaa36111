"""Issue 11 (security and robustness) against real workers in network namespaces: an on-path
relay cannot inject frames, unauthenticated connections cannot starve a worker of
descriptors, leases survive a paused worker and a lapsed controller is told, reserved ports
stay reserved, and a worker serving many controllers in a row stays flat."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator

import pytest
import trio

from regency.core._runtime import derive_secret
from regency.testing import VirtualHost, virtual_hosts, virtual_hosts_available
from regency.transports import open_transport

from ..conftest import TEST_SECRET
from ..transports.test_protect import Relay

pytestmark = [
    pytest.mark.skipif(virtual_hosts_available() is not None, reason=str(virtual_hosts_available())),
    pytest.mark.slow,
]
T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = derive_secret(TEST_SECRET)

WORKER = textwrap.dedent(
    """
    import os, resource, sys
    nofile = int(os.environ.pop("TEST_NOFILE", "0"))
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    from regency.__main__ import main
    sys.exit(main(["worker", "--listen", sys.argv[1]]))
    """
)


class Worker:
    """A ``regency worker`` in a virtual host, its log in a file."""

    def __init__(self, host: VirtualHost, port: int, env: dict[str, str] | None = None) -> None:
        self.address = f"tcp://{host.ip}:{port}"
        self.host, self.port = host, port
        self.tmp = tempfile.mkdtemp(prefix="regency-test-worker-")
        self.log_path = os.path.join(self.tmp, "worker.log")
        full_env = {
            **os.environ,
            "REGENCY_SECRET": TEST_SECRET,
            "PYTHONPATH": ROOT,
            "TMPDIR": self.tmp,
            **(env or {}),
        }
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", host.name, sys.executable, "-c", WORKER, self.address],
                stdout=subprocess.PIPE,
                stderr=log,
                env=full_env,
                text=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening" in line, (line, self.log())

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[VirtualHost]]:
    with virtual_hosts(2) as made:
        yield made


@pytest.fixture
def worker_factory(hosts: list[VirtualHost]) -> Iterator[list[Worker]]:
    made: list[Worker] = []
    yield made
    for w in made:
        w.stop()


def _start(made: list[Worker], host: VirtualHost, **env: str) -> Worker:
    worker = Worker(host, 7800 + len(made) + 10 * (os.getpid() % 100), env)
    made.append(worker)
    return worker


class _Sink:
    def __init__(self) -> None:
        self.lost: list[BaseException | None] = []

    def frame_received(self, conn: object, frame: memoryview) -> None:
        pass

    def connection_lost(self, conn: object, exc: BaseException | None) -> None:
        self.lost.append(exc)


class _MakeDir:
    """Unpickling this creates a directory: proof that a frame was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


def test_a_relay_on_the_path_cannot_inject_a_frame_into_a_worker(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    worker = _start(worker_factory, hosts[0])
    marker = os.path.join(worker.tmp, "the-attacker-ran-code")
    envelope = pickle.dumps(_MakeDir(marker))
    inner = len(envelope).to_bytes(4, "little") + envelope
    attack = len(inner).to_bytes(4, "little") + inner

    async def main() -> None:
        async with open_transport(SECRET) as transport, trio.open_nursery() as nursery:
            relayed = await nursery.start(Relay((hosts[0].ip, worker.port), "inject", attack).serve)
            sink = _Sink()
            # The controller's real handshake goes through the relay, then the relay adds
            # its frame.
            conn = await transport.connect(relayed, sink)
            conn.send_nowait(b"the controller's own frame")
            with trio.fail_after(T):
                while not sink.lost and not conn.closed:
                    await trio.sleep(0.02)
            # The worker keeps serving: a direct connection completes its handshake.
            direct = await transport.connect(worker.address, _Sink())
            direct.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not os.path.exists(marker), "the worker unpickled the injected frame"
    deadline = time.monotonic() + T
    while "closing connection" not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "closing connection to tcp://" in worker.log(), worker.log()
    assert "record" in worker.log().split("closing connection", 1)[1].splitlines()[0]
    assert worker.proc.poll() is None


def test_unauthenticated_connections_cannot_starve_a_worker_of_descriptors(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    worker = _start(worker_factory, hosts[1], TEST_NOFILE="64")
    squatters = []
    try:
        for _ in range(150):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect((hosts[1].ip, worker.port))
            except BlockingIOError:
                pass
            squatters.append(s)
        time.sleep(0.5)  # not synchronisation: the flood needs to reach the worker's table

        async def connect() -> float:
            async with open_transport(SECRET) as transport:
                started = trio.current_time()
                conn = await transport.connect(worker.address, _Sink())
                took = trio.current_time() - started
                conn.close()
                return took

        took = trio.run(connect)
    finally:
        for s in squatters:
            s.close()
    assert took < 2.0, f"a real peer waited {took:.1f} s behind unauthenticated connections"
    log = worker.log()
    assert log.count("accept failed") == 0
    assert log.count("cannot accept connections") <= 2, log
    assert log.count("refused connection from") <= 5, log
