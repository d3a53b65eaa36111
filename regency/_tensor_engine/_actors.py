"""Tensors to and from actor endpoints (Monarch's semantics).

* A ``regency.Tensor`` among an endpoint call's arguments arrives, on each rank, as that
  rank's own local tensor. The call is an op on the tensor's stream (``"lend"``) as well as
  a message to the actors: the message goes straight to them, in order with the caller's
  other messages; an actor that takes it waits until its proc's tensor worker has reached
  the op (so it sees the value every earlier op left), then runs with the worker's tensor
  itself (one process: no copy).
* ``endpoint.rref(...)`` does the same, and the op (``"rref"``) also waits for what the
  endpoint returns on that rank; its tensors become the values of the ``regency.Tensor``
  handles that ``rref`` returned at once (their shapes come from the endpoint's
  ``propagate``), so later ops on the stream read them. An endpoint that raises leaves its
  results failed (fetching them raises ``RemoteException``); the actor goes on.

The worker and the actor of one proc meet in a :class:`Handoff`, per runtime (simulated
procs share a process), under the engine's token and the op's sequence number. The payload
of such a call is a :class:`TensorArguments`, which core's mailbox resolves
(``core._extensions.DeferredArguments``).

Unpickled on a proc's event loop: nothing here imports torch at module level.
"""

from __future__ import annotations

import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..core import _codec
from ..core._endpoint import EndpointSpec
from ..core._extensions import DeferredArguments
from ..core._future import Future
from ..core._shape import Shape
from ._errors import RemoteException
from ._records import Failure

if TYPE_CHECKING:
    from ..core._adverbs import Endpoint
    from ..core._runtime import Runtime
    from ._tensor import Tensor


# -- where a worker and an actor of one proc meet --------------------------------------------


class Handoff:
    """One call's meeting point on one proc: ``lent`` (the worker's tensors for the call's
    arguments, or the :class:`Failure` of one of them) and, for ``rref``, ``outcome`` (what
    the endpoint returned, or a Failure). ``abandoned``: why the call will never run here
    (its actor was gone), set before the worker came."""

    __slots__ = ("abandoned", "lent", "outcome")

    def __init__(self) -> None:
        self.lent: Future[Any] = Future()
        self.outcome: Future[Any] = Future()
        self.abandoned: str | None = None


_handoffs: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], Handoff]] = (
    weakref.WeakKeyDictionary()
)
_handoffs_lock = threading.Lock()


def _table(rt: Runtime) -> dict[tuple[str, int], Handoff]:
    table = _handoffs.get(rt)
    if table is None:
        table = _handoffs[rt] = {}
    return table


def handoff(rt: Runtime, token: str, seq: int) -> Handoff:
    """The handoff of op ``seq`` of engine ``token`` on ``rt``'s proc (made by whichever of
    the worker and the actor comes first)."""
    with _handoffs_lock:
        table = _table(rt)
        entry = table.get((token, seq))
        if entry is None:
            entry = table[(token, seq)] = Handoff()
        return entry


def lend(rt: Runtime, token: str, seq: int, lent: Any) -> Handoff:
    """The worker reached op ``seq``: ``lent`` goes to the call's actor. When the call was
    abandoned first (``Handoff.abandoned``), nothing is kept for it and the handoff is
    forgotten: an ``rref`` worker then fails its results instead of waiting."""
    key = (token, seq)
    with _handoffs_lock:
        table = _table(rt)
        entry = table.get(key)
        if entry is None:
            entry = table[key] = Handoff()
        elif entry.abandoned is not None:
            del table[key]
            return entry
    entry.lent.set_result(lent)
    return entry


def abandon(rt: Runtime, token: str, seq: int, why: str) -> None:
    """The call of op ``seq`` will never run on ``rt``'s proc (``why``): its tensors, if the
    worker lent them already, are let go, and an ``rref`` worker waiting for its outcome
    gets a failure; else the worker finds the handoff abandoned when it comes."""
    key = (token, seq)
    with _handoffs_lock:
        table = _table(rt)
        entry = table.get(key)
        if entry is None or not entry.lent.done():
            if entry is None:
                entry = table[key] = Handoff()
            entry.abandoned = why  # the worker has not come: it finds this
            return
        del table[key]
    entry.outcome.set_result(Failure(-1, -1, "SupervisionError", why, ""))


