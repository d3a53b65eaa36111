"""``regency debug``: a terminal for the controller's debug server (netcat is often
missing). Lines typed go to the server; what it sends is printed as it arrives."""

from __future__ import annotations

import os
import selectors
import socket
import sys
from typing import BinaryIO


def run_client(
    host: str,
    port: int,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    token: str | None = None,
) -> int:
    """Connect, present the token and relay until either side closes. Returns an exit
    status."""
    from ._controller import token_path

    source = stdin if stdin is not None else sys.stdin.buffer
    sink = stdout if stdout is not None else sys.stdout.buffer
    if token is None:
        try:
            with open(token_path(port)) as f:
                token = f.read().strip()
        except OSError as exc:
            print(
                f"regency debug: no token for port {port} ({exc}); the server writes it when "
                "it starts (the first breakpoint); pass --token if it ran as another user's "
                "job on this machine",
                file=sys.stderr,
            )
            return 2
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError as exc:
        print(
            f"regency debug: cannot connect to the debug server at {host}:{port}: {exc}\n"
            "(it starts with the first breakpoint; REGENCY_DEBUG_SERVER_HOST/_PORT move it)",
            file=sys.stderr,
        )
        return 2
    sock.settimeout(None)
    sock.sendall(token.encode() + b"\n")
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "server")
    try:
        selector.register(source.fileno(), selectors.EVENT_READ, "user")
    except (OSError, ValueError):
        pass  # not selectable: the server side alone drives the session
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "server":
                    data = sock.recv(65536)
                    if not data:
                        return 0
                    sink.write(data)
                    sink.flush()
                else:
                    line = os.read(source.fileno(), 65536)
                    if not line:  # end of input: leave the sessions in place
                        selector.unregister(source.fileno())
                        sock.shutdown(socket.SHUT_WR)
                        continue
                    sock.sendall(line)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"regency debug: connection lost: {exc}", file=sys.stderr)
        return 1
    finally:
        selector.close()
        sock.close()
