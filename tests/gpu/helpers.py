"""Functions and actors the GPU tests run in procs (importable there by path)."""

from __future__ import annotations

from typing import Any

from regency.actor import Actor, endpoint


def device_of(t: Any) -> str:
    """Where a worker holds ``t`` (a remote function: returns a plain string)."""
    return str(t.device)


def as_cuda(t: Any) -> Any:
    """A remote function returning a CUDA tensor (fetched, it arrives on the CPU)."""
    return t.cuda() * 2


def nccl_allreduce(t: Any, port: int) -> Any:
    """NCCL in a worker, world size 1 (NCCL refuses two ranks on one GPU): all-reduce ``t``."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True,
                          timeout=datetime.timedelta(seconds=30))
    pg = dist.ProcessGroupNCCL(store, 0, 1)
    out = t.clone()
    pg.allreduce([out]).wait()
    pg.shutdown()
    return out


class Echo(Actor):
    """Takes and returns values as endpoint arguments and replies."""

    @endpoint
    def describe(self, value: Any) -> tuple[str, float, bool]:
        """The device, sum and requires_grad of a tensor argument."""
        return str(value.device), float(value.double().sum()), bool(value.requires_grad)

    @endpoint
    def twice(self, value: Any) -> Any:
        return value * 2

    @endpoint
    def make(self, n: int, device: str) -> Any:
        import torch

        return torch.arange(n, dtype=torch.float32, device=device)


def comm_paths(t: Any) -> dict[str, str]:
    """For each group this worker reduced CUDA tensors over: "nccl" or "gloo" (staged)."""
    from regency._tensor_engine import _worker

    worker = _worker._running
    assert worker is not None
    nccl = getattr(worker.comm, "nccl", {})
    return {".".join(map(str, g)): "gloo" if pg is None else "nccl" for g, pg in nccl.items()}


def fail_on_rank_one(t: Any) -> Any:
    """A CUDA tensor on every rank but 1, where it raises."""
    from regency._tensor_engine import current_worker_rank

    if current_worker_rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    return t.cuda() + 1
