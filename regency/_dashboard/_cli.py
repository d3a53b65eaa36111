"""``regency dashboard``: start the live dashboard of a running controller (found as
``regency stacks`` finds it, through ``~/.regency/controller-<pid>.json``) and print its URL."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any


def add_command(commands: Any) -> None:
    dashboard = commands.add_parser(
        "dashboard",
        help="start a running controller's live dashboard and print its URL "
        "(docs/observability.md)",
    )
    dashboard.add_argument(
        "--pid", type=int, help="the controller's pid (needed when several run)"
    )


def run(args: argparse.Namespace) -> int:
    from .._stacks_cli import controllers

    running = controllers()
    if args.pid is not None:
        running = [r for r in running if r.get("pid") == args.pid]
        if not running:
            print(
                f"regency dashboard: no running controller with pid {args.pid} "
                f"(none wrote ~/.regency/controller-{args.pid}.json)",
                file=sys.stderr,
            )
            return 2
    if not running:
        print(
            "regency dashboard: no running controller found (a controller writes "
            "~/.regency/controller-<pid>.json once it starts its runtime)",
            file=sys.stderr,
        )
        return 2
    if len(running) > 1:
        listing = "\n".join(f"  --pid {r['pid']}: {' '.join(r.get('argv', []))}" for r in running)
        print(
            f"regency dashboard: {len(running)} controllers run; pick one:\n{listing}",
            file=sys.stderr,
        )
        return 2
    record = running[0]
    try:
        answer = ask(record, {"command": "dashboard"}, timeout=30.0)
    except OSError as exc:
        print(
            f"regency dashboard: cannot reach the controller (pid {record['pid']}): {exc}",
            file=sys.stderr,
        )
        return 1
    except ValueError:
        print("regency dashboard: the controller gave no answer", file=sys.stderr)
        return 1
    if not answer.get("ok"):
        print(f"regency dashboard: {answer.get('error')}", file=sys.stderr)
        return 1
    print(answer["url"])
    return 0


def ask(record: dict[str, Any], request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request to a controller's admin endpoint, and its answer."""
    with socket.create_connection((record["host"], record["port"]), timeout=timeout) as sock:
        sock.sendall(f"{record['token']}\n{json.dumps(request)}\n".encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError("not an answer")
    return answer
