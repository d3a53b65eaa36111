"""The tensor worker: one actor per proc holding that proc's remote tensors by ref id.

The controller sends batches of ops (``run``), in issue order, over the ordinary per-sender
FIFO; a worker runs them one after another. Op kinds (plain tuples):

``("op", seq, name, args, outs)``
    an aten op by name (``"aten::add.Tensor"``); ``args`` is ``(args, kwargs)`` with
    :class:`Ref` markers; the tensor leaves of the result become refs ``outs``, in order.
``("fn", seq, fn, args, outs)``
    a remote function (a callable or ``"pkg.mod.fn"``), the same way.
``("reduce", seq, src, out, groups, reduction, scatter, inplace, meta)``
    a collective over the group (of ``groups``, tuples of global ranks) holding this rank;
    ``meta`` is the input's (shape, dtype, device), so a
    rank whose input failed still takes part and the others do not hang.
``("move", seq, src, out, sends, recvs, meta)``
    ``to_mesh``: ``sends`` are (from, to) rank pairs; this rank sends its ``src`` where it is
    ``from`` and defines ``out`` where it is ``to``.
``("lend", seq, token, refs)``
    a call of an actor endpoint with these tensors among its arguments: the actor of this
    proc that takes the call gets them (:mod:`._actors`, handoff ``(token, seq)``).
``("rref", seq, token, refs, outs, endpoint)``
    ``endpoint.rref(...)``: lends ``refs`` as ``"lend"`` does, waits for what the endpoint
    returns on this proc, and holds its tensors under ``outs``.
``("alias", new, old)``, ``("del", refs)``, ``("peers", ports)`` (simulator).

GPU tensors: ops, factories and remote functions run wherever their tensors are; reductions
of CUDA tensors use NCCL where every member of the group has a GPU of its own, otherwise
collectives and moves stage them through host memory (gloo; see :mod:`._comm` and
docs/porting.md); values fetched to the controller are CPU tensors, as in Monarch.

A failed op stores a :class:`Failure` under each of its outputs; any op that reads a failure
stores that same failure under its own outputs (dependents fail too), and nothing else stops.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ..core import Actor, current_rank, current_runtime, endpoint
from ._actors import lend
from ._records import Failure, Packed, Ref

if TYPE_CHECKING:
    import torch

    from ._comm import Comm

# torch loads in the worker's __init__ (on the actor's thread), not when the proc unpickles
# the spawn message on its event loop: importing torch takes seconds, and the loop must keep
# answering heartbeats meanwhile.
torch: Any = None  # type: ignore[no-redef]
pytree: Any = None


def _import_torch() -> None:
    global torch, pytree
    if torch is None:
        import torch as _torch
        from torch.utils import _pytree

        pytree = _pytree
        torch = _torch


_OPS: dict[str, Any] = {}


def _keep_freed_memory() -> None:
    """Let glibc reuse freed tensor memory instead of returning it to the kernel: a fresh
    64 MiB result would otherwise pay 16k page faults every time (measured: a 64 MiB clone
    took 3x as long as the gloo allreduce it fed). Only the worker's process is affected."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4
        libc.mallopt(m_mmap_max, 0)  # big blocks from the heap, not fresh mmaps
        libc.mallopt(m_trim_threshold, 1 << 62)  # and the heap is never trimmed
    except (OSError, AttributeError):
        pass


def resolve_op(name: str) -> Any:
    """``"aten::add.Tensor"`` to ``torch.ops.aten.add.Tensor`` (cached)."""
    op = _OPS.get(name)
    if op is None:
        ns, _, rest = name.partition("::")
        base, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        _OPS[name] = op
    return op


def resolve_function(fn: Any) -> Callable[..., Any]:
    """A remote function: a callable as sent, or ``"pkg.mod.fn"`` imported here."""
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    module, _, attr = str(fn).rpartition(".")
    if not module:
        raise ValueError(f"a remote function path must look like 'pkg.mod.fn' (got {fn!r})")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def _compact(value: Any) -> Any:
    """A tensor that views part of a larger storage would pickle the whole storage: send a
    copy of just its elements instead. A GPU tensor comes to the controller as a CPU tensor
    (Monarch: "all tensors in obj will be fetched to the CPU device")."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return value.detach().cpu()
        if value.untyped_storage().nbytes() > value.numel() * value.element_size():
            return value.clone()
    return value


def _to_host(value: Any) -> Any:
    """``value`` with every non-CPU tensor in it (a pytree) copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return _compact(value)
    return pytree.tree_map(
        lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) and v.device.type != "cpu"
        else v,
        value,
    )


