"""Multi-host figures, between Linux network namespaces on this machine (root
needed). ``python -m benchmarks.bench_multihost``; ``... --transports`` only compares the
transports between hosts (tcp, nng+tcp, nng+tls+tcp)."""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time

SECRET = "regency-benchmark-job-secret"
os.environ["REGENCY_SECRET"] = SECRET

import regency  # noqa: E402
import regency.actor  # noqa: E402
from regency.actor import Actor, attach_to_workers, endpoint, this_host  # noqa: E402
from regency.testing import make_tls_files, virtual_hosts, virtual_hosts_available  # noqa: E402


class Echo(Actor):
    @endpoint
    def ping(self) -> None:
        return None


def _round_trip_us(mesh: object) -> float:
    one = mesh.spawn("echo", Echo)  # type: ignore[attr-defined]
    one.ping.call_one().get(30)
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(500):
            one.ping.call_one().get(30)
        samples.append((time.perf_counter() - t0) / 500 * 1e6)
    return statistics.median(samples)


def _pipelined(mesh: object) -> float:
    one = mesh.spawn("pipe", Echo)  # type: ignore[attr-defined]
    one.ping.call_one().get(30)
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        futs = [one.ping.call_one() for _ in range(10_000)]
        for f in futs:
            f.get(60)
        rates.append(10_000 / (time.perf_counter() - t0))
    return statistics.median(rates)


Row = tuple[str, str, float, str]


def run() -> list[Row]:
    why = virtual_hosts_available()
    if why is not None:
        return [(f"multi-host figures skipped: {why}", "", float("nan"), "")]
    failures: list[object] = []
    regency.actor.unhandled_fault_hook = failures.append
    rows = []
    with virtual_hosts(2) as hosts:
        for host in hosts:
            host.start_worker(SECRET)
        mesh = attach_to_workers([h.worker_address for h in hosts], lease=5.0)
        remote = mesh.slice(hosts=0).spawn_procs()
        local = this_host().spawn_procs()
        rows.append(("call_one round trip, one host", "", _round_trip_us(local), "us"))
        rows.append(("call_one round trip, controller -> other namespace", "", _round_trip_us(remote), "us"))
        rows.append(("pipelined call_one, one host", "", _pipelined(local), "calls/s"))
        rows.append(("pipelined call_one, other namespace", "", _pipelined(remote), "calls/s"))
        # A worker killed with SIGKILL: its procs die with it, their links reset.
        victim = mesh.slice(hosts=1).spawn_procs().spawn("victim", Echo)
        victim.ping.call_one().get(30)
        n = len(failures)
        t0 = time.monotonic()
        assert hosts[1].worker is not None
        hosts[1].worker.send_signal(signal.SIGKILL)
        while len(failures) == n:
            time.sleep(0.001)
        rows.append(("killed worker -> owner told", "", (time.monotonic() - t0) * 1e3, "ms"))
        # A cut link: nothing resets; heartbeats find it.
        regency.configure(heartbeat_interval=0.2, heartbeat_timeout=1.0)
        cut = mesh.slice(hosts=0).spawn_procs().spawn("cut", Echo)
        cut.ping.call_one().get(30)
        n = len(failures)
        t0 = time.monotonic()
        hosts[0].cut()
        while len(failures) == n:
            time.sleep(0.01)
        rows.append(("cut link -> owner told (heartbeat_timeout=1 s)", "<= timeout + interval", (time.monotonic() - t0) * 1e3, "ms"))
        hosts[0].restore()
        local.stop().get(30)
        mesh.shutdown().get(30)
    regency.configure(heartbeat_interval=1.0, heartbeat_timeout=10.0)
    rows.extend(per_transport())
    return rows


def per_transport(schemes: tuple[str, ...] = ("tcp", "nng+tcp", "nng+tls+tcp")) -> list[Row]:
    """``call_one`` from the controller to a proc in another namespace, per host transport."""
    rows: list[Row] = []
    with virtual_hosts(1) as hosts, tempfile.TemporaryDirectory() as d:
        subnet = hosts[0].ip.rsplit(".", 1)[0]
        tls = make_tls_files([f"{subnet}.1", hosts[0].ip], d)
        for scheme in schemes:
            env = tls.env if "tls" in scheme else {}
            os.environ.update(env)
            hosts[0].start_worker(SECRET, scheme=scheme, env=env)
            mesh = attach_to_workers([hosts[0].worker_address], lease=5.0)
            remote = mesh.spawn_procs()
            rows.append((f"call_one round trip to another namespace, {scheme}", "",
                         _round_trip_us(remote), "us"))
            rows.append((f"pipelined call_one to another namespace, {scheme}", "",
                         _pipelined(remote), "calls/s"))
            mesh.shutdown().get(30)
            hosts[0].stop_worker()
    return rows


if __name__ == "__main__":
    for figure, target, value, unit in (per_transport() if "--transports" in sys.argv else run()):
        print(f"{figure:55s} {value:12,.1f} {unit:8s} {target}")
