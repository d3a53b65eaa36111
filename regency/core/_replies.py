"""Reply collection: the port handlers behind each adverb. They run on the runtime's trio
thread.

An endpoint call's port has one handler, :class:`Replies`: it counts replies (ignoring a
second answer for a rank), decodes each, and names the ranks behind a lost destination; what
the replies become is its reducer's business (:class:`ToMesh`, :class:`Fold`,
:class:`EachInTurn`). A call to one rank (``call_one``, ``choose``) has :class:`OneReply`,
both in one record. Spawn and stop acknowledgements are counted by :class:`_Acks`.
"""

from __future__ import annotations

import threading
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .. import supervision as S
from . import _messages as M
from ._errors import ActorError, RemoteFailure, SupervisionError
from ._future import _PENDING, Future
from ._ports import PortBase
from ._shape import Shape, ValueMesh


def _decode(endpoint: str, index: int, status: int, value: Any) -> Any:
    """A reply's value; raise what the caller should see for an error reply."""
    if status == M.OK:
        return value
    if status == M.ERROR:
        raise ActorError(endpoint, value, index)
    raise SupervisionError(f"Endpoint call {endpoint}() failed, {value.message}")


def call_failed(
    endpoint: str,
    exc: BaseException,
    ranks: list[int],
    locals_: list[int],
    route: _Route | None,
) -> SupervisionError:
    """The error of a call that cannot complete, worded as Monarch words it (``Endpoint call
    mesh.method() failed, The actor <...> and all its descendants have failed: ...``), with
    what Regency knows besides: the ranks behind it and why (how the proc died, or that the
    link to it broke). ``ranks``: the mesh ranks the failure concerns (their local indices in
    the call in ``locals_``); ``exc``: why. A ``SupervisionError`` raised before sending (the
    rank was already known to have failed: ``Endpoint._check_alive``) already says so, and is
    only prefixed."""
    if type(exc) is SupervisionError or not ranks:
        return SupervisionError(f"Endpoint call {endpoint}() failed, {exc}")
    mesh_name = endpoint.rpartition(".")[0]
    if route is not None:
        who = [
            S.describe_actor(route.actor_class, mesh_name, route.labels, route.sizes, i)
            for i in locals_[:_ACTORS_NAMED]
        ]
    else:
        who = [f"<{mesh_name}>"]
    if len(ranks) == 1:
        actors = f"The actor {who[0]} at rank {ranks[0]} and all its descendants have failed"
    else:
        more = ", ..." if len(ranks) > len(who) else ""
        actors = (
            f"The actors {', '.join(who)}{more} at ranks {ranks} and all their descendants "
            "have failed"
        )
    return SupervisionError(f"Endpoint call {endpoint}() failed, {actors}: {exc}")


#: Actors a failed call's error names one by one.
_ACTORS_NAMED = 4


class Reducer(Protocol):
    """What the replies of one call become."""

    def add(self, index: int, value: Any) -> None:
        """A reply from local rank ``index``; may raise, which fails the call with that."""

    def error(self, exc: BaseException) -> bool:
        """An error reply (or a raising ``add``); True when the whole call is over."""

    def finish(self) -> None:
        """Every expected reply has come."""

    def fail(self, exc: BaseException) -> None:
        """The call can no longer complete."""


class Replies(PortBase):
    """The reply port handler of an endpoint call: ``expected`` replies, folded by
    ``reducer``. ``ranks``/``addresses``: the mesh rank and address of each rank called,
    so that a lost destination fails the call naming the ranks behind it."""

    __slots__ = (
        "addresses", "behind", "dests", "endpoint", "missing", "ranks", "reducer", "route", "seen"
    )
    #: Replies may be delivered on a thread that read them (core/_leader.py), under the
    #: runtime's dispatch lock: this handler only counts and resolves futures.
    on_any_thread = True
    endpoint: str

    def __init__(
        self,
        reducer: Reducer,
        endpoint: str,
        ranks: tuple[int, ...],
        addresses: tuple[str, ...],
        dests: frozenset[str],
        *,
        once_per_rank: bool = False,
        route: _Route | None = None,
    ) -> None:
        self.reducer, self.endpoint = reducer, endpoint
        #: The mesh's route, to name the actors of a failed call as Monarch prints them.
        self.route = route
        self.ranks, self.addresses, self.dests = ranks, addresses, dests
        self.missing = len(ranks)
        #: Ranks answered, where an explicit port may answer twice (the first answer counts).
        self.seen: list[bool] | None = [False] * len(ranks) if once_per_rank else None
        #: For a call gathered up a casting tree: the local ranks whose replies a proc was to
        #: gather (``regency.core._casting``), named too when that proc is lost.
        self.behind: Callable[[str], list[int]] | None = None

    def deliver(self, index: int, status: int, value: Any) -> bool:
        seen = self.seen
        if seen is not None:
            if seen[index]:
                return False
            seen[index] = True
        try:
            if type(value) is M.Undecodable:
                raise value.error
            if status != M.OK:
                value = _decode(self.endpoint, index, status, value)  # raises
            self.reducer.add(index, value)
        except Exception as exc:
            if self.reducer.error(exc):
                return True
        self.missing -= 1
        if self.missing == 0:
            self.reducer.finish()
            return True
        return False

    def unanswered(self) -> list[tuple[int, str]]:
        """(mesh rank, address) of each rank not heard from yet (every rank, where this
        call does not count them one by one)."""
        seen = self.seen
        return [
            (rank, address)
            for i, (rank, address) in enumerate(zip(self.ranks, self.addresses, strict=True))
            if seen is None or not seen[i]
        ]

    def explain(self, timeout: float | None) -> BaseException:
        """The error of a ``get`` that timed out (core/_introspect.py)."""
        from ._introspect import timed_out

        return timed_out(self.endpoint, len(self.ranks), self.unanswered(), timeout)

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        if len(self.ranks) == 1:
            locals_ = [0]
        else:
            locals_ = [i for i, a in enumerate(self.addresses) if a == address]
            if self.behind is not None and address is not None:
                locals_ = sorted(set(self.behind(address)).union(locals_))
        ranks = [self.ranks[i] for i in locals_]
        self.reducer.fail(call_failed(self.endpoint, exc, ranks, locals_, self.route))


