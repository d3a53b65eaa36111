"""Worker addresses in Monarch's forms, for workers and for the controllers that attach.

* ``SCHEME://HOST:PORT`` with SCHEME one of :data:`~._hostlinks.HOST_SCHEMES`: bind there and
  be dialled there.
* ``ipc:///PATH`` (or ``unix:///PATH``): a unix socket, on this machine only. Regency's
  ``unix://`` sockets, authenticated by the job secret like every link; the directory must be
  private to the user (mode 0700, as ``tempfile.mkdtemp`` makes it). The procs of such a
  worker are on the controller's machine and listen on 127.0.0.1.
* ``DIAL@BIND`` (an alias, e.g. ``tcp://10.0.0.5:2222@tcp://0.0.0.0:2222``): the worker
  binds BIND and controllers dial DIAL, which is also the worker's name in errors.
* ``tcp://HOST:fdN`` (workers only): serve on the TCP socket inherited as descriptor N
  (bound by whoever started the worker, e.g. with ``pass_fds``); controllers dial
  ``tcp://HOST:PORT`` with that socket's port.

Pure functions; no sockets are opened here.
"""

from __future__ import annotations

import re

import attrs

from ._hostlinks import HOST_SCHEMES, host_address, parse_host_address

#: Schemes of unix-socket worker addresses (Monarch's ``ipc://`` is a unix socket).
UNIX_SCHEMES = ("ipc", "unix")
_FD = re.compile(r"^(?P<scheme>[a-z+]+)://(?P<host>\[[^\]]*\]|[^:/@]*):fd(?P<fd>\d+)$")


def _shape(what: str) -> str:
    return (
        f"{what} must look like SCHEME://HOST:PORT with SCHEME one of {HOST_SCHEMES}, "
        "ipc:///PATH (a unix socket), DIAL@BIND (an address to dial @ an address to bind) "
        "or, for a worker, tcp://HOST:fdN (a socket inherited as descriptor N)"
    )


@attrs.frozen
class WorkerAddress:
    """A parsed worker address."""

    #: What the worker listens on: ``SCHEME://HOST:PORT`` or ``unix:///PATH``.
    bind: str
    #: What controllers dial, and the worker's name: ``SCHEME://HOST:PORT`` or ``unix:///PATH``.
    dial: str
    #: The host the worker's procs listen on (an IP or name that resolves to one).
    proc_host: str
    #: The inherited listening socket's descriptor, for ``tcp://HOST:fdN``.
    fd: int | None = None

    @property
    def is_unix(self) -> bool:
        return self.dial.startswith("unix://")


def _one(address: str, what: str, *, fd_allowed: bool) -> WorkerAddress:
    scheme, sep, rest = address.partition("://")
    if sep and scheme in UNIX_SCHEMES:
        # ipc:///tmp/x and ipc:/tmp/x (Monarch prints unix:/tmp/x) alike.
        path = rest if rest.startswith("/") else ""
        if not path or "@" in path or path.endswith("/"):
            raise ValueError(
                f"{what}: a unix-socket address must be ipc:///ABSOLUTE/PATH (got {address!r})"
            )
        return WorkerAddress(f"unix://{path}", f"unix://{path}", "127.0.0.1")
    if address.startswith(("ipc:/", "unix:/")):
        path = address.split(":", 1)[1]
        return _one(f"{address.split(':', 1)[0]}://{path}", what, fd_allowed=fd_allowed)
    match = _FD.match(address)
    if match is not None:
        if not fd_allowed:
            raise ValueError(
                f"{what}: {address!r} names a worker's inherited socket (tcp://HOST:fdN); a "
                "controller dials the worker at tcp://HOST:PORT, with that socket's port"
            )
        if match["scheme"] != "tcp":
            raise ValueError(
                f"{what}: an inherited socket (HOST:fdN) is served on tcp:// only (got {address!r})"
            )
        host = match["host"].strip("[]")
        if not host:
            raise ValueError(f"{what}: tcp://HOST:fdN needs a HOST (got {address!r})")
        # The port (and so the dial address) comes from the socket itself: see with_port.
        return WorkerAddress(address, address, host, fd=int(match["fd"]))
    try:
        _, host, _ = parse_host_address(address, what)
    except ValueError:
        raise ValueError(f"{_shape(what)} (got {address!r})") from None
    return WorkerAddress(address, address, host)


def parse_worker_address(address: object, what: str, *, worker: bool) -> WorkerAddress:
    """Parse a worker address; ``worker`` is True on the worker's side (``fdN`` allowed) and
    False in a controller. ``what`` names the address in errors."""
    if not isinstance(address, str):
        raise TypeError(
            f"{what} must be a str like 'tcp://HOST:PORT' or 'ipc:///PATH' "
            f"(got {type(address).__name__})"
        )
    head, sep, tail = address.partition("@")
    if sep and "://" in head and "://" in tail:
        dial = _one(head, f"{what} (the address to dial, before '@')", fd_allowed=False)
        bind = _one(tail, f"{what} (the address to bind, after '@')", fd_allowed=worker)
        if dial.is_unix != bind.is_unix:
            raise ValueError(
                f"{what}: both sides of DIAL@BIND must be TCP addresses, or both unix sockets "
                f"(got {address!r})"
            )
        if not dial.is_unix and dial.dial.split("://")[0] != bind.bind.split("://")[0]:
            raise ValueError(
                f"{what}: both sides of DIAL@BIND must use one scheme (got {address!r})"
            )
        return WorkerAddress(bind.bind, dial.dial, dial.proc_host, bind.fd)
    return _one(address, what, fd_allowed=worker)


def with_port(address: WorkerAddress, port: int) -> WorkerAddress:
    """An inherited-socket address with the socket's port filled in."""
    dial = address.dial
    if address.fd is not None and ":fd" in dial:
        match = _FD.match(dial)
        assert match is not None
        dial = host_address("tcp", match["host"].strip("[]"), port)
    return attrs.evolve(address, dial=dial)


def dial_address(address: object, what: str) -> str:
    """What a controller dials for ``address`` (a worker address in any form but ``fdN``)."""
    return parse_worker_address(address, what, worker=False).dial
