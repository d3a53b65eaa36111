"""Bringing values back to the controller: ``fetch_shard``, ``inspect``, ``show``,
``call_on_shard_and_fetch``."""

from __future__ import annotations

from typing import Any

import attrs
from torch.utils import _pytree as pytree

from ..core import Future
from ._comm import _unpack
from ._engine import Engine, Issuer
from ._errors import BORROWED, DROPPED, bad_argument
from ._records import Failure, Packed
from ._tensor import Tensor, same_place


def _rank_of(mesh: Any, shard: dict[str, int] | None, coords: dict[str, int]) -> int:
    """The global rank at ``shard``/``coords`` of ``mesh`` (0 along every dim not given)."""
    if shard is not None and not isinstance(shard, dict):
        raise TypeError(
            f"shard must be a dict of coordinates (got {shard!r}); a dim named 'shard' is "
            "given as shard={'shard': 1}"
        )
    given = dict(shard or {})
    given.update(coords)
    shape = mesh._shape
    for dim in given:
        if dim not in shape.labels:
            raise ValueError(f"shard dims must be among {shape.labels} (got {dim!r})")
    full = {d: given.get(d, 0) for d in shape.labels}
    local = shape._local_rank(full, "fetch_shard") if shape.labels else 0
    return int(shape.ranks[local])


def raise_failure(failure: Failure, issuer: Issuer) -> Exception:
    """The RemoteException for ``failure``, with where its op was issued."""
    from ._errors import RemoteException

    return RemoteException(failure, issuer.site_frames(failure.seq))


def _handles_of(call: str, obj: Any) -> list[Tensor]:
    handles = [leaf for leaf in pytree.tree_leaves(obj) if isinstance(leaf, Tensor)]
    for h in handles:
        if h._dropped:
            raise bad_argument(call, DROPPED, f"{h!r} was dropped and cannot be fetched")
        if h._access == "":
            raise bad_argument(call, BORROWED, f"{h!r} is borrowed mutably by another stream")
        if not same_place(h._mesh, handles[0]._mesh):
            raise ValueError(
                f"{call}: every tensor must be on one mesh ({h._mesh!r} and "
                f"{handles[0]._mesh!r} differ); fetch them separately"
            )
    return handles


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Future[Any]:
    """A future of ``obj`` with every ``regency.Tensor`` replaced by its value at one point
    of its mesh (0 along every dim not named). Non-tensors pass through. A failed value
    raises :class:`~regency.mesh_controller.RemoteException` from ``.get()``."""
    handles = _handles_of("fetch_shard", obj)
    result: Future[Any] = Future()
    if not handles:
        result.set_result(obj)
        return result
    mesh = handles[0]._mesh
    rank = _rank_of(mesh, shard, coords)
    engine: Engine = handles[0]._engine
    inner = engine.fetch(rank, [h._ref for h in handles])

    def done() -> None:
        try:
            values = inner.get()
        except BaseException as exc:
            result.set_exception(exc)
            return
        for value in values:
            if isinstance(value, Failure):
                result.set_exception(raise_failure(value, engine.issuer))
                return
        values = [
            _unpack(*attrs.astuple(v, recurse=False)) if isinstance(v, Packed) else v
            for v in values
        ]
        by_id = {id(h): v for h, v in zip(handles, values, strict=True)}
        result.set_result(pytree.tree_map(lambda leaf: by_id.get(id(leaf), leaf), obj))

    inner.add_done_callback(done)
    return result


def inspect(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """``fetch_shard(obj, shard, **coords).get()``: the value, here, now."""
    return fetch_shard(obj, shard, **coords).get()


def show(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """Print what :func:`inspect` returns (Monarch's notebook helper), and return it."""
    value = inspect(obj, shard, **coords)
    print(value)
    return value


def call_on_shard_and_fetch(
    remote_fn: Any, *args: Any, shard: dict[str, int] | None = None, **kwargs: Any
) -> Future[Any]:
    """Run ``remote_fn`` on one proc of the mesh of its tensor arguments (or the active mesh)
    and fetch what it returns."""
    from ._remote import Remote

    if not isinstance(remote_fn, Remote):
        raise TypeError(
            f"call_on_shard_and_fetch takes a function made with regency.remote (got {remote_fn!r})"
        )
    return remote_fn._fetch_one(args, kwargs, shard)
