"""A parameter server over RDMA buffers: workers pull weights with ``read_into`` and push
gradients with ``write_from``; only small handles travel in actor messages.

One proc holds the weights of a small MLP and one gradient slot per worker, each registered as
an ``RDMABuffer``. Each worker, in a proc of its own, pulls the current weights straight into
its model's parameter vector, computes a gradient on its own data shard, and writes it into its
slot on the server; the server then averages the slots and takes an SGD step. Runs on CPU in a
few seconds; the printed loss falls. ``python examples/parameter_server.py``
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from regency.actor import Actor, ActorMesh, current_rank, endpoint, this_host
from regency.rdma import RDMABuffer

WORKERS = 2
STEPS = 30
FEATURES = 16


def make_model() -> nn.Module:
    torch.manual_seed(0)  # every copy starts identical; the server's weights win anyway
    return nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The 1-D uint8 view of a contiguous tensor that RDMABuffer and transfers take."""
    return t.view(torch.uint8).flatten()


class ParameterServer(Actor):
    def __init__(self, workers: int, lr: float) -> None:
        self.weights = parameters_to_vector(make_model().parameters()).detach().clone()
        self.grads = torch.zeros(workers, self.weights.numel())
        self.lr = lr
        # Registered once, without copying: peers read and write these tensors in place.
        self.weights_buf = RDMABuffer(as_bytes(self.weights))
        self.grad_bufs = [RDMABuffer(as_bytes(self.grads[w])) for w in range(workers)]

    @endpoint
    def handles(self) -> tuple[RDMABuffer, list[RDMABuffer]]:
        return self.weights_buf, self.grad_bufs

    @endpoint
    def step(self) -> None:
        """Average the gradients the workers wrote into their slots; one SGD step."""
        self.weights -= self.lr * self.grads.mean(dim=0)


class Worker(Actor):
    def __init__(self, ps: ActorMesh[ParameterServer]) -> None:
        self.weights_buf, grad_bufs = ps.handles.call_one().get()
        rank = current_rank().rank
        self.grad_buf = grad_bufs[rank]
        self.model = make_model()
        self.local = parameters_to_vector(self.model.parameters()).detach().clone()
        # This worker's shard of a fixed regression task: y = tanh(x . w / 4) + noise.
        g = torch.Generator().manual_seed(1 + rank)
        w_true = torch.linspace(-1, 1, FEATURES)
        self.x = torch.randn(512, FEATURES, generator=g)
        self.y = torch.tanh(self.x @ w_true / 4).unsqueeze(1) + 0.05 * torch.randn(512, 1, generator=g)

    @endpoint
    def train_step(self) -> float:
        self.weights_buf.read_into(as_bytes(self.local)).get()  # pull the current weights
        vector_to_parameters(self.local, self.model.parameters())
        self.model.zero_grad()
        loss = nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        grad = parameters_to_vector(p.grad for p in self.model.parameters())  # type: ignore[misc]
        self.grad_buf.write_from(as_bytes(grad)).get()  # push the gradient into our slot
        return loss.item()


def main() -> None:
    t0 = time.perf_counter()
    server_proc = this_host().spawn_procs(per_host={"procs": 1})
    worker_procs = this_host().spawn_procs(per_host={"procs": WORKERS})
    ps = server_proc.spawn("ps", ParameterServer, WORKERS, 0.1)
    workers = worker_procs.spawn("workers", Worker, ps)
    weights, _ = ps.handles.call_one().get()
    print(f"{weights.size():,} bytes of weights, moved by the {weights.backend} backend")
    for step in range(STEPS):
        losses = workers.train_step.call().get().values()
        ps.step.call_one().get()
        if step % 5 == 0 or step == STEPS - 1:
            print(f"step {step:3d}  loss {sum(losses) / len(losses):.4f}")
    workers.stop().get()
    ps.stop().get()
    worker_procs.stop().get()
    server_proc.stop().get()
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
