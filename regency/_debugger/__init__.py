"""Remote pdb for actors (docs/debugging.md)."""

from __future__ import annotations


def install_breakpoint_hook() -> None:
    pass
