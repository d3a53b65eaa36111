"""Endpoints of an actor mesh and their adverbs (``call``, ``call_one``, ``choose``,
``stream``, ``broadcast``, ``Accumulator``, ``send``): each pickles its arguments once and
sends one CALL frame per destination rank, or, to many procs, one CAST down a casting tree
(:mod:`regency.core._casting`). Arguments that core cannot pickle because they are tensors of
the tensor engine go as the engine makes them (``_extensions.MeshTensors.carry``), as does
``rref``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from . import _codec
from . import _extensions as _ext
from ._controller import current_runtime
from ._errors import ArgumentPickleError, SupervisionError
from ._future import Future
from ._metrics import count_sent
from ._replies import EachInTurn, Fold, OneReply, Reducer, Replies, ToMesh
from ._shape import ValueMesh
from ._trace import sender_track
from ._waiting import here as _here
from ._waiting import served as _served

if TYPE_CHECKING:
    from ._actor_mesh import ActorMesh
    from ._channel import Port
    from ._runtime import Runtime

P = ParamSpec("P")
R = TypeVar("R")
Acc = TypeVar("Acc")


_NO_ARGUMENTS = _codec.NO_ARGUMENTS  # (the decoder tells these bytes without unpickling)


def _pickle_args(
    endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], whole: Any = None
) -> list[Any]:
    """Pickle ``whole`` (default: ``(args, kwargs)``), naming the argument at fault when it
    cannot be pickled."""
    if whole is None:
        if not args and not kwargs:
            return _NO_ARGUMENTS  # the common no-argument call: pickled once
        oob = _codec.out_of_band
        whole = (
            tuple(oob(a) for a in args),
            {k: oob(v) for k, v in kwargs.items()} if kwargs else kwargs,
        )
    try:
        return _codec.dumps(whole)
    except Exception as exc:
        for position, value in enumerate(args):
            try:
                _codec.dumps(value)
            except Exception as inner:
                raise ArgumentPickleError(
                    f"cannot pickle argument #{position} ({type(value).__name__}) "
                    f"of endpoint {endpoint}: {inner}"
                ) from inner
        for name, value in kwargs.items():
            try:
                _codec.dumps(value)
            except Exception as inner:
                raise ArgumentPickleError(
                    f"cannot pickle argument {name!r} ({type(value).__name__}) "
                    f"of endpoint {endpoint}: {inner}"
                ) from inner
        raise ArgumentPickleError(
            f"cannot pickle the arguments of endpoint {endpoint}: {exc}"
        ) from exc


def _carried(
    endpoint: Endpoint[..., Any],
    ranks: Sequence[int] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: ArgumentPickleError,
    *,
    checked: bool = True,
) -> list[Any]:
    """The payload of a call whose arguments core could not pickle (``error``): the tensor
    engine's, when they hold its tensors (each of ``ranks``, None: all of the mesh's,
    receives its own); else ``error`` is raised. ``checked``: the call is not sent when
    one of ``ranks`` is known to have failed (it fails first), so the engine is not asked
    (it would set the tensors aside for a call that never comes)."""
    if ranks is None:
        ranks = range(len(endpoint._mesh._shape))
    rt = current_runtime()
    if checked and rt.oversight.failures:
        try:
            endpoint._check_alive(rt, ranks)
        except SupervisionError:
            return _NO_ARGUMENTS  # never sent: the caller gets the same check's error
    payload = _ext.mesh_tensors().carry(endpoint, ranks, args, kwargs)
    if payload is None:
        raise error
    return payload


def _unsent(rt: Runtime, port: Any, handler: Any, exc: Exception) -> None:
    """A call that could not be sent: its reply port closes; a rank known to have failed
    (``SupervisionError``) fails the call's future, a message too large (``ValueError``) is
    raised here, at the call site."""
    rt.close_port(port[1])
    if isinstance(exc, SupervisionError):
        handler.fail(exc)
        return
    raise exc


class Endpoint(Generic[P, R]):
    """An endpoint of an actor mesh (or slice): the adverbs send to its ranks.

    ``P`` is the method's parameters (without ``self``) and ``R`` its result (awaited, for
    ``async def``), so the type checker checks ``mesh.fn.call(x)`` against ``fn``.
    Every adverb sends its messages before it returns; the future only collects replies.
    """

    if TYPE_CHECKING:
        # Inside an actor, ``self.fn(...)`` is the plain method (see EndpointSpec.__get__).
        def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any: ...

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name
        #: ``mesh.endpoint``, as errors and reply handlers name it (built once: every call
        #: passes it on).
        self.qualname = f"{mesh._name}.{name}"
        #: The mesh's rank count (a mesh's shape never changes: a slice is a new mesh).
        self._ranks = len(mesh._shape)

    def _send(
        self,
        rt: Runtime,
        local_ranks: Sequence[int],
        port: tuple[str, int] | None,
        payload: list[Any],
        *,
        gather: bool = False,
        replies: Replies | OneReply | None = None,
    ) -> None:
        """One message per rank: directly, or down a casting tree for a big mesh
        (:mod:`regency.core._casting`; ``gather``: the replies come back up it)."""
        rt.casting.send(
            self._mesh._route(), local_ranks, self._mesh._key, self._name, port, payload,
            gather=gather, replies=replies,
        )

    def _arguments(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ranks: Sequence[int] | None = None,
        *,
        checked: bool = True,
    ) -> list[Any]:
        """The call's payload: its arguments pickled, or, when they hold tensors of the
        tensor engine, as the engine carries them to ``ranks`` (None: every rank)."""
        try:
            return _pickle_args(self.qualname, args, kwargs)
        except ArgumentPickleError as exc:
            return _carried(self, ranks, args, kwargs, exc, checked=checked)

    def _check_alive(self, rt: Runtime, local_ranks: Sequence[int]) -> None:
        """Raise ``SupervisionError`` if one of ``local_ranks`` is known to have failed."""
        oversight, key, ranks = rt.oversight, self._mesh._key, self._mesh._shape.ranks
        for local in local_ranks:
            failure = oversight.failure_of(key, ranks[local])
            if failure is not None:
                who, cause = failure
                why = f": {cause.summary}" if cause is not None else ""
                # Monarch's wording (``failure on mesh "name" at rank R with event: ...``).
                raise SupervisionError(
                    f"failure on mesh \"{self._mesh._name}\" at rank {ranks[local]} with event: "
                    f"The actor {who} and all its descendants have failed{why}"
                )

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Send to every rank; the future resolves to a ValueMesh of the replies."""
        rt = current_runtime()
        payload = self._arguments(args, kwargs) if args or kwargs else _NO_ARGUMENTS
        fut: Future[ValueMesh[R]] = Future()
        fut._explain = self._call_all(
            rt, ToMesh(fut, self._mesh._shape), payload, once_per_rank=True, gather=True
        ).explain
        return fut

    def _call_all(
        self,
        rt: Runtime,
        reducer: Reducer,
        payload: list[Any],
        *,
        once_per_rank: bool = False,
        gather: bool = False,
    ) -> Replies:
        """Send to every rank, the replies to ``reducer``: a reply port opened for them, and
        one message per rank as :meth:`_send` sends it.

        A rank known to have failed, or a proc known to be unreachable, fails the reducer at
        once; a message too large raises here, at the call site.
        """
        mesh = self._mesh
        route = mesh._cached_route or mesh._route()
        handler = Replies(
            reducer,
            self.qualname,
            route.ranks,
            route.addresses,
            route.all_dests,
            once_per_rank=once_per_rank,
            route=route,
        )
        local_ranks = range(len(route.addresses))
        port = rt.open_port(handler)
        trace = rt.trace
        if trace is not None:
            trace.sent(self.qualname, port, local_ranks, sender_track())
        try:
            if rt.oversight.failures:  # a rank of some mesh failed: is it one of ours?
                self._check_alive(rt, local_ranks)
            casting = rt.casting
            if len(local_ranks) > 1:
                # Replies that come while the later ranks are sent may be read by this
                # thread (the leader's, core/_leader.py).
                (_here.waiter or _served.waiter).sending(
                    lambda: casting.send(
                        route, local_ranks, mesh._key, self._name, port, payload,
                        gather=gather, replies=handler,
                    )
                )
            else:
                casting.send(
                    route, local_ranks, mesh._key, self._name, port, payload,
                    gather=gather, replies=handler,
                )
        except (SupervisionError, ValueError) as exc:
            _unsent(rt, port, handler, exc)
        else:
            if rt.config.metrics:
                count_sent(rt, mesh._name, self._name, len(local_ranks))
        return handler

    def _call_rank(self, rt: Runtime, local: int, payload: list[Any]) -> Future[R]:
        """``_call_all`` to one rank, flattened (the pipelined and round-trip hot path): the
        same port, liveness check and errors, and ``Casting.send_one`` for the send. The
        future is its own reply handler (:class:`OneReply`)."""
        mesh = self._mesh
        route = mesh._cached_route or mesh._route()
        fut = OneReply(
            self.qualname, route.one_rank[local], route.one_address[local],
            route.dest_sets[local], route, local,
        )
        port = rt.open_port(fut)
        trace = rt.trace
        if trace is not None:
            trace.sent(self.qualname, port, (local,), sender_track())
        try:
            if rt.oversight.failures:  # a rank of some mesh failed: is it this one?
                self._check_alive(rt, (local,))
            rt.casting.send_one(route, local, mesh._key, self._name, port, payload)
        except (SupervisionError, ValueError) as exc:
            _unsent(rt, port, fut, exc)
        else:
            if rt.config.metrics:
                count_sent(rt, mesh._name, self._name, 1)
        return fut

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the only rank of a one-rank mesh."""
        if self._ranks != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly 1 rank (got {self._ranks} ranks: "
                f"{self._mesh._shape.dim_sizes()}); slice it first or use call()"
            )
        payload = self._arguments(args, kwargs) if args or kwargs else _NO_ARGUMENTS
        return self._call_rank(current_runtime(), 0, payload)

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one rank chosen uniformly at random."""
        rt = current_runtime()
        rank = rt.rng.randrange(len(self._mesh._shape))
        payload = self._arguments(args, kwargs, (rank,))
        return self._call_rank(rt, rank, payload)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Iterator[Future[R]]:
        """Send to every rank; yield one future per rank, in the order replies arrive."""
        rt = current_runtime()
        payload = self._arguments(args, kwargs)
        futs: list[Future[R]] = [Future() for _ in range(len(self._mesh._shape))]
        explain = self._call_all(rt, EachInTurn(futs), payload, once_per_rank=True).explain
        for fut in futs:
            fut._explain = explain
        return iter(futs)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every rank; wait for nothing. A rank known to have failed raises
        ``SupervisionError`` here."""
        rt = current_runtime()
        payload = self._arguments(args, kwargs)
        self._broadcast(rt, payload)

    def _broadcast(self, rt: Runtime, payload: list[Any]) -> None:
        """Send pickled arguments to every rank, with no reply port."""
        ranks = range(len(self._mesh._shape))
        if rt.oversight.failures:  # a rank of some mesh failed: is it one of ours?
            self._check_alive(rt, ranks)
        trace = rt.trace
        if trace is not None:
            trace.sent(self.qualname, None, ranks, sender_track())
        self._send(rt, ranks, None, payload)
        if rt.config.metrics:
            count_sent(rt, self._mesh._name, self._name, len(ranks))

    def _fold(
        self, acc: Any, combine: Callable[[Any, Any], Any], args: Any, kwargs: Any
    ) -> Future[Any]:
        rt = current_runtime()
        payload = self._arguments(args, kwargs)
        fut: Future[Any] = Future()
        fut._explain = self._call_all(
            rt, Fold(fut, acc, combine), payload, once_per_rank=True, gather=True
        ).explain
        return fut

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call every rank from the tensor engine's stream: what the endpoint returns on
        each rank becomes a tensor of the engine (``regency.Tensor``), usable in later ops at
        once. The endpoint says its result's shape with ``@endpoint(propagate=fn)``."""
        rt = current_runtime()
        result: R = _ext.mesh_tensors().rref(
            self, args, kwargs, lambda payload: self._broadcast(rt, payload)
        )
        return result

    def __repr__(self) -> str:
        return f"<Endpoint {self.qualname} over {self._mesh._shape.dim_sizes()}>"


