"""Bootstrap callables for tests/core/test_bootstrap_failure.py (imported by the procs)."""

from __future__ import annotations

from regency.actor import Actor, endpoint


def raise_in_boot() -> None:
    """A sync bootstrap that raises: its proc reports it and exits."""
    raise RuntimeError("stage 3.4 bootstrap failure")


async def raise_in_async_boot() -> None:
    """An async bootstrap that raises (run on the proc's loop)."""
    raise KeyError("no such shard")


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value
