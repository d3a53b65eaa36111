"""How tensor workers exchange tensors: gloo process groups, or actor messages in a simulation.

Both backends offer the same three operations over a *group* (a tuple of global ranks, in mesh
order; every member calls with the same group and in the same issue order):

* ``allreduce(t, group, op, tag)`` in place, ``op`` one of :data:`REDUCE_OPS`;
* ``allgather(t, group, tag) -> list[Tensor]`` (one per member, in group order);
* ``exchange(group, tag, outgoing, incoming) -> dict[rank, Tensor]``: point to point, used by
  all-to-all and ``to_mesh``.

With gloo every group gets its own ``ProcessGroupGloo`` built from a store prefix, so only its
members take part in creating it (no world-wide barrier) and bulk data never travels as an
actor message. ``tag`` is the op's sequence number: the same on every member, unique per op.
In a simulation gloo cannot run (real sockets, real threads); there each worker
owns a channel and tensors travel as messages over the simulated network.

CUDA tensors: a group whose members each hold their tensor on a GPU of their own (told apart
by device UUID, exchanged once per group through the store) all-reduces and all-gathers them
with NCCL, in place on the GPU, as Monarch does. Anything else (procs sharing one GPU, which
NCCL refuses; bitwise reductions; point-to-point moves) runs on host copies over gloo: the
worker stages them (see ``Comm.on_device``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch

from ..core import Channel, Port

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")

Group = tuple[int, ...]


class Comm:
    """The interface both backends implement."""

    rank: int

    def on_device(self, t: torch.Tensor, group: Group, reduction: str, scatter: bool) -> bool:
        """Whether this reduction of CUDA tensor ``t`` runs on the GPU itself (else the worker
        stages it through host memory). Every member of ``group`` answers the same."""
        return False

    def allreduce(self, t: torch.Tensor, group: Group, op: str, tag: int) -> None:
        raise NotImplementedError

    def allgather(self, t: torch.Tensor, group: Group, tag: int) -> list[torch.Tensor]:
        raise NotImplementedError

    def exchange(
        self,
        group: Group,
        tag: int,
        outgoing: dict[int, torch.Tensor],
        incoming: dict[int, tuple[tuple[int, ...], torch.dtype]],
    ) -> dict[int, torch.Tensor]:
        raise NotImplementedError


def _combine(values: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of ``values`` (in group order) computed locally."""
    out = values[0].clone()
    for v in values[1:]:
        if op in ("sum", "avg"):
            out.add_(v)
        elif op == "product":
            out.mul_(v)
        elif op == "min":
            torch.minimum(out, v, out=out)
        elif op == "max":
            torch.maximum(out, v, out=out)
        elif op == "band":
            out.bitwise_and_(v)
        elif op == "bor":
            out.bitwise_or_(v)
        else:
            out.bitwise_xor_(v)
    return out


def finish_avg(t: torch.Tensor, n: int) -> None:
    """Sum to mean, in place (integers round toward minus infinity)."""
    if t.is_floating_point() or t.is_complex():
        t.div_(n)
    else:
        t.copy_(torch.div(t, n, rounding_mode="floor"))


