"""Multi-host jobs between Linux network namespaces on this machine: real TCP, real workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest

from regency.actor import HostMesh, SupervisionError, attach_to_workers
from regency.testing import (
    TlsFiles,
    VirtualHost,
    make_tls_files,
    nng_tls_unavailable,
    virtual_hosts,
    virtual_hosts_available,
)

from ..conftest import TEST_SECRET, RootFailures, SpawnProcs
from ..conftest import pid_alive as _alive
from .actors import Relay, Where

pytestmark = [
    pytest.mark.slow,  # real processes on network namespaces
    pytest.mark.skipif(
        virtual_hosts_available() is not None, reason=str(virtual_hosts_available())
    ),
]
T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: Every transport that carries a multi-host job; the whole module runs over each.
SCHEMES = ["tcp", "nng+tcp", "nng+tls+tcp"]


@pytest.fixture(scope="module")
def machines() -> Iterator[list[VirtualHost]]:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden: the test workers would not match")
    with virtual_hosts(4) as made:
        yield made


@pytest.fixture(scope="module")
def tls_files(machines: list[VirtualHost], tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A throwaway CA and one certificate for every virtual host and this namespace."""
    subnet = machines[0].ip.rsplit(".", 1)[0]
    names = [f"{subnet}.1", *(m.ip for m in machines)]
    return make_tls_files(names, str(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module", params=SCHEMES)
def scheme(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if "tls" in kind and (why := nng_tls_unavailable()) is not None:
        pytest.skip(why)
    return kind


@pytest.fixture(scope="module")
def hosts(
    machines: list[VirtualHost], scheme: str, tls_files: TlsFiles
) -> Iterator[list[VirtualHost]]:
    """Workers listening on ``scheme`` on every virtual host (restarted per scheme); for TLS,
    this process (the controller) and the workers get the certificates."""
    env = tls_files.env if "tls" in scheme else {}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        for host in machines:
            host.stop_worker()
            host.start_worker(TEST_SECRET, scheme=scheme, env=env)
        yield machines
    finally:
        for host in machines:
            host.stop_worker()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def mesh(hosts: list[VirtualHost]) -> Iterator[HostMesh]:
    """The first three hosts, attached to this test process (the controller). The lease
    outlasts the links the tests cut: a cut held until a heartbeat timeout is detected, plus
    TCP's retransmission back-off after it heals, took a 5 s lease's renewals past it under
    CI load, and the worker dropped this controller for the tests that follow. Leases
    themselves are tested with attachments of their own (below)."""
    attached = attach_to_workers([h.worker_address for h in hosts[:3]], lease=30.0)
    yield attached
    attached.shutdown().get(T)




def test_spawn_call_broadcast_across_hosts(
    mesh: HostMesh, hosts: list[VirtualHost], spawn_procs: SpawnProcs, scheme: str
) -> None:
    two = mesh.slice(hosts=slice(0, 2))
    pm = spawn_procs(per_host={"gpus": 2}, on=two)
    assert pm.sizes == {"hosts": 2, "gpus": 2}
    where = pm.spawn("where", Where)
    addresses = where.where.call().get(T)
    for point, address in addresses.items():
        assert address.startswith(f"{scheme}://{hosts[point['hosts']].ip}:")
    where.bump.broadcast()
    assert where.bump.call().get(T).values() == [2, 2, 2, 2]
    # Actors talk to actors on the other host directly.
    relays = pm.spawn("relays", Relay, where)
    answers = relays.ask_other_host.call().get(T)
    for point, answer in answers.items():
        assert answer.startswith(f"{scheme}://{hosts[1 - point['hosts']].ip}:")
    pm.stop().get(T)


def test_a_killed_worker_fails_its_procs_and_the_rest_goes_on(
    mesh: HostMesh,
    hosts: list[VirtualHost],
    roots: RootFailures,
    spawn_procs: SpawnProcs,
    scheme: str,
) -> None:
    pm = spawn_procs(per_host={"gpus": 1}, on=mesh.slice(hosts=slice(1, 3)))
    name = f"victims{SCHEMES.index(scheme)}"  # failures reach one root for the whole session
    where = pm.spawn(name, Where)
    pids = where.pid.call().get(T).values()
    busy = where.slice(hosts=1).bump.call_one()  # host index 1 of the slice: hosts[2]
    busy.get(T)
    start = time.monotonic()
    worker = hosts[2].worker
    assert worker is not None
    worker.send_signal(signal.SIGKILL)
    failure = roots.wait_for(name)
    detected = time.monotonic() - start
    assert failure.ranks == (1,)
    assert detected < 5
    assert not _alive(pids[1])  # its proc died with the worker
    with pytest.raises(SupervisionError, match=f'failure on mesh "{name}" at rank 1'):
        where.slice(hosts=1).bump.call_one().get(T)
    assert where.slice(hosts=0).bump.call_one().get(T) == 1
    pm.slice(hosts=0).stop().get(T)


def test_a_cut_link_that_heals_loses_nothing_and_duplicates_nothing(
    mesh: HostMesh, hosts: list[VirtualHost], spawn_procs: SpawnProcs
) -> None:
    pm = spawn_procs(per_host={"gpus": 1}, on=mesh.slice(hosts=0))
    counter = pm.spawn("counter", Where)
    assert counter.bump.call_one().get(T) == 1
    hosts[0].cut()
    try:
        pending = [counter.bump.call_one() for _ in range(20)]
        time.sleep(1.0)  # shorter than the heartbeat timeout: TCP retransmits
    finally:
        hosts[0].restore()
    assert sorted(f.get(T) for f in pending) == list(range(2, 22))
    assert counter.total.call_one().get(T) == 21
    pm.stop().get(T)


def test_a_cut_link_that_stays_cut_is_detected_by_heartbeat(
    mesh: HostMesh,
    hosts: list[VirtualHost],
    roots: RootFailures,
    spawn_procs: SpawnProcs,
    configured: Callable[..., None],
    scheme: str,
) -> None:
    name = f"lonely{SCHEMES.index(scheme)}"
    configured(heartbeat_interval=0.2, heartbeat_timeout=2.0)
    pm = spawn_procs(per_host={"gpus": 1}, on=mesh.slice(hosts=1))
    lonely = pm.spawn(name, Where)
    lonely.bump.call_one().get(T)
    start = time.monotonic()
    hosts[1].cut()
    try:
        with pytest.raises(SupervisionError, match="sent no heartbeat"):
            lonely.bump.call_one().get(T)
        roots.wait_for(name)
        detected = time.monotonic() - start
    finally:
        hosts[1].restore()
    assert detected < 5


def test_wrong_secret_and_garbage_are_refused_and_the_worker_keeps_serving(
    hosts: list[VirtualHost],
) -> None:
    program = textwrap.dedent(
        """
        import sys
        from regency.actor import attach_to_workers
        try:
            attach_to_workers([sys.argv[1]], secret="not-the-job-secret-at-all").initialized.get()
        except Exception as e:
            print(type(e).__name__, e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program, hosts[3].worker_address],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"},
    )
    assert "secret" in out.stdout, out.stdout + out.stderr
    import socket

    with socket.create_connection((hosts[3].ip, 7700), timeout=5) as raw:
        raw.sendall(os.urandom(4096))
    worker = hosts[3].worker
    assert worker is not None and worker.poll() is None


@pytest.mark.parametrize("scheme", ["nng+tls+tcp"], indirect=True)
def test_a_controller_that_cannot_verify_a_tls_worker_is_refused_at_once(
    hosts: list[VirtualHost], scheme: str, tls_files: TlsFiles
) -> None:
    program = textwrap.dedent(
        """
        import sys, time
        from regency.actor import attach_to_workers
        start = time.monotonic()
        try:
            attach_to_workers([sys.argv[1]], lease=5.0).initialized.get()
        except Exception as e:
            print(type(e).__name__, e)
        print("after", round(time.monotonic() - start, 1))
        """
    )
    env = {**os.environ, **tls_files.env, "REGENCY_TLS_CA": tls_files.other_ca}
    out = subprocess.run(
        [sys.executable, "-c", program, hosts[3].worker_address],
        capture_output=True, text=True, cwd=ROOT, timeout=60, env=env,
    )
    first, after = out.stdout.splitlines()[:2]
    assert first.startswith(
        f"ConnectionError attach_to_workers: attach failed: the worker at "
        f"{hosts[3].worker_address}: "
    ), out.stdout + out.stderr
    assert first.endswith("Cryptographic error (nng error 26)"), first
    assert float(after.split()[1]) < 5  # refused, not retried until delivery_timeout
    # The worker still serves a controller that trusts the right CA.
    again = attach_to_workers([hosts[3].worker_address], lease=5.0)
    assert again.spawn_procs(per_host={"gpus": 1}).spawn("w", Where).bump.call_one().get(T) == 1
    again.shutdown().get(T)


CONTROLLER = textwrap.dedent(
    """
    import sys, time
    from regency.actor import attach_to_workers
    from tests.multihost.actors import Where
    hosts = attach_to_workers([sys.argv[1]], lease=1.0)
    pm = hosts.spawn_procs(per_host={"gpus": 2})
    print(" ".join(str(p) for p in pm.spawn("w", Where).pid.call().get(30).values()), flush=True)
    time.sleep(600)
    """
)


def test_a_killed_controller_leaves_no_procs_and_the_worker_takes_a_new_one(
    hosts: list[VirtualHost],
) -> None:
    address = hosts[3].worker_address
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, address],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        assert controller.stdout is not None
        pids = [int(p) for p in controller.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        # While it lives, the worker refuses a second controller.
        with pytest.raises(ConnectionRefusedError, match="already serves the controller"):
            attach_to_workers([address], lease=5.0).initialized.get()
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        if controller.stdout is not None:
            controller.stdout.close()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "procs outlived their controller's lease"
        time.sleep(0.1)
    # The worker now accepts us.
    again = attach_to_workers([address], lease=5.0)
    mine = again.spawn_procs(per_host={"gpus": 1})
    assert mine.spawn("w", Where).bump.call_one().get(T) == 1
    again.shutdown().get(T)


def test_remote_procs_forward_their_output(
    mesh: HostMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    from regency.core._config import overridden

    from ..logs.actors import Printer

    with overridden(enable_log_forwarding=True):
        pm = mesh.slice(hosts=slice(0, 2)).spawn_procs(per_host={"gpus": 1})
    printers = pm.spawn("printers", Printer)
    pm.logging_option(stream_to_client=True, aggregate_window_sec=None).get(T)
    printers.say.call("remote").get(T)
    pm.stop().get(T)  # the flush barrier runs over the TCP links first
    out, err = capsys.readouterr()
    for rank in (0, 1):
        assert f"] [{rank}] out remote {rank}\n" in out
        assert f"] [{rank}] sub remote {rank}\n" in out
        assert f"] [{rank}] err remote {rank}\n" in err
@pytest.mark.parametrize("scheme", ["tcp"], indirect=True)
def test_configure_chooses_the_transport_between_hosts(
    hosts: list[VirtualHost], scheme: str
) -> None:
    # configure(default_transport=...) naming a transport that reaches other hosts wins over
    # the scheme of the worker addresses: for the controller's address and its procs'.
    chosen = "nng+tcp"
    program = textwrap.dedent(
        """
        import sys
        import regency
        from regency.actor import attach_to_workers
        from tests.multihost.actors import Where
        regency.configure(default_transport=sys.argv[2])
        hosts = attach_to_workers([sys.argv[1]], lease=5.0)
        where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("w", Where)
        print(where.where.call_one().get(30))
        print(where.pid.call_one().get(30))
        hosts.shutdown().get(30)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program, hosts[3].worker_address, chosen],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    address, pid = out.stdout.split()
    assert address.startswith(f"{chosen}://{hosts[3].ip}:"), address
    assert not _alive(int(pid))