def _staged(t: Any) -> Any:
    """A host copy of GPU tensor ``t`` in pinned memory (torch caches pinned blocks, so a
    reduction repeated each step faults in no fresh pages, and the copies back are faster)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t)
    return host


def _device_of(meta: tuple[Any, ...]) -> Any:
    """The device in an op's ``meta`` (shape, dtype[, device]); CPU when absent."""
    return torch.device(meta[2]) if len(meta) > 2 else torch.device("cpu")


class _Failed(Exception):
    """An input was a failure: the op is skipped and its outputs inherit it."""

    def __init__(self, failure: Failure) -> None:
        self.failure = failure


#: The worker running a remote function now (workers run one op at a time; in a simulation,
#: one thread at a time).
_running: TensorWorker | None = None


def current_worker_rank() -> int:
    """The global rank (in its proc mesh) of the worker running this remote function."""
    if _running is None:
        raise RuntimeError("current_worker_rank() is only available inside a remote function")
    return _running.rank


def live_refs() -> int:
    """How many tensors the worker running this remote function holds (for tests)."""
    assert _running is not None
    return len(_running.refs)


def rank_value(table: dict[int, int]) -> Any:
    """``ProcMesh.rank_tensor``: this proc's entry of ``table`` (global rank to value)."""
    return torch.tensor(table[current_worker_rank()], dtype=torch.int64)


