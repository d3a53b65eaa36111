"""Monarch 0.7's bootstrap tests, imports swapped: workers on ``ipc://`` addresses
(``test_simple_bootstrap``), on an inherited socket (``test_fd_bootstrap``), on an alias
``DIAL@BIND`` (``test_alias_bootstrap``), and a wrapper interpreter that a recursive spawn runs
again (``test_with_python_executable``).

The bodies are Monarch's (python/tests/test_python_actors.py and test_host_mesh.py) with
``monarch`` changed to ``regency``; Monarch runs each in a fresh interpreter
(``@isolate_in_subprocess``), which these need not: the workers share the suite's
``REGENCY_SECRET``. Each worker runs in the repository root (``cwd=ROOT``) so its procs import
this package's actors, and a ``finally`` ends the workers when an assertion fails.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from tempfile import TemporaryDirectory

import pytest

from regency.actor import attach_to_workers, run_worker_loop_forever, this_host

from .actors import Hello, RankActor, WrapperMarkerActor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = 60


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_simple_bootstrap() -> None:
    with TemporaryDirectory() as d:
        procs = []
        workers = []
        try:
            for i in range(4):
                addr = f"ipc://{d}/{i}"
                env = {**os.environ}
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        f'import sys; from regency.actor import run_worker_loop_forever; run_worker_loop_forever(address={addr!r}, ca="trust_all_connections")',
                    ],
                    env=env,
                    cwd=ROOT,
                )
                procs.append(proc)
                workers.append(addr)

            hosts = attach_to_workers(ca="trust_all_connections", workers=workers)

            hello = hosts.spawn_procs().spawn("hello", Hello)

            r = hello.doit.call().get()
            for _, v in r.items():
                assert v == "hello!"
            hosts.shutdown().get(T)
        finally:
            _stop(procs)


@pytest.mark.slow
def test_fd_bootstrap() -> None:
    """Test that a worker can be started using a pre-opened fd for its listening socket."""
    procs = []
    workers = []
    try:
        for _i in range(2):
            # Create a TCP socket bound to an ephemeral port.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            fd = sock.fileno()

            env = {**os.environ}

            # Spawn the worker, passing the fd. The worker will adopt the fd
            # via the tcp://host:fdNNN syntax and serve on it.
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    f"import sys; from regency.actor import run_worker_loop_forever; "
                    f'run_worker_loop_forever(address="tcp://127.0.0.1:fd{fd}", ca="trust_all_connections")',
                ],
                env=env,
                pass_fds=(fd,),
                cwd=ROOT,
            )
            # Close our copy of the fd — the child owns it now.
            sock.close()
            procs.append(proc)
            # The client connects to the real port, not the fd syntax.
            workers.append(f"tcp://127.0.0.1:{port}")

        hosts = attach_to_workers(ca="trust_all_connections", workers=workers)
        hello = hosts.spawn_procs().spawn("hello", Hello)

        r = hello.doit.call().get()
        for _, v in r.items():
            assert v == "hello!"
        hosts.shutdown().get()
        for proc in procs:
            assert proc.wait(T) == 0
    finally:
        _stop(procs)


@pytest.mark.slow
def test_alias_bootstrap() -> None:
    """A worker started with an alias address (dial_to@bind_to) is reachable."""
    procs = []
    workers = []
    for _i in range(2):
        # Reserve an ephemeral port, then release it so the worker can bind
        # to it via the alias's bind_to address.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()

        env = {**os.environ}

        # dial_to advertises a reachable address; bind_to listens on the
        # wildcard interface.
        addr = f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from regency.actor import run_worker_loop_forever; "
                f'run_worker_loop_forever(address={addr!r}, ca="trust_all_connections")',
            ],
            env=env,
            cwd=ROOT,
        )
        procs.append(proc)
        # Pass the full alias through attach_to_workers. The attach path must
        # canonicalize this to dial_to before using it as host identity.
        workers.append(addr)

    try:
        hosts = attach_to_workers(ca="trust_all_connections", workers=workers)
        am = hosts.spawn_procs(per_host={"gpus": 1}).spawn("rank", RankActor)
        ranks = sorted(v for _, v in am.get_rank.call().get().items())
        assert ranks == [0, 1]
        hosts.shutdown().get()
    finally:
        _stop(procs)


def _make_python_wrapper() -> str:
    """
    Write a shell wrapper that stamps PYTHON_WRAPPER_PID=$$ (the wrapper
    shell's PID) and execs to the real Python interpreter.
    """
    real_python = sys.executable
    tmpdir = tempfile.mkdtemp(prefix="regency_test_python_exe_")
    wrapper_path = os.path.join(tmpdir, "python_wrapper")
    with open(wrapper_path, "w") as f:
        f.write(
            textwrap.dedent(
                f"""\
                #!/bin/sh
                export PYTHON_WRAPPER_PID=$$
                exec {real_python} "$@"
                """
            )
        )
    os.chmod(wrapper_path, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP)
    return wrapper_path


@pytest.mark.slow
def test_with_python_executable() -> None:
    wrapper_path = _make_python_wrapper()
    modified_host = this_host().with_python_executable(wrapper_path)

    # Direct spawn: proc should be launched via the wrapper; wrapper PID is set.
    procs = modified_host.spawn_procs(per_host={"procs": 1})
    am = procs.spawn("marker", WrapperMarkerActor)
    direct_pid = am.get_wrapper_pid.call_one().get()
    assert direct_pid != "", "wrapper was not executed for direct spawn"

    # Recursive spawn: actor calls this_host().spawn_procs() and the inner proc
    # should also be launched via the wrapper.
    inner_am = am.spawn_inner.call_one().get()
    inner_pid = inner_am.get_wrapper_pid.call_one().get()
    assert inner_pid != "", "wrapper was not executed for recursive spawn"
    assert inner_pid != direct_pid, "recursive spawn inherited PID instead of re-running wrapper"
    # A plain this_host() in the controller is not affected.
    assert "PYTHON_WRAPPER_PID" not in os.environ
    procs.stop().get(T)  # (not in Monarch's test) the inner proc stops with its owner


# -- Regency's own checks of the address forms ------------------------------------------------


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("ipc://relative/path", "ipc:///ABSOLUTE/PATH"),
        ("ipc://", "ipc:///ABSOLUTE/PATH"),
        ("tcp://127.0.0.1:1@ipc:///tmp/x", "TCP addresses, or both unix sockets"),
        ("tcp://127.0.0.1:1@nng+tcp://0.0.0.0:1", "one scheme"),
        ("nng+tcp://127.0.0.1:fd3", "tcp:// only"),
        ("udp://127.0.0.1:1", "SCHEME://HOST:PORT"),
        ("tcp://0.0.0.0:2222", "not a wildcard"),
    ],
)
def test_bad_worker_addresses_are_refused_with_the_form_expected(
    address: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run_worker_loop_forever(address=address, ca="trust_all_connections")


def test_a_controller_cannot_dial_an_inherited_socket() -> None:
    with pytest.raises(ValueError, match="dials the worker at tcp://HOST:PORT"):
        attach_to_workers(workers=["tcp://127.0.0.1:fd3"], ca="trust_all_connections")
    with pytest.raises(TypeError, match="must be a str"):
        attach_to_workers(workers=[3], ca="trust_all_connections")  # type: ignore[list-item]


@pytest.mark.slow
def test_attach_to_workers_accepts_future_addresses() -> None:
    """Monarch's test of the same name (which builds its Futures with a private helper):
    a worker address may be a ``Future[str]``, waited for by ``attach_to_workers``."""
    import threading

    from regency.actor import Future

    with TemporaryDirectory() as d:
        addr = f"ipc://{d}/0"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from regency.actor import run_worker_loop_forever; "
                f'run_worker_loop_forever(address={addr!r}, ca="trust_all_connections")',
            ],
            cwd=ROOT,
        )
        try:
            fut: Future[str] = Future()
            threading.Timer(0.2, fut.set_result, (addr,)).start()
            hosts = attach_to_workers(ca="trust_all_connections", workers=[fut])
            am = hosts.spawn_procs(per_host={"gpus": 1}).spawn("rank", RankActor)
            assert am.get_rank.call().get(T).values() == [0]
            hosts.shutdown().get(T)
            assert proc.wait(T) == 0
        finally:
            _stop([proc])


def test_worker_address_forms_parse_to_what_is_bound_and_dialled() -> None:
    from regency.core._worker_address import WorkerAddress, parse_worker_address, with_port

    def parse(address: str, worker: bool = True) -> WorkerAddress:
        return parse_worker_address(address, "address", worker=worker)

    assert parse("tcp://node7:2222") == WorkerAddress("tcp://node7:2222", "tcp://node7:2222", "node7")
    assert parse("ipc:///tmp/d/0") == WorkerAddress("unix:///tmp/d/0", "unix:///tmp/d/0", "127.0.0.1")
    assert parse("ipc:/tmp/d/0").dial == "unix:///tmp/d/0"  # Monarch prints unix:/PATH
    alias = parse("tcp://10.0.0.5:2222@tcp://0.0.0.0:2222")
    assert (alias.bind, alias.dial, alias.proc_host) == (
        "tcp://0.0.0.0:2222", "tcp://10.0.0.5:2222", "10.0.0.5",
    )  # fmt: skip
    inherited = parse("tcp://127.0.0.1:fd5")
    assert inherited.fd == 5 and with_port(inherited, 4444).dial == "tcp://127.0.0.1:4444"
    assert parse("tcp://[::1]:fd7").proc_host == "::1"
    # A controller dials the alias's DIAL; it cannot dial a descriptor.
    assert parse("tcp://10.0.0.5:2222@tcp://0.0.0.0:2222", worker=False).dial == "tcp://10.0.0.5:2222"
    with pytest.raises(ValueError, match="dials the worker at tcp://HOST:PORT"):
        parse("tcp://127.0.0.1:fd5", worker=False)
