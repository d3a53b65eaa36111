"""The live dashboard: a page served from the controller that shows the job while it runs
(docs/observability.md, "Dashboard").

``regency.serve_dashboard(port=0)`` from the program or a notebook, or ``regency dashboard``
from a shell beside a running controller (through its admin endpoint), start it once per
controller and return its URL, with the token every request must carry.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core._runtime import Runtime
    from ._server import Dashboard

_lock = threading.Lock()
_current: Dashboard | None = None


def serve_dashboard(port: int = 0, *, host: str = "127.0.0.1") -> str:
    """Serve the live dashboard of this controller's job on ``host:port`` (default: a free
    loopback port) and return its URL, ``http://127.0.0.1:PORT/?token=...``. Returns at once;
    the server runs in a daemon thread. Called again, it returns the running dashboard's URL.

    Every request must carry the token (the URL has it; the page then sets a cookie). Nothing
    reads the job until the page polls. Needs ``starlette`` and ``uvicorn``."""
    from ..core._controller import current_runtime

    return serve(current_runtime(), port, host)


def serve(rt: Runtime, port: int = 0, host: str = "127.0.0.1") -> str:
    """:func:`serve_dashboard` for a given runtime (the admin endpoint's ``dashboard``)."""
    global _current
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"serve_dashboard(): port must be an int in 0..65535 (got {port!r})")
    if not isinstance(host, str) or not host:
        raise TypeError(f"serve_dashboard(): host must be an address (got {host!r})")
    with _lock:
        running = _current
        if running is not None and running.rt is rt and running.alive:
            return running.url
        if rt.env.simulated_host is not None:
            raise RuntimeError(
                "serve_dashboard() watches real runs; a simulated run's procs live in virtual "
                "time (use regency.stacks() and regency.trace() there)"
            )
        if rt.parent_address is not None:
            raise RuntimeError("serve_dashboard() runs on the controller, not inside a proc")
        try:
            from ._server import Dashboard
        except ImportError as exc:
            raise ImportError(
                f"the dashboard needs starlette and uvicorn (pip install regency): {exc}"
            ) from None
        dashboard = Dashboard(rt, host, port)
        dashboard.start()
        if running is not None:
            running.stop(timeout=0)
        _current = dashboard
        return dashboard.url


def current() -> Dashboard | None:
    """The dashboard serving now, if any."""
    with _lock:
        return _current if _current is not None and _current.alive else None


def stop() -> None:
    """Stop the dashboard, if one serves (tests; the controller's exit stops it anyway)."""
    global _current
    with _lock:
        running, _current = _current, None
    if running is not None:
        running.stop()