class _PlainMethod:
    """An undecorated method looked up on a mesh: only ``as_endpoint`` can use it."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh, self._name = mesh, name

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(
            f"{self._mesh._cls.__name__}.{self._name} is not an endpoint; decorate it with "
            f"@endpoint, or call it through as_endpoint(mesh.{self._name}).{attr}(...)"
        )


def as_endpoint(method: Any) -> Endpoint[..., Any]:
    """Call an undecorated actor method through a mesh (Monarch's ``as_endpoint``)."""
    if isinstance(method, Endpoint):
        return method
    if isinstance(method, _PlainMethod):
        return Endpoint(method._mesh, method._name)
    raise TypeError(f"as_endpoint takes a method looked up on an actor mesh (got {method!r})")


class Accumulator(Generic[R, Acc]):
    """Left fold of an endpoint's replies over all ranks, in arrival order."""

    def __init__(
        self, endpoint: Endpoint[..., R], identity: Acc, combine: Callable[[Acc, R], Acc]
    ) -> None:
        self._endpoint, self._identity, self._combine = endpoint, identity, combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[Acc]:
        return self._endpoint._fold(self._identity, self._combine, args, kwargs)


def send(
    endpoint: Endpoint[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port[Any] | None = None,
    selection: str = "all",
) -> None:
    """Send to an endpoint's ranks; replies, if any, go to ``port`` (Monarch's ``send``)."""
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be one of ('all', 'choose') (got {selection!r})")
    rt = current_runtime()
    n = len(endpoint._mesh._shape)
    ranks: Sequence[int] = [rt.rng.randrange(n)] if selection == "choose" else range(n)
    # (No liveness check for tensors carried: a failed rank bounces the call.)
    payload = endpoint._arguments(args, kwargs, ranks, checked=False)
    endpoint._send(rt, ranks, port._ref if port is not None else None, payload)
    if rt.config.metrics:
        count_sent(rt, endpoint._mesh._name, endpoint._name, len(ranks))


# -- meshes --------------------------------------------------------------------------------