def _release(rt: Runtime, token: str, seq: int) -> None:
    with _handoffs_lock:
        table = _handoffs.get(rt)
        if table is not None:
            table.pop((token, seq), None)


def pending_handoffs(rt: Runtime) -> int:
    """How many handoffs ``rt``'s proc holds (for tests: none once every call ran)."""
    with _handoffs_lock:
        return len(_handoffs.get(rt, ()))


# -- pickling a call's arguments -------------------------------------------------------------


class _Collector(threading.local):
    """The handles met while pickling a call's arguments (this thread's), in order."""

    handles: list[Tensor] | None = None
    index: dict[int, int] | None = None
    #: While a proc unpickles the arguments: this rank's tensors, by index.
    values: Sequence[Any] | None = None


_local = _Collector()


@contextmanager
def _collecting() -> Iterator[list[Tensor]]:
    handles: list[Tensor] = []
    _local.handles, _local.index = handles, {}
    try:
        yield handles
    finally:
        _local.handles = _local.index = None


def reduce_handle(t: Tensor) -> tuple[Callable[[int], Any], tuple[int]] | None:
    """What ``t`` pickles as among a call's arguments (its index among them), or None when
    no call's arguments are being pickled (a handle cannot be pickled otherwise)."""
    handles, index = _local.handles, _local.index
    if handles is None or index is None:
        return None
    i = index.get(id(t))
    if i is None:  # (a pickler that gave up and a fallback one may both meet it)
        i = index[id(t)] = len(handles)
        handles.append(t)
    return (_lent, (i,))


def _lent(i: int) -> Any:
    values = _local.values
    if values is None:
        raise RuntimeError(
            "a regency.Tensor argument can only be unpickled by the actor it was sent to"
        )
    return values[i]


class TensorArguments(DeferredArguments):
    """The payload of an endpoint call with tensors among its arguments: the arguments'
    pickle (``parts``; each handle in it stands for the rank's own tensor) and where the
    rank's tensors come from (op ``seq`` of engine ``token``). ``rref``: the endpoint's
    result goes back to the worker."""

    __slots__ = ("_entry", "_skip", "parts", "rref", "seq", "token")

    def __init__(self, token: str, seq: int, parts: tuple[bytes, ...], rref: bool) -> None:
        self.token, self.seq, self.parts, self.rref = token, seq, parts, rref
        self._entry: Handoff | None = None
        self._skip = False

    def __reduce__(self) -> Any:
        parts = tuple(_codec.out_of_band(p) for p in self.parts)
        return (TensorArguments, (self.token, self.seq, parts, self.rref))

    def __repr__(self) -> str:
        kind = "rref" if self.rref else "call"
        return f"<TensorArguments {kind} of op {self.seq} of engine {self.token}>"

    async def resolve(self, rt: Runtime) -> tuple[tuple[Any, ...], dict[str, Any]]:
        entry = self._entry = handoff(rt, self.token, self.seq)
        try:
            lent = await entry.lent
        except BaseException:  # cancelled: the actor or its proc is stopping
            abandon(rt, self.token, self.seq, "the call was cancelled before it ran")
            raise
        _release(rt, self.token, self.seq)
        try:
            if isinstance(lent, Failure):
                raise RemoteException(
                    lent, None, "A regency.Tensor passed to this endpoint had failed"
                )
            _local.values = lent
            try:
                args, kwargs = _codec.loads(self.parts)
            finally:
                _local.values = None
        except Exception as exc:
            if not self.rref:
                raise
            # The stream waits for this rank's result: it fails, the actor is not called.
            entry.outcome.set_result(lent if isinstance(lent, Failure) else _failure(exc))
            self._skip = True
            return (), {}
        return args, kwargs

    def abandoned(self, rt: Runtime, why: str) -> None:
        abandon(rt, self.token, self.seq, f"the call never ran: {why}")

    def around(self, spec: EndpointSpec[..., Any] | None) -> EndpointSpec[..., Any] | None:
        if not self.rref:
            return spec
        entry = self._entry
        assert entry is not None  # resolved first
        if self._skip:
            return _NOTHING
        if spec is None or spec.explicit_response_port:
            entry.outcome.set_result(
                _failure(TypeError("rref calls an @endpoint that returns its result"))
            )
            return _NOTHING
        return _to_worker(spec, entry.outcome)


