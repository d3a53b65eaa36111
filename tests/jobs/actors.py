"""Actors for the job tests (importable by procs)."""

from __future__ import annotations

import os

from regency.actor import Actor, context, endpoint


class Probe(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def where(self) -> tuple[int, str | None, int]:
        """(our pid, the Slurm job we run in, our worker's pid)"""
        return os.getpid(), os.environ.get("SLURM_JOB_ID"), os.getppid()

    @endpoint
    def address(self) -> str:
        address: str = context().actor_instance._proc_address
        return address

    @endpoint
    def bump(self) -> int:
        self.count += 1
        return self.count

    @endpoint
    def secret_in_env(self) -> bool:
        return "REGENCY_SECRET" in os.environ

    @endpoint
    def bump_there(self, other: Probe) -> int:
        """Call another job's probe from this proc (procs of two jobs reach each other)."""
        value: int = other.bump.call_one().get(60)
        return value
