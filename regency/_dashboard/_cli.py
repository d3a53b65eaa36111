"""``regency dashboard``: start the live dashboard of a running controller (found as
``regency stacks`` finds it, through ``~/.regency/controller-<pid>.json``) and print its URL."""

from __future__ import annotations

import argparse
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
    from .._stacks_cli import ask, choose

    record = choose("dashboard", args.pid)
    if record is None:
        return 2
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
