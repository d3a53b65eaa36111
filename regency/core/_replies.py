"""Reply collection: the port handlers behind each adverb (one reply, a ValueMesh, a
stream, a fold, a count of acknowledgements). They run on the runtime's trio thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from . import _codec
from . import _messages as M
from ._errors import ActorError, RemoteFailure, SupervisionError
from ._future import Future
from ._shape import Shape, ValueMesh


def _decode(endpoint: str, index: int, status: int, parts: list[memoryview]) -> Any:
    """Unpickle a reply; raise what the caller should see for an error reply."""
    value = _codec.loads(parts)
    if status == M.OK:
        return value
    if status == M.ERROR:
        raise ActorError(endpoint, value, index)
    raise SupervisionError(f"Endpoint call {endpoint} failed: {value.message}")


def _call_failed(
    endpoint: str, exc: BaseException, address: str | None, route: _Route
) -> SupervisionError:
    """The error for a call whose destination is lost, naming the mesh ranks behind it."""
    ranks = [route.ranks[r] for r, a in enumerate(route.addresses) if a == address]
    where = f" on rank {ranks[0]}" if len(ranks) == 1 else f" on ranks {ranks}" if ranks else ""
    return SupervisionError(f"Endpoint call {endpoint} failed{where}: {exc}")


class _OneReply:
    __slots__ = ("dests", "endpoint", "fut", "rank")

    def __init__(self, fut: Future[Any], endpoint: str, dests: frozenset[str], rank: int) -> None:
        self.fut = fut
        self.endpoint = endpoint
        self.dests = dests
        self.rank = rank

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        try:
            self.fut.set_result(_decode(self.endpoint, index, status, parts))
        except Exception as exc:
            self.fut.set_exception(exc)
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(
            SupervisionError(f"Endpoint call {self.endpoint} failed on rank {self.rank}: {exc}")
        )


class _MeshReplies:
    """Builds the ValueMesh of a ``call``; the first error fails the whole future."""

    def __init__(
        self, fut: Future[Any], endpoint: str, shape: Shape, route: _Route
    ) -> None:
        self.fut = fut
        self.endpoint = endpoint
        self.shape = shape
        self.route = route
        self.dests = route.all_dests
        self.values: list[Any] = [None] * len(shape)
        self.seen = [False] * len(shape)
        self.missing = len(shape)

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        if self.seen[index]:
            return False  # an explicit port answered twice: the first answer counts
        self.seen[index] = True
        try:
            self.values[index] = _decode(self.endpoint, index, status, parts)
        except Exception as exc:
            self.fut.set_exception(exc)
            return True
        self.missing -= 1
        if self.missing == 0:
            self.fut.set_result(ValueMesh(self.shape, self.values))
            return True
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(_call_failed(self.endpoint, exc, address, self.route))


class _StreamReplies:
    """Resolves the k-th future with the k-th reply to arrive."""

    def __init__(self, futs: list[Future[Any]], endpoint: str, route: _Route) -> None:
        self.futs = futs
        self.next = 0
        self.endpoint = endpoint
        self.route = route
        self.dests = route.all_dests

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        fut = self.futs[self.next]
        self.next += 1
        try:
            fut.set_result(_decode(self.endpoint, index, status, parts))
        except Exception as exc:
            fut.set_exception(exc)
        return self.next == len(self.futs)

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        for fut in self.futs[self.next :]:
            fut.set_exception(_call_failed(self.endpoint, exc, address, self.route))


class _Fold:
    """Left fold of replies in arrival order (``Accumulator``)."""

    def __init__(
        self,
        fut: Future[Any],
        endpoint: str,
        n: int,
        acc: Any,
        combine: Callable[[Any, Any], Any],
        route: _Route,
    ) -> None:
        self.fut, self.endpoint, self.missing = fut, endpoint, n
        self.acc, self.combine, self.route = acc, combine, route
        self.dests = route.all_dests

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        try:
            self.acc = self.combine(self.acc, _decode(self.endpoint, index, status, parts))
        except Exception as exc:
            self.fut.set_exception(exc)
            return True
        self.missing -= 1
        if self.missing == 0:
            self.fut.set_result(self.acc)
            return True
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(_call_failed(self.endpoint, exc, address, self.route))


class _Acks:
    """Counts acknowledgements (spawn, stop); errors are remembered, not raised."""

    def __init__(self, fut: Future[None], n: int, what: str, dests: frozenset[str]) -> None:
        self.fut, self.missing, self.what, self.dests = fut, n, what, dests
        self.failures: list[RemoteFailure] = []

    def deliver(self, index: int, status: int, parts: list[memoryview]) -> bool:
        if status != M.OK:
            self.failures.append(_codec.loads(parts))
        return self.skip(1)

    def skip(self, count: int) -> bool:
        """``count`` ranks will never answer (already gone: nothing to stop or spawn there).
        Returns True when the port is finished."""
        self.missing -= count
        if self.missing > 0:
            return False
        if self.failures:
            first = self.failures[0]
            self.fut.set_exception(
                SupervisionError(
                    f"{self.what} failed on {len(self.failures)} rank(s): "
                    f"{first.type_name}: {first.message}\n{first.traceback}"
                )
            )
        else:
            self.fut.set_result(None)
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(SupervisionError(f"{self.what} failed: {exc}"))


# -- endpoints -----------------------------------------------------------------------------


class _Route(NamedTuple):
    addresses: tuple[str, ...]  # by local rank
    ranks: tuple[int, ...]  # the mesh rank of each local rank
    dest_sets: tuple[frozenset[str], ...]  # {address}, by local rank
    all_dests: frozenset[str]
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
