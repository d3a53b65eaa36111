"""Streams and borrows.

On CPU the ops of every stream run in one worker, in issue order (a correct schedule of
streams that would run concurrently on a GPU). Borrows keep their rules all the same, checked
where the op is issued: while a tensor is borrowed mutably its origin cannot be used at all,
while it is borrowed immutably neither side may write to it, until ``Borrow.drop()``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import _context


class Stream:
    """A named sequence of ops on every proc of a mesh (``Stream("comms")``)."""

    def __init__(self, name: str, _default: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a stream name must be a non-empty str (got {name!r})")
        self.name = name
        self.default = _default

    def __repr__(self) -> str:
        return f"<regency.Stream {self.name!r}>"

    def activate(self) -> Any:
        """Ops issued inside the block run on this stream."""
        return _activated(self)

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Borrow]:
        """``borrowed, borrow = stream.borrow(t)``: use ``t`` on this stream until
        ``borrow.drop()``. Mutable: only this stream may touch it meanwhile; immutable: both
        may read it and neither may write."""
        from ._tensor import Tensor, borrow_tensor

        if not isinstance(t, Tensor):
            raise TypeError(f"borrow takes a regency.Tensor (got {type(t).__name__})")
        if t.stream is self:
            raise ValueError(f"{t!r} is already on stream {self.name!r}: nothing to borrow")
        return borrow_tensor(t, self, mutable)


@contextmanager
def _activated(stream: Stream) -> Iterator[Stream]:
    _context._stream_stack.append(stream)
    try:
        yield stream
    finally:
        _context._stream_stack.pop()


_MAIN = Stream("main", _default=True)


def get_active_stream() -> Stream:
    """The stream of the innermost ``Stream.activate()`` (``Stream("main")`` by default)."""
    stack = _context._stream_stack
    return stack[-1] if stack else _MAIN


class Borrow:
    """The loan of a tensor to another stream; ``drop()`` (or the end of a ``with``) ends it."""

    def __init__(self, origin: Any, borrowed: Any, mutable: bool) -> None:
        self._origin, self._borrowed, self.mutable = origin, borrowed, mutable
        self.dropped = False

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    def drop(self) -> None:
        """End the borrow: the borrowed tensor is dropped and the origin is usable again."""
        if self.dropped:
            return
        self.dropped = True
        self._borrowed.drop()
        origin = self._origin
        origin._loans -= 1
        if origin._loans == 0:
            origin._access = "rw"

    def __del__(self) -> None:
        if not self.dropped:
            warnings.warn(
                f"{self!r} was collected without borrow.drop(); dropped now, so that its "
                "origin is usable again (call drop() where the borrow should end)",
                RuntimeWarning,
                stacklevel=2,
            )
            self.drop()

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else "live"
        return (
            f"<Borrow of {self._origin!r} ({'mutable' if self.mutable else 'immutable'}, {state})>"
        )
