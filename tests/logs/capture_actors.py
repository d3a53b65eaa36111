"""Actors for the file capture and output tail tests (importable by child procs)."""

from __future__ import annotations

import os
import subprocess
import sys

from regency.actor import Actor, context, current_rank, endpoint


def read_everything() -> None:
    """Return once this proc's tee has read all that was written to fds 1 and 2 (its
    lines are in the tail and the files): the test then knows what a kill finds there."""
    from regency._logs._tee import installed

    sys.stdout.flush()
    sys.stderr.flush()
    tee = installed()
    assert tee is not None, "the tee is not installed in this proc"
    with tee._io:
        tee._drain()


def fail_to_boot() -> None:
    """A proc bootstrap that prints and raises: the proc exits with status 1."""
    print("booting the trainer")
    raise ValueError("no checkpoint at /ckpt/7")


class Writer(Actor):
    @endpoint
    def whoami(self) -> tuple[str, int, int]:
        return context().actor_instance.proc_id, current_rank().rank, os.getpid()

    @endpoint
    def say(self, tag: str) -> None:
        """One line on each stream, from Python, below it, and from a subprocess."""
        rank = current_rank().rank
        print(f"out {tag} {rank}")
        print(f"err {tag} {rank}", file=sys.stderr)
        os.write(1, f"raw {tag} {rank}\n".encode())
        subprocess.run(["sh", "-c", f"echo sub {tag} {rank}"], check=True)

    @endpoint
    def lines(self, count: int, width: int = 40) -> None:
        for i in range(count):
            print(f"line {i:06d} " + "x" * width)
        read_everything()

    @endpoint
    def unfinished(self, text: str) -> None:
        """Write a line without its newline: only the drain at the proc's exit sends it."""
        sys.stdout.write(text)

    @endpoint
    def last_words(self, count: int, exit_status: int | None) -> int:
        """Print ``count`` lines and one on stderr; then ``os._exit(exit_status)``, or with
        None return this proc's pid once its tee has read them (the test kills it)."""
        for i in range(count):
            print(f"step {i}")
        print("dying now", file=sys.stderr)
        if exit_status is not None:
            os._exit(exit_status)
        read_everything()
        return os.getpid()
