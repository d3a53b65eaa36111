"""Monarch's way to start a worker: ``run_worker_loop_forever(address=..., ca=...)``.

The same worker as ``regency worker`` (:mod:`regency.core._worker`), with Monarch's keyword
signature, the job secret from ``REGENCY_SECRET``, and one difference in lifetime: the worker
exits when its controller calls ``HostMesh.shutdown()`` (a ``regency worker`` daemon serves
on). A controller that merely exits or dies ends its procs (detach or lease) and the worker
waits for the next controller, as Monarch's does.
"""

from __future__ import annotations

import os

from ._controller import derive_secret
from ._hosts import check_tls_arguments, missing_secret_message
from ._worker import serve_worker

_WILDCARDS = ("*", "0.0.0.0", "::", "")


def run_worker_loop_forever(*, address: str, ca: str, private_key: object = None) -> None:
    """Serve this host to one controller at a time at ``address`` until the controller shuts
    the host mesh down, or SIGTERM/SIGINT. ``address`` is ``tcp://HOST:PORT``, ``ipc:///PATH``
    (a unix socket), ``DIAL@BIND`` or ``tcp://HOST:fdN`` (:mod:`._worker_address`).

    ``HOST`` is the name or IP the controller dials (a name that resolves only to 127.0.0.1
    works when the controller runs on this host). The job secret comes from
    ``REGENCY_SECRET``; it is removed from this process's environment so the procs (and
    whatever they run) do not inherit it: they get it on their stdin.
    """
    check_tls_arguments(ca, private_key, "run_worker_loop_forever")
    from ._worker_address import parse_worker_address

    where = parse_worker_address(address, "run_worker_loop_forever: address", worker=True)
    if not where.is_unix and where.proc_host in _WILDCARDS:
        raise ValueError(
            "run_worker_loop_forever: address must name this host as the controller reaches "
            "it (a hostname or IP), not a wildcard; to listen on every interface give "
            f"DIAL@BIND, e.g. 'tcp://myhost:2222@tcp://0.0.0.0:2222' (got {address!r})"
        )
    from ._hosts import secret_text

    # REGENCY_SECRET, else this user's secret file (made if missing); the variable is taken out
    # of this process's environment so the procs (and what they run) do not see it.
    text = secret_text(create=True)
    os.environ.pop("REGENCY_SECRET", None)
    if not text.strip():
        raise RuntimeError(missing_secret_message("run_worker_loop_forever"))
    serve_worker(address, derive_secret(text), exit_on_shutdown=True)