class OneReply(Future[Any], PortBase):
    """The future of a call to one rank (``call_one``, ``choose``), which is also its reply
    port's handler: :class:`Replies` with a reducer that keeps the one value, folded into the
    future the caller holds. A pipelined caller keeps one per call in flight, so each object
    less is one less for the garbage collector to allocate and traverse, and one less to
    build per call (docs/performance.md). ``addresses[0]`` is the proc the reply comes from:
    a thread that waits for it reads only that proc's connection (core/_leader.py)."""

    __slots__ = ("addresses", "dests", "endpoint", "local", "ranks", "route")
    on_any_thread = True  # as Replies
    endpoint: str
    #: Never set: a one-rank call is not gathered up a casting tree.
    behind: Callable[[str], list[int]] | None = None

    def __init__(
        self,
        endpoint: str,
        ranks: tuple[int],
        addresses: tuple[str],
        dests: frozenset[str],
        route: _Route | None = None,
        local: int = 0,
    ) -> None:
        # Future.__init__'s fields, set here: one call less on the hot path.
        self._lock = _allocate_lock()
        self._value = _PENDING
        self._exception = None
        self._event = None
        self._callbacks = None
        self._bell = None
        self.endpoint = endpoint
        self.ranks, self.addresses, self.dests = ranks, addresses, dests
        #: The mesh's route and the rank's index in it, to name the actor of a failed call.
        self.route, self.local = route, local

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if type(value) is M.Undecodable:
            self._resolve(None, value.error)
        elif status == M.OK:
            self._resolve(value, None)
        else:
            try:
                _decode(self.endpoint, index, status, value)  # raises
            except Exception as exc:
                self._resolve(None, exc)
        return True

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.set_exception(
            call_failed(self.endpoint, exc, [self.ranks[0]], [self.local], self.route)
        )

    def _explainer(self) -> Callable[[float | None], BaseException] | None:
        return self._timed_out

    def _timed_out(self, timeout: float | None) -> BaseException:
        from ._introspect import timed_out

        return timed_out(self.endpoint, 1, [(self.ranks[0], self.addresses[0])], timeout)


class _IntoFuture:
    """A reducer that resolves one future; the first error fails it."""

    __slots__ = ("fut",)

    def __init__(self, fut: Future[Any]) -> None:
        self.fut = fut

    def error(self, exc: BaseException) -> bool:
        self.fut.set_exception(exc)
        return True

    def fail(self, exc: BaseException) -> None:
        self.fut.set_exception(exc)


class ToMesh(_IntoFuture):
    """A ValueMesh of the replies by rank (``call``)."""

    __slots__ = ("shape", "values")

    def __init__(self, fut: Future[Any], shape: Shape) -> None:
        super().__init__(fut)
        self.shape = shape
        self.values: list[Any] = [None] * len(shape)

    def add(self, index: int, value: Any) -> None:
        self.values[index] = value

    def finish(self) -> None:
        self.fut.set_result(ValueMesh(self.shape, self.values))


class Fold(_IntoFuture):
    """A left fold of the replies in arrival order (``Accumulator``)."""

    __slots__ = ("acc", "combine")

    def __init__(self, fut: Future[Any], acc: Any, combine: Callable[[Any, Any], Any]) -> None:
        super().__init__(fut)
        self.acc, self.combine = acc, combine

    def add(self, index: int, value: Any) -> None:
        self.acc = self.combine(self.acc, value)

    def finish(self) -> None:
        self.fut.set_result(self.acc)


class EachInTurn:
    """The k-th future gets the k-th reply to arrive, error or not (``stream``)."""

    __slots__ = ("futs", "next")

    def __init__(self, futs: list[Future[Any]]) -> None:
        self.futs = futs
        self.next = 0

    def add(self, index: int, value: Any) -> None:
        self.futs[self.next].set_result(value)
        self.next += 1

    def error(self, exc: BaseException) -> bool:
        self.futs[self.next].set_exception(exc)
        self.next += 1
        return False

    def finish(self) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        for fut in self.futs[self.next :]:
            fut.set_exception(exc)


class _Acks(PortBase):
    """Counts acknowledgements (spawn, stop); errors are remembered, not raised."""

    on_any_thread = True  # as Replies

    def __init__(self, fut: Future[None], n: int, what: str, dests: frozenset[str]) -> None:
        self.fut, self.missing, self.what, self.dests = fut, n, what, dests
        self.failures: list[RemoteFailure] = []
        # deliver may run on a thread that read the reply, skip on the loop: one at a time.
        self._lock = threading.Lock()

    def deliver(self, index: int, status: int, value: Any) -> bool:
        if status != M.OK:
            self.failures.append(value)
        return self.skip(1)

    def skip(self, count: int) -> bool:
        """``count`` ranks will never answer (already gone: nothing to stop or spawn there).
        Returns True when the port is finished."""
        with self._lock:
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
    #: ``(addresses[i],)`` and ``(ranks[i],)`` by local rank: what a one-rank call's reply
    #: handler keeps, built once per mesh rather than per call.
    one_address: tuple[tuple[str], ...]
    one_rank: tuple[tuple[int], ...]
    #: ``module.Class`` of the mesh's actors, to name them in errors ("" when unknown).
    actor_class: str = ""
