"""The body of a batch-mode Slurm job (``SlurmJob.apply(client_script=...)``).

Runs on the allocation's first node: starts one worker per node with ``srun``, runs the
client with ``REGENCY_BATCH_JOB=1`` (its ``state()`` attaches to this allocation through the
cached ``BatchJob``), and stops the workers when the client ends, however it ends. Exits with
the client's status, which ends the allocation.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys

from ._job import BATCH_ENV
from ._slurm import WORKER_BOOTSTRAP


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m regency.job._batch")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("client", help="the client command line")
    args = parser.parse_args(argv)
    workers = subprocess.Popen(
        [
            "srun",
            f"--nodes={args.nodes}",
            f"--ntasks={args.nodes}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=0",
            sys.executable,
            "-c",
            WORKER_BOOTSTRAP.format(port=args.port),
        ]
    )
    client: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: object) -> None:
        # scancel (or the time limit) signals us: pass it on, the finally below cleans up.
        if client is not None and client.poll() is None:
            client.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        # The client needs the job secret from the cached job only, not from the environment.
        env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
        client = subprocess.Popen(shlex.split(args.client), env={**env, BATCH_ENV: "1"})
        returncode = client.wait()
    finally:
        if workers.poll() is None:
            # srun passes SIGTERM to every worker; they release their procs and exit.
            workers.terminate()
            try:
                workers.wait(timeout=30)
            except subprocess.TimeoutExpired:
                workers.kill()
                workers.wait()
    print(f"regency batch: the client exited with {returncode}; workers stopped", flush=True)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