class TensorWorker(Actor):
    """Holds this proc's tensors; runs ops, collectives and remote functions in order."""

    def __init__(
        self, env_by_rank: list[dict[str, str]], store: tuple[str, int, str] | None, timeout: float
    ) -> None:
        _import_torch()
        _keep_freed_memory()
        self.rank = current_rank().rank
        self.refs: dict[int, Any] = {}
        rt = self._runtime = current_runtime()
        simulated = rt.env.simulated_host is not None  # procs share one OS process
        if not simulated:  # simulated procs share one os.environ
            os.environ.update(env_by_rank[self.rank])
        #: Simulated procs share one process, hence torch's one default generator: each worker
        #: keeps its own state, seeded from the simulation, swapped in around its batches.
        self._rng_state: Any = None
        if simulated:
            generator = torch.Generator().manual_seed(rt.rng.getrandbits(63))
            self._rng_state = generator.get_state()
        self._store, self._timeout = store, timeout
        self._comm: Comm | None = None
        self._channel: Any = None
        if store is None:
            from ._comm import ChannelComm

            self._channel = ChannelComm(self.rank, timeout)

    @property
    def comm(self) -> Comm:
        if self._comm is None:
            if self._channel is not None:
                self._comm = self._channel
            else:
                from ._comm import GlooComm

                assert self._store is not None
                host, port, prefix = self._store
                scheme, _, rest = current_runtime().address.partition("://")
                me = rest.rpartition(":")[0].strip("[]") if scheme == "tcp" else "127.0.0.1"
                self._comm = GlooComm(host, port, prefix, self.rank, self._timeout, me)
        return self._comm

    @endpoint
    def port(self) -> Any:
        """The channel port of this worker (simulator collectives)."""
        return self._channel.port if self._channel is not None else None

    @endpoint
    def run(self, batch: list[tuple[Any, ...]]) -> None:
        if self._rng_state is None:
            self._run(batch)
            return
        torch.set_rng_state(self._rng_state)
        try:
            self._run(batch)
        finally:
            self._rng_state = torch.get_rng_state()

    def _run(self, batch: list[tuple[Any, ...]]) -> None:
        for op in batch:
            kind = op[0]
            if kind == "op" or kind == "fn":
                self._call(op[1], op[2], op[3], op[4], kind == "op")
            elif kind == "del":
                for ref in op[1]:
                    self.refs.pop(ref, None)
            elif kind == "reduce":
                self._reduce(*op[1:])
            elif kind == "move":
                self._move(*op[1:])
            elif kind == "lend":
                lend(self._runtime, op[2], op[1], self._lent(op[1], op[3]))
            elif kind == "rref":
                self._rref(*op[1:])
            elif kind == "alias":
                if op[2] in self.refs:
                    self.refs[op[1]] = self.refs[op[2]]
            elif kind == "peers":
                self._channel.peers = dict(enumerate(op[1]))
            else:  # a controller and a worker of different versions: fail loudly
                raise ValueError(f"unknown tensor-engine op kind {kind!r}")

    @endpoint
    def fetch(self, refs: list[int]) -> list[Any]:
        """The values of ``refs`` here (a :class:`Failure` for a failed one)."""
        missing = Failure(-1, self.rank, "LookupError", "the tensor was deleted", "")
        values = [_compact(self.refs.get(ref, missing)) for ref in refs]
        if self._channel is not None:  # simulated: replayable bytes
            from ._comm import _pack

            values = [Packed(*_pack(v)) if isinstance(v, torch.Tensor) else v for v in values]
        return values

    @endpoint
    def call_fetch(self, seq: int, fn: Any, args: Any) -> Any:
        """Run a remote function here and return its result (or a Failure)."""
        global _running
        _running = self
        try:
            a, k = self._resolve(args)
            return _to_host(resolve_function(fn)(*a, **k))
        except _Failed as failed:
            return failed.failure
        except Exception as exc:
            return self._failure(seq, exc)

    # -- running ops -------------------------------------------------------------------------

    def _value(self, ref: Ref) -> Any:
        value = self.refs.get(ref.id)
        if value is None:
            raise _Failed(
                Failure(-1, self.rank, "LookupError", f"tensor ref {ref.id} is not here", "")
            )
        if isinstance(value, Failure):
            raise _Failed(value)
        return value

    def _resolve(self, args: Any) -> Any:
        return pytree.tree_map(
            lambda a: self._value(a) if isinstance(a, Ref) else a,
            args,
            is_leaf=lambda a: isinstance(a, Ref),
        )

    def _failure(self, seq: int, exc: BaseException) -> Failure:
        return Failure(
            seq, self.rank, type(exc).__name__, str(exc), "".join(traceback.format_exception(exc))
        )

    def _call(self, seq: int, fn: Any, args: Any, outs: list[int], is_op: bool) -> None:
        global _running
        refs = self.refs
        _running = self
        try:
            a, k = self._resolve(args)
            f = resolve_op(fn) if is_op else resolve_function(fn)
            result = f(*a, **k)
        except _Failed as failed:
            for out in outs:
                refs[out] = failed.failure
            return
        except Exception as exc:
            failure = self._failure(seq, exc)
            for out in outs:
                refs[out] = failure
            return
        if outs:
            self._hold(seq, outs, result, "remote function", fn)

    def _hold(self, seq: int, outs: list[int], result: Any, what: str, who: object) -> None:
        """The tensors of ``result`` under ``outs``: as many as its propagate function
        said, else each out fails, naming ``what`` ``who`` returned them."""
        refs = self.refs
        tensors = [v for v in pytree.tree_leaves(result) if isinstance(v, torch.Tensor)]
        if len(tensors) != len(outs):
            failure = self._failure(
                seq,
                TypeError(
                    f"{what} {who!r} returned {len(tensors)} tensors here but "
                    f"{len(outs)} were expected (from its propagate function)"
                ),
            )
            for out in outs:
                refs[out] = failure
            return
        for out, value in zip(outs, tensors, strict=True):
            refs[out] = value

    def _lent(self, seq: int, refs: list[int]) -> Any:
        """The tensors of ``refs`` here, or the Failure of the first that failed."""
        values: list[Any] = []
        for ref in refs:
            value = self.refs.get(ref)
            if value is None:
                return Failure(seq, self.rank, "LookupError", f"tensor ref {ref} is not here", "")
            if isinstance(value, Failure):
                return value
            values.append(value)
        return values

    def _rref(
        self, seq: int, token: str, refs: list[int], outs: list[int], endpoint: str
    ) -> None:
        """Lend ``refs`` to this proc's actor of ``endpoint``, wait for what it returns (the
        stream waits, as in Monarch), and hold its tensors under ``outs``."""
        entry = lend(self._runtime, token, seq, self._lent(seq, refs))
        if entry.abandoned is not None:  # its actor was gone: no outcome will come
            result: Any = Failure(seq, self.rank, "SupervisionError", entry.abandoned, "")
        else:
            result = entry.outcome.get()
        if isinstance(result, Failure):
            if result.seq == -1:  # raised by the endpoint: this op, this rank
                result = attrs.evolve(result, seq=seq, rank=self.rank)
            for out in outs:
                self.refs[out] = result
            return
        self._hold(seq, outs, result, "endpoint", endpoint)

    def _reduce(
        self,
        seq: int,
        src: int,
        out: int,
        groups: list[tuple[int, ...]],
        reduction: str,
        scatter: bool,
        inplace: bool,
        meta: tuple[Any, ...],
    ) -> None:
        failure: Failure | None = None
        group = next(g for g in groups if self.rank in g)
        value = self.refs.get(src)
        if isinstance(value, Failure) or value is None:
            failure = (
                value
                if isinstance(value, Failure)
                else Failure(seq, self.rank, "LookupError", f"tensor ref {src} is not here", "")
            )
            # Take part (on the same device as the others) so that they go on.
            value = torch.zeros(meta[0], dtype=meta[1], device=_device_of(meta))
        n = len(group)
        # GPU tensors: NCCL where each member has a GPU of its own, else through host memory.
        device = value.device
        staged = device.type != "cpu" and not self.comm.on_device(value, group, reduction, scatter)
        original = value
        if staged:
            value = _staged(value)
        try:
            if reduction == "stack":
                if scatter:  # all-to-all: chunk i of every member goes to member i
                    chunks = value.chunk(n)
                    me = group.index(self.rank)
                    got = self.comm.exchange(
                        group,
                        seq,
                        {r: chunks[i] for i, r in enumerate(group)},
                        dict.fromkeys(group, (tuple(chunks[me].shape), value.dtype)),
                    )
                    result = torch.cat([got[r] for r in group])
                else:
                    result = torch.stack(self.comm.allgather(value, group, seq))
            else:
                work = value if inplace and not scatter else value.clone()
                self.comm.allreduce(work, group, reduction, seq)
                result = work.chunk(n)[group.index(self.rank)].clone() if scatter else work
            if staged:
                result = result.to(device)
            if inplace and result is not original:
                original.copy_(result.reshape(original.shape))
                result = original
        except Exception as exc:
            failure = failure or self._failure(seq, exc)
            result = None
        self.refs[out] = failure if failure is not None else result

    def _move(
        self,
        seq: int,
        src: int,
        out: int,
        sends: list[tuple[int, int]],
        group: tuple[int, ...],
        meta: tuple[Any, ...],
    ) -> None:
        me = self.rank
        value = self.refs.get(src)
        failure: Failure | None = value if isinstance(value, Failure) else None
        outgoing: dict[int, torch.Tensor] = {}
        incoming: dict[int, tuple[tuple[int, ...], torch.dtype]] = {}
        for frm, to in sends:
            if frm == me:
                outgoing[to] = (
                    (_staged(value) if value.device.type != "cpu" else value)  # GPU: via host
                    if isinstance(value, torch.Tensor)
                    else torch.zeros(meta[0], dtype=meta[1])
                )
            if to == me:
                incoming[frm] = (meta[0], meta[1])
        try:
            got = self.comm.exchange(group, seq, outgoing, incoming)
        except Exception as exc:
            self.refs[out] = self._failure(seq, exc)
            return
        # A failed source still sends (zeros, so nobody hangs) and then says it failed.
        flag = torch.tensor([0 if failure is None else 1])
        status = self.comm.exchange(
            group,
            -seq - 1,
            dict.fromkeys(outgoing, flag),
            dict.fromkeys(incoming, ((1,), flag.dtype)),
        )
        device = _device_of(meta)
        for frm in incoming:
            self.refs[out] = (
                got[frm].to(device)
                if not int(status[frm][0])
                else Failure(
                    seq, frm, "RuntimeError", f"the source of to_mesh (rank {frm}) had failed", ""
                )
            )
