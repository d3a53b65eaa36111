"""``regency`` command line: ``regency worker --listen tcp://HOST:PORT`` (``--listen`` also
takes ``nng+tcp://`` and ``nng+tls+tcp://``), ``regency debug``, ``regency sim explore``
(:mod:`regency.sim._explore`); the job commands (``apply``, ``exec``, ``kill``,
``kubernetes``) live in :mod:`regency.job._cli`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="regency")
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser(
        "worker", help="serve one host of a multi-host job (see docs/multihost.md)"
    )
    worker.add_argument(
        "--listen",
        required=True,
        help="tcp://HOST:PORT (or nng+tcp://, nng+tls+tcp://) to listen on",
    )
    worker.add_argument(
        "--secret-file", help="file holding the job secret (default: $REGENCY_SECRET)"
    )
    _add_debug_command(commands)
    _add_sim_command(commands)
    from . import _stacks_cli

    _stacks_cli.add_command(commands)
    from ._dashboard import _cli as _dashboard_cli

    _dashboard_cli.add_command(commands)
    from .job._cli import CommandError, add_commands

    add_commands(commands)
    args = parser.parse_args(argv)
    if args.command == "debug":
        return _debug(args)
    if args.command == "stacks":
        return _stacks_cli.run(args)
    if args.command == "dashboard":
        return _dashboard_cli.run(args)
    if args.command != "worker":
        try:
            code: int = args.run(args)
        except (CommandError, ValueError, RuntimeError, OSError) as exc:
            print(f"regency {args.command}: {exc}", file=sys.stderr)
            return 2
        return code
    logging.basicConfig(
        level=os.environ.get("REGENCY_LOG_LEVEL", "INFO"),
        format="[worker] %(levelname)s %(name)s: %(message)s",
    )
    from .core._controller import derive_secret
    from .core._worker import serve_worker

    if args.secret_file:
        with open(args.secret_file) as f:
            text = f.read()
    else:
        from .core._hosts import secret_text

        try:  # REGENCY_SECRET, else this user's secret file (~/.regency/secret, made if missing)
            text = secret_text(create=True)
        except (OSError, ValueError) as exc:
            print(f"regency worker: {exc}", file=sys.stderr)
            return 2
    if not text.strip():
        parser.error(
            "the job secret must come from --secret-file, REGENCY_SECRET or ~/.regency/secret"
        )
    try:
        serve_worker(args.listen, derive_secret(text))
    except (ValueError, OSError) as exc:
        print(f"regency worker: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_debug_command(commands: Any) -> None:
    debug = commands.add_parser(
        "debug", help="attach to the controller's debug server (see docs/debugging.md)"
    )
    debug.add_argument(
        "--host",
        default=os.environ.get("REGENCY_DEBUG_SERVER_HOST", "localhost"),
        help="debug server host (default: $REGENCY_DEBUG_SERVER_HOST or localhost)",
    )
    debug.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("REGENCY_DEBUG_SERVER_PORT", "27000")),
        help="debug server port (default: $REGENCY_DEBUG_SERVER_PORT or 27000)",
    )
    debug.add_argument(
        "--token", help="the server's token (default: read from ~/.regency/debug-PORT.token)"
    )


def _add_sim_command(commands: Any) -> None:
    sim = commands.add_parser(
        "sim", help="the deterministic simulator (see docs/simulation.md)"
    )
    sim_commands = sim.add_subparsers(dest="sim_command", required=True)
    explore = sim_commands.add_parser(
        "explore",
        help="simulate a program on many seeds in parallel and print each failing seed's "
        "replay line (exit status 1 when a seed failed)",
    )
    explore.add_argument(
        "program", metavar="MODULE:FUNCTION", help="the program, a function of the host mesh"
    )
    explore.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    explore.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    explore.add_argument("--hosts", type=int, default=4, help="simulated hosts (default 4)")
    explore.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: one per CPU)"
    )
    explore.add_argument(
        "--faults",
        default="none",
        help="none (default); random: a schedule drawn per seed from "
        "fault_schedules(HOSTS, crashes=True, procs=True), shrunk when it fails; or an "
        "expression of regency.sim names, e.g. 'Faults(crash=0.5)' or a FaultSchedule(...) "
        "from a replay line",
    )
    explore.add_argument(
        "--buggify", choices=["off", "on", "seed"], default="off",
        help="adversarial settings: off (default), on, or seed (the seed decides)",
    )
    explore.add_argument(
        "--stop-after", type=int, default=1,
        help="stop after this many failing seeds (default 1; 0: run every seed)",
    )
    explore.add_argument(
        "--no-shrink", action="store_true", help="do not shrink a failing random schedule"
    )
    explore.add_argument(
        "--log-tail", type=int, default=5, help="run log entries shown per failure (default 5)"
    )
    explore.set_defaults(run=_sim)


def _sim(args: argparse.Namespace) -> int:
    from .sim._explore import run_command

    return run_command(args)


def _debug(args: argparse.Namespace) -> int:
    from ._debugger._client import run_client

    return run_client(args.host, args.port, token=args.token)


if __name__ == "__main__":
    sys.exit(main())
