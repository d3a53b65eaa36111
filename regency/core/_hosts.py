"""The controller's side of multi-host jobs: ``attach_to_workers`` and procs on other hosts.

See :mod:`regency.core._worker` for the worker daemon and the protocol.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import attrs
import trio

from . import _controller, _current
from . import _messages as M
from ._children import Child
from ._controller import current_runtime, derive_secret
from ._errors import RemoteFailure, SupervisionError
from ._future import Future
from ._hostlinks import host_address, parse_host_address, remote_scheme
from ._launcher import ProcHandle, ProcLauncher
from ._ports import PortBase
from ._proc_bind import RECORD_KEY
from ._runtime import Runtime

log = logging.getLogger("regency.hosts")


class HostRef(NamedTuple):
    """One host of a host mesh: its worker's address, name and IP."""

    worker: str
    hostname: str
    ip: str


@attrs.define(eq=False)
class MeshLife:
    """What one ``HostMesh`` (shared by its slices) started and where it stands: the
    addresses of the procs spawned through it (``stop()`` stops those alone), whether it was
    shut down, and whether it is a reference (unpickled: it cannot be shut down or stopped).
    ``ready`` resolves to True once its hosts are attached; ``error`` is why they are not."""

    ready: Future[bool]
    owned: bool = True
    error: BaseException | None = None
    shut_down: bool = False
    procs: list[str] = attrs.Factory(list)

    @classmethod
    def attached(cls, owned: bool = True) -> MeshLife:
        ready: Future[bool] = Future()
        ready.set_result(True)
        return cls(ready, owned)

    def check_usable(self) -> None:
        """Raise why this mesh cannot be used: shut down, or its attach failed."""
        if self.shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        if self.error is not None:
            raise type(self.error)(str(self.error))


class _Reply(PortBase):
    """A one-shot reply port handler for worker requests."""

    def __init__(self, fut: Future[Any], what: str, worker: str) -> None:
        self.fut, self.what = fut, what
        self.dests = frozenset((worker,))

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if status == M.OK:
            self.fut.set_result(value)
        else:
            failure: RemoteFailure = value
            self.fut.set_exception(ConnectionRefusedError(f"{self.what}: {failure.message}"))
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(ConnectionError(f"{self.what}: {exc}"))


