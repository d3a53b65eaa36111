"""What travels between the controller and the tensor workers: ref markers and failures.

An op is a plain tuple (the fastest thing to pickle) whose first field names its kind; the
kinds and their fields are listed in :mod:`._worker`, next to the code that runs them.
"""

from __future__ import annotations

from typing import Any

import attrs


class Ref:
    """Stands for a remote tensor inside an op's arguments: the worker swaps in its value."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self) -> tuple[type[Ref], tuple[int]]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


@attrs.frozen
class Packed:
    """A fetched CPU tensor as (dtype, shape, bytes): in a simulation, where a pickled
    tensor's size (it names its storage by address) would break byte-for-byte replay."""

    dtype: Any
    shape: tuple[int, ...]
    data: bytes


@attrs.frozen
class Failure:
    """A value that could not be computed on a worker: the op that failed first (``seq``),
    the rank it failed on, and the error as data (it unpickles anywhere)."""

    seq: int
    rank: int
    type_name: str
    message: str
    traceback: str
