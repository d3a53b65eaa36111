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


def choose(command: str, pid: int | None) -> dict[str, Any] | None:
    """The record of the running controller a command talks to (``pid`` when several run),
    or None after saying on stderr why there is none (``regency stacks``, ``regency
    dashboard``)."""
    running = controllers()
    if pid is not None:
        running = [r for r in running if r.get("pid") == pid]
        if not running:
            print(
                f"regency {command}: no running controller with pid {pid} "
                f"(none wrote ~/.regency/controller-{pid}.json)",
                file=sys.stderr,
            )
            return None
    if not running:
        print(
            f"regency {command}: no running controller found (a controller writes "
            "~/.regency/controller-<pid>.json once it starts its runtime)",
            file=sys.stderr,
        )
        return None
    if len(running) > 1:
        listing = "\n".join(f"  --pid {r['pid']}: {' '.join(r.get('argv', []))}" for r in running)
        print(f"regency {command}: {len(running)} controllers run; pick one:\n{listing}", file=sys.stderr)
        return None
    return running[0]


def ask(record: dict[str, Any], request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request to a controller's admin endpoint (regency/_admin.py), and its answer.
    Raises OSError when the controller cannot be reached, ValueError when it gave no answer."""
    with socket.create_connection((record["host"], record["port"]), timeout=timeout) as sock:
        sock.sendall(f"{record['token']}\n{json.dumps(request)}\n".encode())
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError("not an answer")
    return answer


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        print(f"regency stacks: --timeout must be positive (got {args.timeout})", file=sys.stderr)
        return 2
    record = choose("stacks", args.pid)
    if record is None:
        return 2
    try:
        answer = ask(record, {"command": "stacks", "timeout": args.timeout}, args.timeout + 30)
    except OSError as exc:
        print(f"regency stacks: cannot reach the controller (pid {record['pid']}): {exc}", file=sys.stderr)
        return 1
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