class GlooComm(Comm):
    """One gloo process group per group of ranks, created on first use from a shared store."""

    def __init__(
        self, host: str, port: int, prefix: str, rank: int, timeout: float, me: str
    ) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = rank
        self._timeout = datetime.timedelta(seconds=timeout)
        # gloo would advertise whatever this machine's hostname resolves to, which is wrong in
        # containers and network namespaces: bind to the address this proc already serves on.
        self._device = dist.ProcessGroupGloo.create_device(hostname=me)
        store_cls = dist.TCPStore  # type: ignore[attr-defined]
        self._store = store_cls(host, port, is_master=False, timeout=self._timeout)
        self._prefix = prefix
        self._groups: dict[Group, Any] = {}
        #: group -> its NCCL process group, or None where NCCL cannot serve it (decided once).
        self.nccl: dict[Group, Any] = {}
        dist_ops = dist.ReduceOp
        self._ops = {
            "sum": dist_ops.SUM,
            "avg": dist_ops.SUM,
            "product": dist_ops.PRODUCT,
            "min": dist_ops.MIN,
            "max": dist_ops.MAX,
            "band": dist_ops.BAND,
            "bor": dist_ops.BOR,
            "bxor": dist_ops.BXOR,
        }

    def _group(self, group: Group) -> Any:
        pg = self._groups.get(group)
        if pg is None:
            dist = self._dist
            name = f"{self._prefix}/{'.'.join(map(str, group))}"
            options = dist.ProcessGroupGloo._Options()
            options._devices = [self._device]
            options._timeout = self._timeout
            pg = dist.ProcessGroupGloo(
                dist.PrefixStore(name, self._store),
                group.index(self.rank),
                len(group),
                options,
            )
            self._groups[group] = pg
        return pg

    def _nccl_group(self, group: Group, t: torch.Tensor) -> Any:
        """The NCCL process group of ``group``, or None: made when every member holds its
        tensors on a GPU of its own (NCCL refuses two ranks on one GPU). The members learn
        each other's device UUIDs through the store, so all of them decide alike."""
        if group in self.nccl:
            return self.nccl[group]
        dist = self._dist
        pg = None
        if dist.is_nccl_available():
            store = dist.PrefixStore(
                f"{self._prefix}/nccl/{'.'.join(map(str, group))}", self._store
            )
            store.set(str(self.rank), str(torch.cuda.get_device_properties(t.device).uuid))
            uuids = [store.get(str(r)).decode() for r in group]
            if len(set(uuids)) == len(uuids):
                torch.cuda.set_device(t.device)
                pg = dist.ProcessGroupNCCL(
                    dist.PrefixStore("pg", store), group.index(self.rank), len(group)
                )
        self.nccl[group] = pg
        return pg

    def on_device(self, t: torch.Tensor, group: Group, reduction: str, scatter: bool) -> bool:
        if t.device.type != "cuda":
            return False
        if reduction == "stack":
            ok = not scatter  # an all-gather; all-to-all is point to point (gloo)
        else:
            ok = reduction in ("sum", "avg", "product", "min", "max")
        return ok and self._nccl_group(group, t) is not None

    def allreduce(self, t: torch.Tensor, group: Group, op: str, tag: int) -> None:
        opts = self._dist.AllreduceOptions()
        opts.reduceOp = self._ops[op]  # type: ignore[assignment]
        pg = self.nccl.get(group) if t.device.type == "cuda" else None
        (pg or self._group(group)).allreduce([t], opts).wait()
        if op == "avg":
            finish_avg(t, len(group))

    def allgather(self, t: torch.Tensor, group: Group, tag: int) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in group]
        pg = self.nccl.get(group) if t.device.type == "cuda" else None
        (pg or self._group(group)).allgather([out], [t.contiguous()]).wait()
        return out

    def exchange(
        self,
        group: Group,
        tag: int,
        outgoing: dict[int, torch.Tensor],
        incoming: dict[int, tuple[tuple[int, ...], torch.dtype]],
    ) -> dict[int, torch.Tensor]:
        pg = self._group(group)
        works = []
        received: dict[int, torch.Tensor] = {}
        for src, (shape, dtype) in incoming.items():
            if src == self.rank:
                continue
            buf = torch.empty(shape, dtype=dtype)
            received[src] = buf
            works.append(pg.recv([buf], group.index(src), tag % (1 << 31)))
        for dst, t in outgoing.items():
            if dst == self.rank:
                received[dst] = t.clone()
                continue
            works.append(pg.send([t.contiguous()], group.index(dst), tag % (1 << 31)))
        for work in works:
            work.wait()
        return received


def _pack(t: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], bytes]:
    """A CPU tensor as plain bytes: a pickled tensor names its storage by memory address, so
    its size would vary from run to run and a simulation would not replay byte for byte."""
    import ctypes

    c = t.detach().contiguous()
    return (c.dtype, tuple(c.shape), ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()))


def _unpack(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class ChannelComm(Comm):
    """Tensors as actor messages to each member's channel (the simulator's collectives)."""

    def __init__(self, rank: int, timeout: float) -> None:
        self.rank = rank
        #: Seconds (virtual, in a simulation) to wait for a peer: a crashed peer fails the
        #: collective instead of hanging the worker.
        self.timeout = timeout
        self.port, self._inbox = Channel[Any].open()
        self.peers: dict[int, Port[Any]] = {}
        self._stash: dict[tuple[int, int], Any] = {}

    def exchange(
        self,
        group: Group,
        tag: int,
        outgoing: dict[int, torch.Tensor],
        incoming: dict[int, tuple[tuple[int, ...], torch.dtype]],
    ) -> dict[int, torch.Tensor]:
        received: dict[int, torch.Tensor] = {}
        for dst, t in outgoing.items():
            if dst == self.rank:
                received[dst] = t.clone()
            else:
                self.peers[dst].send((tag, self.rank, _pack(t)))
        for src in incoming:
            if src == self.rank:
                continue
            while (tag, src) not in self._stash:
                try:
                    got_tag, sender, value = self._inbox.recv().get(self.timeout)
                except TimeoutError:
                    raise TimeoutError(
                        f"rank {src} sent nothing for {self.timeout} s in a collective"
                    ) from None
                self._stash[(got_tag, sender)] = value
            received[src] = _unpack(*self._stash.pop((tag, src)))
        return received

    def allgather(self, t: torch.Tensor, group: Group, tag: int) -> list[torch.Tensor]:
        meta = (tuple(t.shape), t.dtype)
        got = self.exchange(group, tag, dict.fromkeys(group, t), dict.fromkeys(group, meta))
        return [got[r] for r in group]

    def allreduce(self, t: torch.Tensor, group: Group, op: str, tag: int) -> None:
        result = _combine(self.allgather(t, group, tag), op)
        if op == "avg":
            finish_avg(result, len(group))
        t.copy_(result)
