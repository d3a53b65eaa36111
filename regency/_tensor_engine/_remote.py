"""``remote(fn)``: a function that runs on every proc of a mesh, over its tensors."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..core import Future, ValueMesh
from . import _context
from ._engine import ISSUER, engine_for
from ._errors import LOCAL_TENSOR, bad_argument
from ._records import Failure, Ref
from ._stream import get_active_stream
from ._tensor import Tensor, check_handles, faking, handles_for


def _local_function(fn: Any) -> Callable[..., Any]:
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    module, _, attr = fn.rpartition(".")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


class Remote:
    """What :func:`remote` returns: call it to issue it; ``.call()`` and friends fetch."""

    def __init__(self, fn: Any, propagate: Any) -> None:
        if not (callable(fn) or (isinstance(fn, str) and "." in fn)):
            raise TypeError(f"remote takes a function or a 'pkg.module.function' path (got {fn!r})")
        if not (propagate is None or callable(propagate) or propagate in ("inspect", "cached")):
            raise ValueError(
                f"propagate must be a function, 'inspect', 'cached' or None (got {propagate!r})"
            )
        self._fn = fn
        self._propagate = propagate
        self.__name__ = fn if isinstance(fn, str) else getattr(fn, "__name__", repr(fn))

    def __repr__(self) -> str:
        return f"<regency.remote {self.__name__}>"

    def _prepare(self, args: Any, kwargs: Any) -> tuple[Any, Any, list[Tensor], Any]:
        """(mesh, template with refs, handles, fake (args, kwargs))."""
        flat, spec = pytree.tree_flatten((args, kwargs))
        handles = [a for a in flat if isinstance(a, Tensor)]
        mesh = handles[0]._mesh if handles else _context.active_mesh_or_none()
        call = f"{self.__name__}(...)"
        if mesh is None:
            raise ValueError(
                f"{call}: no device mesh is active and no argument is a regency.Tensor"
            )
        stream = get_active_stream()
        check_handles(call, handles, mesh, stream)
        template, fakes = list(flat), list(flat)
        for i, a in enumerate(flat):
            if isinstance(a, Tensor):
                template[i] = Ref(a._ref)
                fakes[i] = a._fake
            elif isinstance(a, torch.Tensor):
                raise bad_argument(
                    call,
                    LOCAL_TENSOR,
                    f"a local tensor of shape {tuple(a.shape)} was passed "
                    f"to a remote function on {mesh!r}",
                )
        return (
            mesh,
            pytree.tree_unflatten(template, spec),
            handles,
            pytree.tree_unflatten(fakes, spec),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mesh, template, handles, (fa, fk) = self._prepare(args, kwargs)
        propagate = self._propagate
        if propagate == "inspect":
            fake_out: Any = None
        else:
            fn = propagate if callable(propagate) else _local_function(self._fn)
            try:
                with faking():
                    fake_out = fn(*fa, **fk)
            except Exception as exc:
                raise TypeError(
                    f"cannot work out what {self.__name__} returns by running it on fake "
                    f"tensors ({type(exc).__name__}: {exc}); give remote(..., propagate=fn), "
                    "a function of the same arguments that returns tensors of the right shape"
                ) from exc
        engine = handles[0]._engine if handles else engine_for(mesh)
        stream = get_active_stream()
        results, outs, out_spec = handles_for(fake_out, mesh, engine, stream)
        ISSUER.issue(engine, mesh._shape, ("fn", ISSUER.next_seq(), self._fn, template, outs))
        return pytree.tree_unflatten(results, out_spec)

    # -- endpoint-like adverbs: run and fetch ------------------------------------------------

    def _fetch_on(self, args: Any, kwargs: Any, pick: Callable[[Any], Any]) -> Any:
        mesh, template, handles, _ = self._prepare(args, kwargs)
        engine = handles[0]._engine if handles else engine_for(mesh)
        seq = ISSUER.next_seq()
        ISSUER.flush()
        return pick(engine.slice_for(mesh._shape).call_fetch), seq, template, engine.issuer

    def _fetch_one(self, args: Any, kwargs: Any, shard: dict[str, int] | None) -> Future[Any]:
        from ._fetch import _rank_of

        mesh, template, handles, _ = self._prepare(args, kwargs)
        engine = handles[0]._engine if handles else engine_for(mesh)
        seq = ISSUER.next_seq()
        return _unwrap(
            engine.call_fetch(_rank_of(mesh, shard, {}), seq, self._fn, template), engine.issuer
        )

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[Any]]:
        """Run on every proc; a future of the ValueMesh of what each returned."""
        endpoint, seq, template, issuer = self._fetch_on(args, kwargs, lambda ep: ep)
        inner = endpoint.call(seq, self._fn, template)
        out: Future[ValueMesh[Any]] = Future()

        def done() -> None:
            try:
                values = inner.get()
            except BaseException as exc:
                out.set_exception(exc)
                return
            for _, v in values.items():
                if isinstance(v, Failure):
                    from ._fetch import raise_failure

                    out.set_exception(raise_failure(v, issuer))
                    return
            out.set_result(values)

        inner.add_done_callback(done)
        return out

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on the one proc of a one-proc mesh; a future of its result."""
        mesh, _, _, _ = self._prepare(args, kwargs)
        if len(mesh._shape) != 1:
            raise ValueError(
                f"call_one needs a mesh of one proc (got {len(mesh._shape)}); slice it first"
            )
        return self._fetch_one(args, kwargs, None)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on one proc of the mesh, chosen by the runtime; a future of its result."""
        endpoint, seq, template, issuer = self._fetch_on(args, kwargs, lambda ep: ep)
        return _unwrap(endpoint.choose(seq, self._fn, template), issuer)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[Any]]:
        """Run on every proc; futures of the results in the order they arrive."""
        endpoint, seq, template, issuer = self._fetch_on(args, kwargs, lambda ep: ep)
        return (_unwrap(f, issuer) for f in endpoint.stream(seq, self._fn, template))

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every proc for its effects, now; nothing comes back (failures are dropped)."""
        mesh, template, handles, _ = self._prepare(args, kwargs)
        engine = handles[0]._engine if handles else engine_for(mesh)
        ISSUER.issue(engine, mesh._shape, ("fn", ISSUER.next_seq(), self._fn, template, []))
        engine.issuer.flush()


def _unwrap(inner: Future[Any], issuer: Any) -> Future[Any]:
    out: Future[Any] = Future()

    def done() -> None:
        try:
            value = inner.get()
        except BaseException as exc:
            out.set_exception(exc)
            return
        if isinstance(value, Failure):
            from ._fetch import raise_failure

            out.set_exception(raise_failure(value, issuer))
        else:
            out.set_result(value)

    inner.add_done_callback(done)
    return out


def remote(function: Any = None, *, propagate: Any = None) -> Any:
    """``remote(fn)`` or ``@remote(propagate=...)``: ``fn`` (a function or ``"pkg.mod.fn"``)
    runs on every proc of the mesh when called. ``propagate`` says what it returns without
    running it: a function of the same arguments run on fake tensors, ``"inspect"`` (returns
    nothing), or None (run ``fn`` itself on fake tensors)."""
    if function is None:
        return lambda fn: Remote(fn, propagate)
    return Remote(function, propagate)
