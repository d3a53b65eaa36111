"""Security and robustness against real workers in network namespaces: an on-path
relay cannot inject frames, unauthenticated connections cannot starve a worker of
descriptors, leases survive a paused worker and a lapsed controller is told, reserved ports
stay reserved, and a worker serving many controllers in a row stays flat."""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import trio

from regency.core._runtime import derive_secret
from regency.testing import VirtualHost, virtual_hosts, virtual_hosts_available
from regency.transports import open_transport

from ..conftest import TEST_SECRET, TEST_WORKER_PREFIX
from ..transports.relay import Relay

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
    version = int(os.environ.pop("TEST_WIRE_VERSION", "0"))
    if version:  # a worker of another Regency release
        from regency.transports import _auth
        _auth.WIRE_VERSION, _auth.PREFIX = version, _auth.MAGIC + bytes((version,))
    from regency.__main__ import main
    sys.exit(main(["worker", "--listen", sys.argv[1]]))
    """
)


class Worker:
    """A ``regency worker`` in a virtual host, its log in a file."""

    def __init__(self, host: VirtualHost, port: int, env: dict[str, str] | None = None) -> None:
        self.address = f"tcp://{host.ip}:{port}"
        self.host, self.port = host, port
        #: Its TMPDIR (job directory, log); removed by :meth:`stop`. Named with our pid: the
        #: suite's final check (tests/conftest.py) looks for this run's.
        self.tmp = tempfile.mkdtemp(prefix=f"{TEST_WORKER_PREFIX}{os.getpid()}-")
        self.log_path = os.path.join(self.tmp, "worker.log")
        full_env = {
            **os.environ,
            "REGENCY_SECRET": TEST_SECRET,
            "PYTHONPATH": ROOT,
            "TMPDIR": self.tmp,
            **(env or {}),
        }
        try:
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    ["ip", "netns", "exec", host.name, sys.executable, "-c", WORKER,
                     self.address],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=full_env,
                    text=True,
                )
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening" in line, (line, self.log())

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        """Kill the worker, wait for it, and remove its directory: once its zygote has
        removed the job directory in it (it does when the worker dies), or after a while."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + T
        while os.path.exists(self.tmp):
            if time.monotonic() > deadline or not any(
                name.startswith("regency-") for name in os.listdir(self.tmp)
            ):
                shutil.rmtree(self.tmp, ignore_errors=True)
            time.sleep(0.02)


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[VirtualHost]]:
    with virtual_hosts(2) as made:
        yield made


@pytest.fixture
def worker_factory(hosts: list[VirtualHost]) -> Iterator[list[Worker]]:
    made: list[Worker] = []
    try:
        yield made
    finally:
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


def _controller(script: str, *args: str) -> subprocess.Popen[str]:
    """A controller program in this namespace; it talks on stdout and waits on stdin."""
    prelude = textwrap.dedent(
        """
        import os, signal, sys, time
        import regency, regency.actor
        from regency.actor import attach_to_workers
        from tests.core.hardening_actors import Busy, Returner
        import threading
        _lock = threading.Lock()
        def say(*what):  # one write per line: the fault hook runs on another thread
            with _lock:
                sys.stdout.write(" ".join(map(str, what)) + "\\n")
                sys.stdout.flush()
        regency.actor.unhandled_fault_hook = lambda f: say("FAULT", f.mesh_name)
        def wait_go():
            assert sys.stdin.readline().strip() == "GO"
        """
    )
    controller = subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "REGENCY_SECRET": TEST_SECRET},
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert controller.stdout is not None
        for line in controller.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    _lines[controller.pid] = lines
    return controller


_lines: dict[int, queue.Queue[str]] = {}


def _next_line(controller: subprocess.Popen[str]) -> str:
    try:
        return _lines[controller.pid].get(timeout=90)
    except queue.Empty:
        return "(nothing within 90 s)"