class _Hosts:
    """Per-runtime state of attached workers."""

    def __init__(self, rt: Runtime, lease: float) -> None:
        self.rt = rt
        self.lease = lease
        self.workers: dict[str, HostRef] = {}
        self.ports: dict[str, deque[int]] = {}
        #: The transport of links to and between procs on other hosts (see _hostlinks).
        self.scheme = "tcp"
        #: Our multi-host listeners by (scheme, interface address): their addresses.
        self.listening: dict[tuple[str, str], str] = {}
        self.launchers: dict[str, WorkerLauncher] = {}
        #: Every worker this runtime attached to, attached now or not: ours to attach again.
        self.known: dict[str, HostRef] = {}
        #: Workers that dropped us (our lease ran out there), with their word for why.
        self.lapsed: dict[str, str] = {}
        rt.extensions[M.Exited] = self._exited
        rt.extensions[M.Refused] = self._refused
        rt.extensions[M.Lapsed] = self._lapsed

    def _exited(self, msg: M.Exited) -> None:
        child = self.rt.children.get(msg.address)
        if child is not None and msg.tail and child.returncode is None:
            child.output_tail = msg.tail  # its exit's description ends with them
        for launcher in self.launchers.values():
            if launcher.exited(msg.address, msg.code):
                return

    def _refused(self, msg: M.Refused) -> None:
        """A worker did not launch one of our procs: fail it now, saying why, instead of
        letting it time out as "did not start"."""
        child = self.rt.children.get(msg.address)
        if child is not None and child.returncode is None:
            child.killed_for = f"was refused by its worker: {msg.reason}"
            log.error("proc %s %s", child.proc_id, child.killed_for)
        self._exited(M.Exited(msg.address, 1))

    def _lapsed(self, msg: M.Lapsed) -> None:
        if msg.worker in self.workers and msg.worker not in self.lapsed:
            log.error("%s", msg.reason)
            self.lapsed[msg.worker] = msg.reason

    async def renew_leases(self) -> None:
        while True:
            await trio.sleep(self.lease / 4)
            for worker in list(self.workers):
                try:
                    self.rt.post(worker, M.Lease(self.rt.address))
                except Exception:
                    pass  # its procs are lost through heartbeats or links

    def request(
        self, worker: str, message: Callable[[M.PortRef], M.Wire], what: str, timeout: float
    ) -> Any:
        """Send ``message(reply port)`` to a worker and wait for the reply (not on the loop)."""
        return self.ask(worker, message, what).get(timeout)

    def ask(self, worker: str, message: Callable[[M.PortRef], M.Wire], what: str) -> Future[Any]:
        """Send ``message(reply port)`` to a worker; the future of its reply."""
        fut: Future[Any] = Future()
        port = self.rt.open_port(_Reply(fut, what, worker))
        self.rt.post(worker, message(port))
        return fut

    def attach(self, workers: Sequence[str], lease: float, what: str) -> list[HostRef]:
        """Attach to ``workers`` at once (each has ``attach_timeout`` to answer) and
        register them; raise the first failure, naming its worker (not on the loop)."""
        import time

        timeout = self.rt.config.attach_timeout
        asked = [
            (
                address,
                self.ask(
                    address,
                    functools.partial(M.Attach, self.rt.address, lease),
                    f"{what}: attach failed: the worker at {address}",
                ),
            )
            for address in workers
        ]
        deadline = time.monotonic() + timeout
        refs, failure = [], None
        for address, fut in asked:
            try:
                hostname, ip, ports = fut.get(max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                failure = failure or ConnectionError(
                    f"{what}: attach failed: config push failed during attach: the worker at "
                    f"{address} did not answer within {timeout:g} s (attach_timeout)"
                )
                continue
            except SupervisionError as exc:
                failure = failure or ConnectionError(
                    f"{what}: attach failed: cannot reach the worker at {address}: {exc}"
                )
                continue
            except ConnectionError as exc:
                failure = failure or exc
                continue
            ref = HostRef(address, hostname, ip)
            self.lapsed.pop(address, None)
            self.workers[address] = self.known[address] = ref
            self.ports[address] = deque(ports)
            refs.append(ref)
        if failure is not None:
            raise failure
        return refs

    def listen_towards(self, first: str) -> None:
        """With no worker attached: make sure our procs on other hosts can reach us, by
        listening on the interface that routes to ``first`` (a worker's address), on the
        job's host transport, and making that our address from now on (shutting the last
        host down made it the local one again). Not on the loop."""
        if self.workers:
            return
        rt = self.rt
        if first.startswith("unix://"):
            # A unix-socket worker is on this machine: its procs listen on 127.0.0.1.
            self.scheme = remote_scheme(rt.config.default_transport, "tcp://127.0.0.1:1")
            where = (self.scheme, "127.0.0.1")
        else:
            self.scheme = remote_scheme(rt.config.default_transport, first)
            _, first_host, first_port = parse_host_address(first, "worker addresses")
            where = (self.scheme, _local_ip_towards(first_host, first_port))
        if where in self.listening:
            trio.from_thread.run_sync(
                setattr, rt, "address", self.listening[where], trio_token=rt.token
            )
        else:
            self.listening[where] = trio.from_thread.run(
                rt.listen_also, host_address(*where, 0), trio_token=rt.token
            )

    def ensure_attached(self, refs: Sequence[HostRef]) -> None:
        """Attach again to those of ``refs`` this runtime detached from (``stop()`` lets a
        worker go once none of our procs is left on it)."""
        missing = [ref.worker for ref in refs if ref.worker not in self.workers]
        if not missing:
            return
        if self.rt.on_runtime_thread():
            raise RuntimeError(
                f"the workers at {', '.join(missing)} were let go (HostMesh.stop()); "
                "spawn on them again from a sync endpoint or the controller"
            )
        missing = list(dict.fromkeys(missing))
        self.listen_towards(missing[0])
        self.attach(missing, self.lease, "spawn_procs")

    def take_ports(self, worker: str, count: int) -> list[int]:
        lapsed = self.lapsed.get(worker)
        if lapsed is not None:
            raise ConnectionError(lapsed)
        pool = self.ports[worker]
        if len(pool) < count:
            if self.rt.on_runtime_thread():
                raise RuntimeError(
                    "spawning many procs on remote hosts from an async endpoint needs ports "
                    "reserved beforehand; spawn them from a sync endpoint or the controller"
                )
            more = self.request(
                worker,
                functools.partial(M.Reserve, self.rt.address, max(count - len(pool), 32)),
                f"reserving ports on {worker}",
                30,
            )
            pool.extend(more)
        return [pool.popleft() for _ in range(count)]


class RemoteProcHandle(ProcHandle):
    remote = True

    def __init__(self, rt: Runtime, worker: str, address: str) -> None:
        self.rt, self.worker, self.address = rt, worker, address
        self.pid = 0

    def kill(self) -> None:
        try:
            self.rt.post(self.worker, M.Kill(self.rt.address, self.address))
        except Exception:
            pass  # the worker is gone, and its procs with it

    def terminate(self) -> None:
        self.kill()


def _local_ip_towards(host: str, port: int) -> str:
    """The address of this machine's interface that routes to ``host``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        ip: str = probe.getsockname()[0]
        return ip


#: The only ``ca`` Regency takes: links are authenticated by the job secret, not certificates.
TRUST_ALL = "trust_all_connections"


def check_tls_arguments(ca: object, private_key: object, where: str) -> None:
    """Monarch's ``ca``/``private_key``: only ``ca="trust_all_connections"`` with no key."""
    if ca != TRUST_ALL:
        raise ValueError(
            f"{where}: ca must be {TRUST_ALL!r} (Regency authenticates every link with the "
            f"job secret, see docs/multihost.md; TLS certificates are not supported) (got {ca!r})"
        )
    if private_key is not None:
        raise ValueError(
            f"{where}: private_key must be None (links are authenticated by the job secret, "
            f"not by TLS keys) (got {type(private_key).__name__})"
        )


def missing_secret_message(where: str) -> str:
    return (
        f"{where} needs the job secret shared by the workers and the controller: set "
        "REGENCY_SECRET (at least 16 characters, e.g. the output of "
        "`python -c 'import secrets; print(secrets.token_hex(24))'`) in the environment of "
        "every worker and of the controller (workers and a controller of one user on one "
        f"machine share {user_secret_path()} without it)"
    )


def user_secret_path() -> str:
    """The per-user secret file, ``~/.regency/secret``."""
    return os.path.join(os.path.expanduser("~"), ".regency", "secret")


def user_secret(create: bool = True) -> str | None:
    """The per-user job secret: the text of ``~/.regency/secret``, which the workers and the
    controllers one user starts on one machine share, so that they need no ``REGENCY_SECRET``.
    Whoever needs it first creates it (a random secret, mode 0600, in a directory of mode
    0700); None when it does not exist and ``create`` is false. Refused (``PermissionError``,
    naming the file and its mode) when group or others may read or write it, or another user
    owns it."""
    import secrets
    import stat
    import tempfile

    path = user_secret_path()
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            if not create:
                return None
        else:
            with os.fdopen(fd) as f:
                info = os.fstat(f.fileno())
                if info.st_mode & 0o077 or info.st_uid != os.getuid():
                    raise PermissionError(
                        f"the per-user job secret {path} has mode "
                        f"{stat.S_IMODE(info.st_mode):04o}"
                        + (f" and belongs to uid {info.st_uid}" if info.st_uid != os.getuid() else "")
                        + ": group and others must not be able to read or write it; "
                        f"run `chmod 600 {path}` (and set a new secret: it may have leaked), "
                        "or set REGENCY_SECRET"
                    )
                text = f.read()
            if len(text.strip()) < 16:
                raise ValueError(
                    f"the per-user job secret {path} must hold at least 16 characters "
                    f"(it holds {len(text.strip())}); delete it to have a new one made"
                )
            return text
        # Written in full under another name, then linked into place: whoever links first
        # wins, and nobody reads a half-written secret.
        directory = os.path.dirname(path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".secret-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass  # someone else made it first: read theirs
        finally:
            os.unlink(temporary)
    raise RuntimeError(f"could not create the per-user job secret {path}")


def secret_text(create: bool = True) -> str:
    """The job secret's passphrase for workers and attaching controllers: ``REGENCY_SECRET``
    when set, else the per-user secret file (:func:`user_secret`, made when ``create``)."""
    text = os.environ.get("REGENCY_SECRET", "")
    if text.strip():
        return text
    return user_secret(create) or ""


def job_passphrase() -> str | None:
    """The passphrase of the job secret this controller's runtime runs with, for the workers
    of a job applied now (``SlurmJob``, ``ProcessJob``): one controller, several jobs, all on
    its one secret, so that every proc of every job can reach every other. None when Regency
    has not started in this process (the job draws its own secret, which this process then
    adopts) or its secret came as bytes (``attach_to_workers(secret=b"...")``)."""
    rt = _current.current_runtime_or_none()
    if rt is None:
        return None
    return _controller.known_passphrases.get(rt.secret)


def new_job_passphrase() -> str:
    """The passphrase for the workers of a job applied now: this controller's own
    (:func:`job_passphrase`), else ``REGENCY_SECRET`` when set (it wins: the controller will
    run with it), else a fresh one, which this process adopts when it attaches."""
    import secrets

    return job_passphrase() or os.environ.get("REGENCY_SECRET", "").strip() or secrets.token_hex(24)


def attach_to_workers(
    workers: Sequence[str] | None = None,
    secret: str | bytes | None = None,
    *,
    lease: float | None = None,
    ca: str | None = None,
    private_key: object = None,
    name: str | None = None,
) -> Any:
    """Attach to running workers (``regency worker`` or ``run_worker_loop_forever``); return a
    ``HostMesh`` with dim ``hosts``.

    Two forms: Regency's ``attach_to_workers(workers, secret=None, lease=None)`` and Monarch's
    ``attach_to_workers(workers=..., ca="trust_all_connections", private_key=None, name=None)``.
    Worker addresses are ``tcp://``, ``nng+tcp://`` or ``nng+tls+tcp://`` ``HOST:PORT``, a
    unix socket ``ipc:///PATH`` (a worker on this machine) or an alias ``DIAL@BIND`` (the
    worker is dialled, and named, at DIAL; see :mod:`._worker_address`). Links
    to and between procs on other hosts use ``configure(default_transport=...)`` when that is
    one of these three, else the scheme of the first worker's address.
    ``secret`` (else ``REGENCY_SECRET``) must be the workers' job secret; it becomes this
    process's job secret, so call this before anything else starts Regency here. ``lease``:
    seconds a worker keeps our procs alive without hearing from us (default: the
    ``worker_lease`` setting, Monarch's ``mesh_orphan_timeout``). The workers are asked at
    once, and each has the ``attach_timeout`` setting (Monarch's
    ``mesh_attach_config_timeout``) to answer; the call returns when all have answered or
    that time is up. As in Monarch, a failed attach does not raise here: the mesh's
    ``initialized`` and its first use raise it (``ConnectionError``, "attach failed",
    naming the worker). ``name`` names the mesh in errors.
    """
    from ._proc_mesh import HostMesh
    from ._shape import Shape

    what = "attach_to_workers" if name is None else f"attach_to_workers(name={name!r})"
    if ca is not None or private_key is not None:
        check_tls_arguments(ca, private_key, what)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{what}: name must be a str (got {type(name).__name__})")
    if isinstance(workers, str):
        raise TypeError(f"{what}: workers must be a list of addresses, not one string ({workers!r})")
    if not workers:
        raise ValueError(f"{what} needs at least one worker address")
    from ._worker_address import dial_address

    # A worker is known by the address a controller dials (an alias's DIAL; a unix socket's
    # unix:///PATH for Monarch's ipc:///PATH).
    workers = [dial_address(address, "worker addresses") for address in workers]
    key: bytes | None
    if isinstance(secret, bytes):
        key = secret
    elif isinstance(secret, str):
        key = derive_secret(secret)
    else:
        key = None
    if key is not None:
        if _current.current_runtime_or_none() is None:
            _controller.secret_override = key
            if isinstance(secret, str):
                _controller.known_passphrases[key] = secret
        elif current_runtime().secret != key:
            raise RuntimeError(
                f"{what}: these workers' secret (secret=...) is not the one this process "
                "started Regency with; a job applied after Regency started gets this "
                "process's secret (job_passphrase()), so attach before anything else starts "
                "Regency here, or set REGENCY_SECRET before starting"
            )
    elif _controller.secret_override is None and not os.environ.get("REGENCY_SECRET", "").strip():
        # Workers this user started on this machine share the per-user secret file.
        text = secret_text()
        key = derive_secret(text)
        if _current.current_runtime_or_none() is None:
            _controller.secret_override = key
            _controller.known_passphrases[key] = text
        elif current_runtime().secret != key:
            raise RuntimeError(
                f"{what}: Regency started in this process before the per-user job secret "
                f"{user_secret_path()} existed, so its procs use another secret; call "
                "attach_to_workers before anything else starts Regency here, or set "
                "REGENCY_SECRET (or pass secret=...) for the workers and this process"
            )
    rt = current_runtime()
    if lease is None:
        lease = rt.config.worker_lease
    hosts = rt.hosts
    if hosts is None:
        hosts = rt.hosts = _Hosts(rt, lease)
        rt.start_soon(hosts.renew_leases)
    # Renewals come often enough for the shortest lease of any attachment.
    hosts.lease = min(hosts.lease, lease)
    hosts.listen_towards(workers[0])
    life = MeshLife(Future())
    try:
        refs = hosts.attach(workers, lease, what)
    except ConnectionError as exc:
        # As Monarch's: the mesh comes back, and its ``initialized`` and first use fail.
        life.error = exc
        life.ready.set_exception(type(exc)(str(exc)))
        refs = [hosts.workers.get(a) or HostRef(a, "", "") for a in workers]
    else:
        life.ready.set_result(True)
    return HostMesh(Shape.full(["hosts"], [len(refs)]), tuple(refs), None, life)


class WorkerLauncher(ProcLauncher):
    """Starts procs on a remote host through its worker daemon: the runtime launches them
    there like local ones. Addresses come from ports the worker reserved for us; exits come
    back as EXITED reports."""

    worker: str

    def __init__(self, hosts: _Hosts, host: HostRef) -> None:
        self._hosts, self.host = hosts, host
        self.worker = host.worker
        #: Exit callbacks of the procs started here, by address.
        self._on_exit: dict[str, Callable[[int], None]] = {}
        #: ``spawn_procs(proc_bind=...)``: the binding of procs planned and not launched yet,
        #: by address; it travels in the LAUNCH record and the worker wraps the command.
        self.binds: dict[str, dict[str, str]] = {}

    def address_for(self, proc_id: str) -> str:
        """A reserved port on the host (may ask the worker for more: not on the loop)."""
        (port,) = self._hosts.take_ports(self.worker, 1)
        return host_address(self._hosts.scheme, self.host.ip, port)

    def launch(
        self,
        bootstrap: Mapping[str, Any],
        env: Mapping[str, str],
        on_exit: Callable[[int], None],
    ) -> ProcHandle:
        rt = self._hosts.rt
        address = bootstrap["address"]
        record = dict(bootstrap)
        bind = self.binds.pop(address, None)
        if bind is not None:
            record[RECORD_KEY] = bind
        rt.post(self.worker, M.Launch(rt.address, [(record, dict(env))]))
        self._on_exit[address] = on_exit
        return RemoteProcHandle(rt, self.worker, address)

    def exited(self, address: str, code: int) -> bool:
        """The worker reported an exit; False when the proc is not one of ours."""
        on_exit = self._on_exit.pop(address, None)
        if on_exit is None:
            return False
        on_exit(code)
        return True


def _worker_of(child: Child | None) -> str | None:
    """The worker that runs ``child`` (None: a proc of this host, or no such child)."""
    return child.launcher.worker if child is not None and child.launcher is not None else None


def worker_launcher(rt: Runtime, host: HostRef) -> WorkerLauncher:
    """The launcher for a host of ``attach_to_workers``."""
    state = rt.hosts
    if state is None or host.worker not in state.known:
        raise LookupError(
            f"the host at {host.worker} is not attached to this process; attach_to_workers "
            "first (a host mesh from another process cannot start procs here)"
        )
    launcher = state.launchers.get(host.worker)
    if launcher is None:
        launcher = state.launchers[host.worker] = WorkerLauncher(state, host)
    return launcher


def shutdown_hosts(
    rt: Runtime, refs: Sequence[HostRef], *, keep_workers: bool = False
) -> Future[None]:
    """Stop our procs on these hosts and detach from their workers (which exit, if they are
    ``run_worker_loop_forever`` ones, unless ``keep_workers``: ``HostMesh.stop()``); once no
    worker is left, this runtime's address is its local one again."""
    from ._children import _stop_procs

    done: Future[None] = Future()
    state = rt.hosts
    if state is None:
        done.set_result(None)
        return done
    workers = {ref.worker for ref in refs}

    async def shutdown() -> None:
        addresses = [
            a
            for a, c in rt.children.items()
            if _worker_of(c) in workers
        ]
        stopped: Future[None] = Future()
        await _stop_procs(rt, addresses, stopped)
        for worker in workers:
            if state.workers.pop(worker, None) is not None:
                try:
                    # shutdown=True: a run_worker_loop_forever worker exits.
                    rt.post(worker, M.Detach(rt.address, shutdown=not keep_workers))
                except Exception:
                    pass
                state.ports.pop(worker, None)
        if not state.workers:
            rt.address = rt.local_address
        done.set_result(None)

    rt.start_soon(shutdown)
    return done


def stop_mesh_procs(rt: Runtime, life: MeshLife) -> Future[None]:
    """``HostMesh.stop()``: stop the procs that this mesh (or a slice of it) started, and
    nobody else's; then let go of each of its workers on which none of our procs is left (a
    ``run_worker_loop_forever`` worker serves on, for this controller or another). A later
    spawn on a mesh of those hosts attaches to them again."""
    from ._children import _stop_procs

    done: Future[None] = Future()
    state = rt.hosts
    addresses = list(dict.fromkeys(life.procs))
    life.procs.clear()

    async def stop() -> None:
        workers = {w for a in addresses if (w := _worker_of(rt.children.get(a))) is not None}
        stopped: Future[None] = Future()
        await _stop_procs(rt, addresses, stopped)
        if state is not None:
            busy = {_worker_of(c) for c in rt.children.values() if c.returncode is None}
            for worker in workers - busy:
                if state.workers.pop(worker, None) is not None:
                    state.ports.pop(worker, None)
                    try:
                        rt.post(worker, M.Detach(rt.address, shutdown=False))
                    except Exception:
                        pass
        done.set_result(None)

    rt.start_soon(stop)
    return done


def detach_all(rt: Runtime) -> None:
    """On a clean exit: tell every worker we are done (they kill what is left of ours)."""
    hosts = rt.hosts
    if hosts is None:
        return
    for worker in hosts.workers:
        try:
            rt.post(worker, M.Detach(rt.address))
        except Exception:
            pass
