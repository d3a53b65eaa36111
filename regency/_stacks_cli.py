"""``regency stacks``: the stacks of a running controller's job, from a shell beside it
(found through ``~/.regency/controller-<pid>.json``; see :mod:`regency._admin`)."""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import sys
from typing import Any


def add_command(commands: Any) -> None:
    stacks = commands.add_parser(
        "stacks",
        help="print the stacks of every proc of a running controller (docs/observability.md)",
    )
    stacks.add_argument("--pid", type=int, help="the controller's pid (needed when several run)")
    stacks.add_argument(
        "--timeout", type=float, default=10.0, help="seconds each proc has to answer (10)"
    )
    stacks.add_argument("--json", action="store_true", help="print the records as JSON")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def controllers() -> list[dict[str, Any]]:
    """The records of the controllers of this user that are running."""
    from ._admin import directory

    found = []
    for path in sorted(glob.glob(os.path.join(directory(), "controller-*.json"))):
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        if _alive(int(record.get("pid", 0))):
            found.append(record)
        else:  # a controller that was killed: its record is stale
            try:
                os.unlink(path)
            except OSError:
                pass
    return found


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        print(f"regency stacks: --timeout must be positive (got {args.timeout})", file=sys.stderr)
        return 2
    running = controllers()
    if args.pid is not None:
        running = [r for r in running if r.get("pid") == args.pid]
        if not running:
            print(
                f"regency stacks: no running controller with pid {args.pid} "
                f"(none wrote ~/.regency/controller-{args.pid}.json)",
                file=sys.stderr,
            )
            return 2
    if not running:
        print(
            "regency stacks: no running controller found (a controller writes "
            "~/.regency/controller-<pid>.json once it starts its runtime)",
            file=sys.stderr,
        )
        return 2
    if len(running) > 1:
        listing = "\n".join(f"  --pid {r['pid']}: {' '.join(r.get('argv', []))}" for r in running)
        print(f"regency stacks: {len(running)} controllers run; pick one:\n{listing}", file=sys.stderr)
        return 2
    record = running[0]
    try:
        with socket.create_connection((record["host"], record["port"]), timeout=args.timeout + 30) as sock:
            request = {"command": "stacks", "timeout": args.timeout}
            sock.sendall(f"{record['token']}\n{json.dumps(request)}\n".encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        print(f"regency stacks: cannot reach the controller (pid {record['pid']}): {exc}", file=sys.stderr)
        return 1
    try:
        answer = json.loads(data)
    except ValueError:
        print("regency stacks: the controller gave no answer", file=sys.stderr)
        return 1
    if not answer.get("ok"):
        print(f"regency stacks: {answer.get('error')}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer["stacks"], indent=1))
    else:
        print(answer["text"])
    return 0