def _expect(controller: subprocess.Popen[str], word: str) -> str:
    line = _next_line(controller)
    while line.startswith("FAULT"):  # supervision reports of meshes the test let fail
        line = _next_line(controller)
    if not line.startswith(word):
        controller.kill()
        controller.wait()
        assert controller.stderr is not None
        err = controller.stderr.read()
        rest = ""
        while not _lines[controller.pid].empty():
            rest += _lines[controller.pid].get()
        raise AssertionError(f"expected {word}, got {line!r} {rest!r}; stderr:\n{err[-3000:]}")
    return line[len(word) :].strip()


def _go(controller: subprocess.Popen[str]) -> None:
    assert controller.stdin is not None
    controller.stdin.write("GO\n")
    controller.stdin.flush()


def test_a_paused_worker_keeps_the_procs_of_a_controller_that_kept_renewing(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    worker = _start(worker_factory, hosts[0])
    controller = _controller(
        """
        from tests.core.hardening_actors import EnvProbe
        hosts = attach_to_workers([sys.argv[1]], lease=1.0)
        pm = hosts.spawn_procs(per_host={"gpus": 1})
        r = pm.spawn("r", Returner)
        say("ENV", pm.spawn("env", EnvProbe).secret_seen.call_one().get(30))
        say("PID", r.pid.call_one().get(30))
        wait_go()
        try:
            say("AFTER", r.pid.call_one().get(10))
        except Exception as exc:
            say("AFTER", type(exc).__name__, exc)
        """,
        worker.address,
    )
    try:
        # The worker has REGENCY_SECRET in its environment; its procs and zygote must not.
        env = _expect(controller, "ENV")
        assert "True" not in env, env
        pid = _expect(controller, "PID")
        worker.proc.send_signal(signal.SIGSTOP)
        time.sleep(2.5)  # the fault: a pause of 2.5 leases
        worker.proc.send_signal(signal.SIGCONT)
        _go(controller)
        assert _expect(controller, "AFTER") == pid, worker.log()
        assert "this worker was paused for" in worker.log()
        assert "killing" not in worker.log()
    finally:
        controller.kill()
        controller.wait()


def test_a_controller_whose_lease_lapsed_is_told_at_once_and_can_attach_again(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    worker = _start(worker_factory, hosts[1])
    controller = _controller(
        """
        hosts = attach_to_workers([sys.argv[1]], lease=1.0)
        r = hosts.spawn_procs(per_host={"gpus": 1}).spawn("r", Returner)
        say("READY", r.pid.call_one().get(30))
        wait_go()
        started = time.monotonic()
        try:
            hosts.spawn_procs(per_host={"gpus": 1}).spawn("r2", Returner).pid.call_one().get(60)
            say("SPAWNED")
        except Exception as exc:
            say("REFUSED", round(time.monotonic() - started), type(exc).__name__, exc)
        hosts = attach_to_workers([sys.argv[1]], lease=1.0)
        r3 = hosts.spawn_procs(per_host={"gpus": 1}).spawn("r3", Returner)
        say("AGAIN", r3.give.call_one("fine").get(30))
        """,
        worker.address,
    )
    try:
        _expect(controller, "READY")
        controller.send_signal(signal.SIGSTOP)  # the controller goes silent for 2.5 leases
        time.sleep(2.5)
        controller.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + T
        while "lease ran out" not in worker.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        _go(controller)
        refused = _expect(controller, "REFUSED")
        assert "dropped this controller" in refused and "lease of 1.0 s" in refused, refused
        assert int(refused.split()[0]) < 5, refused  # not spawn_timeout (60 s)
        assert _expect(controller, "AGAIN") == "fine"
    finally:
        controller.kill()
        controller.wait()


SQUAT = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket()
    if sys.argv[3] == "reuse":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((sys.argv[1], int(sys.argv[2])))
        s.listen()
        print("BOUND", flush=True)
    except OSError as exc:
        print("INUSE", exc.strerror, flush=True)
    sys.stdin.read()
    """
)


def _squat(host: VirtualHost, port: int, mode: str) -> tuple[subprocess.Popen[str], str]:
    squatter = subprocess.Popen(
        ["ip", "netns", "exec", host.name, sys.executable, "-c", SQUAT, host.ip, str(port), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert squatter.stdout is not None
    return squatter, squatter.stdout.readline().strip()


def test_reserved_ports_stay_reserved_and_a_stolen_one_is_named(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    worker = _start(worker_factory, hosts[0])
    controller = _controller(
        """
        from regency.core import current_runtime
        hosts = attach_to_workers([sys.argv[1]], lease=5.0)
        pool = current_runtime().hosts.ports[sys.argv[1]]
        say("PORTS", pool[0], pool[1])
        for name in ("first", "second"):
            wait_go()
            try:
                r = hosts.spawn_procs(per_host={"gpus": 1}).spawn(name, Returner)
                say("RESULT", r.give.call_one("fine").get(30))
            except Exception as exc:
                say("RESULT", type(exc).__name__, exc)
        """,
        worker.address,
    )
    squatters = []
    try:
        first, second = map(int, _expect(controller, "PORTS").split())
        # A process that binds plainly cannot take a port the worker reserved.
        squatter, said = _squat(hosts[0], first, "plain")
        squatters.append(squatter)
        assert said.startswith("INUSE"), said
        _go(controller)
        assert _expect(controller, "RESULT") == "fine"
        # One that shares the port (SO_REUSEADDR) and listens first does take it: the spawn
        # fails at once, naming the port and what happened.
        squatter, said = _squat(hosts[0], second, "reuse")
        squatters.append(squatter)
        assert said == "BOUND", said
        _go(controller)
        result = _expect(controller, "RESULT")
        assert f"port {second} on" in result and "was taken by another process" in result, result
    finally:
        for s in squatters:
            s.kill()
            s.communicate()
        controller.kill()
        controller.wait()


def test_a_busy_remote_proc_is_vouched_for_and_a_stopped_one_is_found(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    worker = _start(worker_factory, hosts[1], REGENCY_HEARTBEAT_INTERVAL="0.1")
    controller = _controller(
        """
        regency.configure(heartbeat_interval=0.1, heartbeat_timeout=0.5)
        hosts = attach_to_workers([sys.argv[1]], lease=5.0)
        busy = hosts.spawn_procs(per_host={"gpus": 2}).spawn("busy", Busy)
        pids = busy.pid.call().get(30).values()
        say("CRUNCHED", busy.slice(gpus=0).crunch.call_one(2.0).get(120))
        os.kill(pids[1], signal.SIGSTOP)  # same machine: the pid namespace is shared
        started = time.monotonic()
        try:
            busy.slice(gpus=1).pid.call_one().get(30)
        except Exception as exc:
            say("STOPPED", round(time.monotonic() - started), type(exc).__name__, exc)
        os.kill(pids[1], signal.SIGCONT)
        """,
        worker.address,
    )
    try:
        assert float(_expect(controller, "CRUNCHED")) >= 1.0  # two heartbeat timeouts
        stopped = _expect(controller, "STOPPED")
        assert "sent no heartbeat" in stopped and "(stuck)" in stopped, stopped
        assert int(stopped.split()[0]) < 10, stopped
    finally:
        controller.kill()
        controller.wait()


def _rss_and_fds(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss * 1024, len(os.listdir(f"/proc/{pid}/fd"))


def test_a_worker_serving_many_controllers_in_a_row_stays_flat_and_cleans_up_on_sigterm(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    from regency.core import _messages as M
    from regency.core._config import Config
    from regency.core._future import Future
    from regency.core._hosts import _Reply
    from regency.core._runtime import Runtime

    worker = _start(
        worker_factory, hosts[0], REGENCY_DELIVERY_TIMEOUT="0.3", REGENCY_HEARTBEAT_INTERVAL="0.1"
    )
    here = hosts[0].ip.rsplit(".", 1)[0] + ".1"  # this namespace's address on the bridge
    jobdir = os.path.join(worker.tmp, "controllers")  # removed with the worker's directory
    os.mkdir(jobdir, 0o700)

    async def attach(rt: Runtime) -> object:
        fut: Future[object] = Future()
        port = rt.open_port(_Reply(fut, "a request", worker.address))
        rt.post(worker.address, M.Attach(rt.address, 30.0, port))
        try:
            with trio.fail_after(T):
                return await fut
        except (ConnectionError, trio.TooSlowError) as exc:
            return exc

    async def one_controller(i: int) -> None:
        """A whole controller's life against the worker: attach, detach, go away."""
        rt = Runtime(
            f"c{i}x{os.getpid()}",
            secret=SECRET,
            jobdir=jobdir,
            config=Config(default_transport="tcp", tcp_host=here),
            address=f"tcp://{here}:0",
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve)
            hostname, _, ports = await attach(rt)  # type: ignore[misc]
            assert hostname
            assert len(ports) == 32
            rt.post(worker.address, M.Detach(rt.address))
            with trio.fail_after(T):  # until the worker acknowledged (handled) the DETACH
                while rt.outbox(worker.address)._unacked:
                    await trio.sleep(0.005)
            rt.stop()

    def serve(count: int, first: int, fds_idle: int) -> tuple[int, int]:
        for i in range(first, first + count):
            trio.run(one_controller, i)
        # Flat means: once the worker may forget them (3 x delivery_timeout + 2 heartbeats,
        # 1.1 s here), nothing of these controllers is left. Poll for it, bounded.
        deadline = time.monotonic() + 5
        while _rss_and_fds(worker.proc.pid)[1] > fds_idle and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.2)  # the forgetting horizon, so that what is left is what stays
        return _rss_and_fds(worker.proc.pid)

    idle_fds = _rss_and_fds(worker.proc.pid)[1]
    rss0, fds0 = serve(5, 0, idle_fds)  # warm up: imports, caches, the allocator's arenas
    rss1, fds1 = serve(15, 5, fds0)
    assert fds1 <= fds0 + 1, (fds0, fds1)
    assert rss1 - rss0 < 2 << 20, f"the worker grew {(rss1 - rss0) >> 10} KiB over 15 controllers"
    assert "killing" not in worker.log()
    # SIGTERM: the worker's job directory goes with it.
    assert [d for d in os.listdir(worker.tmp) if d.startswith("regency-worker-")]
    worker.proc.send_signal(signal.SIGTERM)
    worker.proc.wait(T)
    assert not [d for d in os.listdir(worker.tmp) if d.startswith("regency-worker-")]


def test_a_worker_of_another_wire_version_is_named_at_once(
    hosts: list[VirtualHost], worker_factory: list[Worker]
) -> None:
    """A controller attaching to a worker of another Regency release learns which, at once,
    instead of either side misreading the other's frames."""
    worker = _start(worker_factory, hosts[0], TEST_WIRE_VERSION="1")
    controller = _controller(
        """
        started = time.monotonic()
        try:
            hosts = attach_to_workers([sys.argv[1]], lease=5.0)
            hosts.spawn_procs(per_host={"gpus": 1}).spawn("r", Returner).pid.call_one().get(60)
            say("ATTACHED")
        except Exception as exc:
            say("REFUSED", round(time.monotonic() - started), type(exc).__name__, exc)
        """,
        worker.address,
    )
    try:
        refused = _expect(controller, "REFUSED")
        assert "wire version 1" in refused and "version 2" in refused, refused
        assert int(refused.split()[0]) < 10, refused  # no retrying until a timeout
    finally:
        controller.kill()
        controller.wait()