def _failure(exc: BaseException) -> Failure:
    """``exc`` as a Failure (its op and rank are the worker's to fill in)."""
    return Failure(
        -1, -1, type(exc).__name__, str(exc), "".join(traceback.format_exception(exc))
    )


def _nothing(obj: Any) -> None:
    return None


_NOTHING: EndpointSpec[..., Any] = EndpointSpec(_nothing)


def _to_worker(spec: EndpointSpec[..., Any], outcome: Future[Any]) -> EndpointSpec[..., Any]:
    """``spec``'s endpoint, its outcome given to the worker (an ``Exception`` as a Failure:
    the actor goes on) instead of a caller."""
    fn = spec.fn
    run: Callable[..., Any]
    if spec.is_async:

        async def run(obj: Any, *args: Any, **kwargs: Any) -> None:
            try:
                result = await fn(obj, *args, **kwargs)
            except Exception as exc:
                outcome.set_result(_failure(exc))
                return
            except BaseException as exc:  # the actor dies of it (core's rule); the stream goes on
                outcome.set_result(_failure(exc))
                raise
            outcome.set_result(result)

    else:

        def run(obj: Any, *args: Any, **kwargs: Any) -> None:
            try:
                result = fn(obj, *args, **kwargs)
            except Exception as exc:
                outcome.set_result(_failure(exc))
                return
            except BaseException as exc:
                outcome.set_result(_failure(exc))
                raise
            outcome.set_result(result)

    wrapped: EndpointSpec[..., Any] = EndpointSpec(run, propagate=spec.propagate)
    wrapped.name = spec.name
    wrapped.concurrent = spec.concurrent
    return wrapped


# -- the controller's side --------------------------------------------------------------------


def _pickled(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[Tensor], tuple[bytes, ...]]:
    """The handles among ``(args, kwargs)`` and their pickle (raises what pickling raises)."""
    with _collecting() as handles:
        parts = _codec.dumps((args, kwargs))
        return handles, tuple(bytes(p) for p in parts)


def _destinations(
    endpoint: Endpoint[..., Any], ranks: Sequence[int], mesh: Any, engine: Any, what: str
) -> tuple[int, ...]:
    """The global ranks (in the tensors' proc mesh) of the procs of ``endpoint``'s local
    ``ranks``; ``ValueError`` if one is not a proc of ``mesh``."""
    actors = endpoint._mesh
    where = {engine.procs[g]: g for g in mesh._shape.ranks}
    dests: list[int] = []
    for local in ranks:
        proc = actors._procs[actors._shape.ranks[local]]
        rank = where.get(proc)
        if rank is None:
            raise ValueError(
                f"{what}: the actors of {endpoint.qualname} must be on the procs of the "
                f"regency.Tensor's mesh {mesh!r}, but rank {local} of "
                f"{actors._shape.dim_sizes()} is on proc {proc[0]}, which is not one of "
                "them; spawn the actors on the mesh the tensors live on"
            )
        dests.append(rank)
    return tuple(dests)


