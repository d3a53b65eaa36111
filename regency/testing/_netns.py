"""Several "hosts" on one Linux machine: network namespaces joined by a bridge.

Each :class:`VirtualHost` is a network namespace with its own address on a private /24,
reachable from this (the root) namespace through a bridge; a ``regency worker`` can run in it.
Needs root and iproute2 (``ip``). Everything is created with unique names and removed on exit,
and traffic only ever goes to these addresses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import attrs


def virtual_hosts_available() -> str | None:
    """None when virtual hosts can be made here, else why not."""
    if sys.platform != "linux":
        return "virtual hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "virtual hosts need root (ip netns)"
    if shutil.which("ip") is None:
        return "virtual hosts need iproute2's `ip`"
    global _probed
    if _probed is None:
        # Root is not always enough (a container without CAP_NET_ADMIN): try once.
        probe = f"rgprobe{os.getpid() % 100000}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode == 0:
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
            _probed = ""
        else:
            _probed = f"cannot create network namespaces here: {made.stderr.strip()}"
    return _probed or None


_probed: str | None = None
#: virtual_hosts() calls made by this process (see there).
_calls = 0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@attrs.define
class VirtualHost:
    name: str  #: the network namespace
    ip: str
    veth: str  #: the root-side end of its link, for cutting it
    worker: subprocess.Popen[str] | None = None
    worker_address: str = ""

    def start_worker(
        self,
        secret: str,
        port: int = 7700,
        *,
        scheme: str = "tcp",
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Start ``regency worker`` in this host; return its address once it listens.

        ``scheme`` is the worker's transport (``tcp``, ``nng+tcp``, ``nng+tls+tcp``); ``env``
        adds to the worker's environment (e.g. ``REGENCY_TLS_CERT`` for ``nng+tls+tcp``).
        """
        self.worker_address = f"{scheme}://{self.ip}:{port}"
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {
            **os.environ,
            **(env or {}),
            "REGENCY_SECRET": secret,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        self.worker = subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-m", "regency", "worker",
             "--listen", self.worker_address],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.worker.stdout is not None
        line = self.worker.stdout.readline()
        if "listening" not in line:
            self.stop_worker()
            raise RuntimeError(f"the worker in {self.name} did not start: {line!r}")
        return self.worker_address

    def stop_worker(self) -> None:
        """Kill the worker (its zygote removes its job directory) and wait for it."""
        if self.worker is None:
            return
        if self.worker.poll() is None:
            self.worker.kill()
        self.worker.wait()
        if self.worker.stdout is not None:
            self.worker.stdout.close()

    def cut(self) -> None:
        """Take this host's link down (packets are lost; connections are not reset)."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")


@contextmanager
def virtual_hosts(count: int, subnet: str | None = None) -> Iterator[list[VirtualHost]]:
    """Make ``count`` virtual hosts (``{subnet}.11``, ``.12``, ...); this namespace is ``.1``.

    The default subnet is drawn from this process's pid (``10.A.B`` with A in 100-199), so
    test runs that overlap on one machine (parallel sessions, CI beside a developer) do not
    give two bridges the same address.
    """
    why = virtual_hosts_available()
    if why is not None:
        raise RuntimeError(why)
    global _calls
    _calls += 1
    # Names and the default subnet differ per call too: a namespace's links vanish
    # asynchronously after it is deleted, and the root namespace's neighbour cache still maps
    # the old addresses to the old links for a while, so reusing either in one process breaks
    # the next set of hosts.
    if subnet is None:
        pid = os.getpid()
        subnet = f"10.{100 + pid % 100}.{(pid // 100 + 37 * _calls) % 250}"
    tag = f"{os.getpid() % 100000}{_calls % 10}"
    bridge = f"rgb{tag}"
    hosts: list[VirtualHost] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i in range(count):
            host = VirtualHost(f"rgh{tag}-{i}", f"{subnet}.{11 + i}", f"rgv{tag}{i}")
            peer = f"rgp{tag}{i}"
            _ip("netns", "add", host.name)
            hosts.append(host)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.name)
            _ip("link", "set", host.veth, "master", bridge)
            _ip("link", "set", host.veth, "up")
            _ip("-n", host.name, "addr", "add", f"{host.ip}/24", "dev", peer)
            _ip("-n", host.name, "link", "set", peer, "up")
            _ip("-n", host.name, "link", "set", "lo", "up")
        time.sleep(0.05)  # let the bridge ports reach forwarding state
        yield hosts
    finally:
        for host in hosts:
            host.stop_worker()
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
