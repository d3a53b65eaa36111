"""The controller's admin endpoint: what ``regency stacks`` talks to from a shell beside a
running controller.

A production controller listens on a loopback TCP port of its own (picked by the kernel) and
writes ``~/.regency/controller-<pid>.json`` (mode 0600: only this user can read it) with the
port and a random token; the file goes when the controller's runtime stops. A client's first
line must be the token (the stacks show the program's source lines and arguments' names),
its second a JSON request: ``{"command": "stacks", "timeout": 10.0}``. The answer is one JSON
object: ``{"ok": true, "text": <the dump>, "stacks": <JobStacks as plain data>}`` or
``{"ok": false, "error": ...}``. ``{"command": "dashboard"}`` (``regency dashboard``) starts
the live dashboard unless it runs and answers ``{"ok": true, "url": ...}``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from typing import Any

import attrs
import trio

from .core._introspect import check_timeout, gather, targets_of
from .core._runtime import Runtime
from .core._stacks import JobStacks

log = logging.getLogger("regency.admin")

#: Longest request line accepted.
_MAX_LINE = 4096


def directory() -> str:
    return os.path.join(os.path.expanduser("~"), ".regency")


def record_path(pid: int) -> str:
    return os.path.join(directory(), f"controller-{pid}.json")


def serve_admin(rt: Runtime) -> None:
    """Start the admin endpoint on a production controller's runtime (from any thread)."""
    rt.start_soon(_serve, rt)


async def _serve(rt: Runtime) -> None:
    try:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    except OSError as exc:
        log.warning("the admin endpoint (regency stacks) cannot listen: %s", exc)
        return
    listener = listeners[0]
    port = listener.socket.getsockname()[1]
    token = secrets.token_hex(16)
    path = record_path(os.getpid())
    try:
        os.makedirs(directory(), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(
                {"pid": os.getpid(), "host": "127.0.0.1", "port": port, "token": token,
                 "argv": sys.argv},
                f,
            )
    except OSError as exc:
        log.warning("the admin endpoint (regency stacks) cannot write %s: %s", path, exc)
        await listener.aclose()
        return
    try:
        async with listener, trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                nursery.start_soon(_client, rt, stream, token)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


async def _readline(stream: trio.SocketStream, buffer: bytearray) -> str:
    while b"\n" not in buffer:
        if len(buffer) > _MAX_LINE:
            raise ValueError(f"a request line longer than {_MAX_LINE} bytes")
        data = await stream.receive_some(_MAX_LINE)
        if not data:
            raise EOFError("the client closed the connection")
        buffer += data
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode("utf-8", "replace").strip()


async def _client(rt: Runtime, stream: trio.SocketStream, token: str) -> None:
    async with stream:
        buffer = bytearray()
        try:
            with trio.fail_after(10):
                offered = await _readline(stream, buffer)
                if not secrets.compare_digest(offered.encode(), token.encode()):
                    await _answer(stream, {"ok": False, "error": "wrong or missing token"})
                    return
                request = json.loads(await _readline(stream, buffer))
            answer = await _handle(rt, request)
        except (EOFError, trio.TooSlowError, trio.BrokenResourceError):
            return
        except (ValueError, TypeError) as exc:
            answer = {"ok": False, "error": str(exc)}
        try:
            await _answer(stream, answer)
        except trio.BrokenResourceError:
            pass


async def _answer(stream: trio.SocketStream, answer: dict[str, Any]) -> None:
    await stream.send_all(json.dumps(answer).encode() + b"\n")


async def _handle(rt: Runtime, request: Any) -> dict[str, Any]:
    if isinstance(request, dict) and request.get("command") == "dashboard":
        return await _dashboard(rt)
    if not isinstance(request, dict) or request.get("command") != "stacks":
        raise ValueError(f'expected {{"command": "stacks", "timeout": <seconds>}} (got {request!r})')
    timeout = check_timeout(request.get("timeout", 10.0), "regency stacks")
    targets, children = targets_of(rt, None)
    procs = await gather(rt, targets, timeout, children=children)
    stacks = JobStacks(tuple(procs), timeout)
    return {"ok": True, "text": str(stacks), "stacks": attrs.asdict(stacks)}


async def _dashboard(rt: Runtime) -> dict[str, Any]:
    """``{"command": "dashboard"}``: start the live dashboard unless it runs, answer its URL
    (``regency dashboard``; see regency/_dashboard)."""
    from . import _dashboard

    def start() -> str:
        return _dashboard.serve(rt)

    try:
        url = await trio.to_thread.run_sync(start)  # imports the web stack: off the loop
    except (ImportError, OSError, RuntimeError) as exc:
        return {"ok": False, "error": f"could not start the dashboard: {exc}"}
    return {"ok": True, "url": url}