def carry(
    endpoint: Endpoint[..., Any],
    ranks: Sequence[int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> list[Any] | None:
    """``core._extensions.MeshTensors.carry``: a call with handles among its arguments."""
    if "regency._tensor_engine._tensor" not in sys.modules:
        return None  # no handle was ever made
    from . import _context
    from ._engine import ISSUER
    from ._tensor import check_handles

    try:
        handles, parts = _pickled(args, kwargs)
    except Exception:
        return None  # something else cannot be pickled: core names it
    if not handles:
        return None
    first = handles[0]
    call = f"{endpoint.qualname}(...)"
    mesh = _context.active_mesh_or_none() or first._mesh
    check_handles(call, handles, mesh, first._stream)
    engine = first._engine
    dests = _destinations(endpoint, ranks, first._mesh, engine, call)
    seq = ISSUER.next_seq()
    shape = Shape(("rank",), (len(dests),), dests)
    ISSUER.issue(engine, shape, ("lend", seq, engine.token, [h._ref for h in handles]))
    ISSUER.flush()
    return _codec.dumps(TensorArguments(engine.token, seq, parts, False))


def rref(
    endpoint: Endpoint[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    send: Callable[[list[Any]], None],
) -> Any:
    """``core._extensions.MeshTensors.rref``: ``endpoint.rref(*args, **kwargs)``."""
    import torch
    from torch.utils import _pytree as pytree

    from . import _context
    from ._engine import ISSUER, engine_for
    from ._stream import get_active_stream
    from ._tensor import Tensor, check_handles, fake_mode, faking, handles_for

    call = f"{endpoint.qualname}.rref(...)"
    spec = getattr(endpoint._mesh._cls, endpoint._name, None)
    if not isinstance(spec, EndpointSpec):
        raise TypeError(f"{call}: rref calls an @endpoint ({endpoint._name} is a plain method)")
    if spec._explicit_response_port:
        raise TypeError(
            f"{call}: rref takes what the endpoint returns, and {endpoint._name} answers "
            "through a response port instead (explicit_response_port=True, or a "
            "@concurrent_endpoint)"
        )
    propagate = spec.propagate
    if not (callable(propagate) or propagate == "inspect"):
        raise NotImplementedError(
            f"{call}: rref needs the shape of what {endpoint._name} returns before it runs: "
            "give the endpoint @endpoint(propagate=fn), fn taking the same arguments and "
            "returning tensors of the result's shape (or propagate='inspect' when it returns "
            "no tensors); Monarch, too, has no cached propagation for actor endpoints"
        )
    handles, parts = _pickled(args, kwargs)
    stream = get_active_stream()
    mesh = handles[0]._mesh if handles else _context.active_mesh_or_none()
    if mesh is None:
        raise ValueError(f"{call}: no device mesh is active and no argument is a regency.Tensor")
    active = _context.active_mesh_or_none()
    check_handles(call, handles, active if active is not None else mesh, stream)
    engine = handles[0]._engine if handles else engine_for(mesh)
    actors = endpoint._mesh
    dests = _destinations(endpoint, range(len(actors._shape)), mesh, engine, call)
    if len(dests) != len(mesh._shape):
        raise ValueError(
            f"{call}: rref makes a tensor on every proc of {mesh!r} ({len(mesh._shape)} "
            f"procs), but {endpoint.qualname} has actors on {len(dests)} of them; call it "
            "on actors spawned on that whole mesh"
        )
    if propagate == "inspect":
        fake_out: Any = None
    else:

        def fake(a: Any) -> Any:
            if isinstance(a, Tensor):
                return a._fake
            if isinstance(a, torch.Tensor):
                return fake_mode.from_tensor(a)
            return a

        fa, fk = pytree.tree_map(fake, (args, kwargs))
        try:
            with faking():
                fake_out = propagate(*fa, **fk)
        except Exception as exc:
            raise TypeError(
                f"{call}: its propagate function raised {type(exc).__name__}: {exc}"
            ) from exc
    results, outs, out_spec = handles_for(fake_out, mesh, engine, stream)
    seq = ISSUER.next_seq()
    send(_codec.dumps(TensorArguments(engine.token, seq, parts, True)))
    op = ("rref", seq, engine.token, [h._ref for h in handles], outs, endpoint.qualname)
    ISSUER.issue(engine, mesh._shape, op)
    ISSUER.flush()
    return pytree.tree_unflatten(results, out_spec)
