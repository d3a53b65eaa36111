"""Actors for the log forwarding tests (importable by child procs)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from regency.actor import Actor, current_rank, endpoint


def announce() -> None:
    """A proc bootstrap that prints before the proc serves (before the controller's word)."""
    print("booting up before serving")


class Printer(Actor):
    @endpoint
    def say(self, tag: str) -> None:
        rank = current_rank().rank
        print(f"out {tag} {rank}")
        print(f"err {tag} {rank}", file=sys.stderr)
        os.write(1, f"raw {tag} {rank}\n".encode())  # below Python: as a C extension would
        subprocess.run(["sh", "-c", f"echo sub {tag} {rank}"], check=True)

    @endpoint
    def lines(self, tag: str, count: int) -> None:
        rank = current_rank().rank
        for i in range(count):
            print(f"{tag} {rank} line {i}")

    @endpoint
    def long_line(self, size: int) -> None:
        print("L" * size)

    @endpoint
    def log(self, tag: str) -> None:
        logging.getLogger("user").info(f"info {tag}")
        logging.getLogger("user").warning(f"warning {tag}")

    @endpoint
    def nested(self, tag: str) -> None:
        """Spawn a proc from this actor; its output still goes to the job's controller."""
        from regency.actor import this_host

        inner = this_host().spawn_procs(per_host={"gpus": 1})
        printers = inner.spawn("inner", Printer)
        inner.logging_option(stream_to_client=True, aggregate_window_sec=None).get(30)
        printers.say.call(tag).get(30)
        inner.stop().get(30)  # the flush barrier, run from a proc

    @endpoint
    def die(self, tag: str) -> None:
        print(f"last words {tag}")
        print(f"last err {tag}", file=sys.stderr)
        os._exit(3)

    @endpoint
    def die_unread(self, tag: str) -> None:
        """Die by SIGKILL with a line in the pipe that the tee thread has not read."""
        from regency._logs._tee import installed

        tee = installed()
        assert tee is not None
        tee._io.acquire()  # from here on the tee thread cannot read
        print(f"unread {tag}")
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    async def die_async(self, tag: str) -> None:
        print(f"last words {tag}")
        os._exit(3)
