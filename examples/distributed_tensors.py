"""Monarch's ``docs/source/examples/distributed_tensors.py`` on Regency, on CPU.

Changes from Monarch's version, and nothing else: ``monarch`` is ``regency``; ``"cuda"`` is
gone; sizes are cut to fit a 2-core machine (4 procs; the 4x4 "remote" mesh is the same four
procs viewed as 2x2; the search for the largest batch stops at 16 rows of 1 Mi floats);
``monarch.Simulator`` (a trace simulator, not part of the tensor engine) is replaced by running
the DDP step for real and printing a parameter. Run: ``python examples/distributed_tensors.py``.
"""

# Monarch's code is kept as written, unannotated zips and all.
# ruff: noqa: B905, B007

import torch
import torch.nn as nn

import regency
from regency.actor import this_host

# %%
# Meshes: all computation is done on a mesh of processes.

mesh = this_host().spawn_procs({"gpu": 4})
print(mesh.to_table())

# %%
# Without a mesh active, torch runs locally.

torch.rand(3, 4)

# %%
# Once active, torch runs on every proc in the mesh.

with mesh.activate():
    t = torch.rand(3, 4)

print(t)

# %%
# Inspect moves rank 0's copy of t to the controller for debugging.

regency.inspect(t)
regency.show(t)

# %%
# Providing coordinates lets us inspect other ranks' copies.

regency.show(t, gpu=1)

# %%
# Tensor commands: any command done on the controller runs on all of the tensors.

with mesh.activate():
    obj = t @ t.T
    regency.show(obj)

# %%
# If a command fails, the workers stay alive and can execute future commands:

try:
    with mesh.activate():
        # too big
        big_w = torch.rand(4, 1024 * 1024 * 1024 * 1024 * 8)
        v = t @ big_w
        regency.show(v)

except Exception:
    import traceback

    traceback.print_exc()

del big_w
print("RECOVERED!")

# %%
# Since the workers recover from errors, you can search for what works:

N = 1
while N <= 16:
    try:
        with mesh.activate():
            batch = torch.rand(N, 1024 * 1024)
        regency.inspect(batch.sum())
        N = 2 * N
        print(f"at least {N} rows work")
    except Exception:
        print(f"max is {N} rows")
        break

# %%
# Collectives: each proc has its own copy of a tensor; reductions compute across the mesh.

with mesh.activate():
    a = torch.rand(3, 4)
    r = a.reduce("gpu", "sum")

regency.show(a, gpu=0)
regency.show(a, gpu=1)

regency.show(r, gpu=0)
regency.show(r, gpu=1)

# %%
# More dims (Monarch spawns a 4x4 mesh here; on 2 cores we view our 4 procs as 2x2).

remote_mesh = mesh.split(gpu=("host", "gpu"), host=2)

print(remote_mesh.to_table())
with remote_mesh.activate():
    eg = torch.rand(3, 4)
    rgpu = eg.reduce("gpu", "sum")
    rhost = eg.reduce("host", "sum")

# %%
# Meshes can be renamed and reshaped to fit the parallelism desired.

mesh_2d_parallel = remote_mesh.rename(host="dp", gpu="tp")
print(mesh_2d_parallel.to_table())

mesh_3d_parallel = remote_mesh.split(host=("dp", "pp"), gpu=("tp",), pp=2)
print(mesh_3d_parallel.to_table())

# %%
# Pipelining: slice the mesh, and copy tensors from one slice to another.

pipeline_mesh = remote_mesh.rename(host="pp")
meshes = [pipeline_mesh.slice(pp=i) for i in range(pipeline_mesh.size("pp"))]

print(meshes[0].to_table())

layers_per_stage = 2
stages = []
for stage_mesh in meshes:
    with stage_mesh.activate():
        layers = []
        for _ in range(layers_per_stage):
            layers.extend([nn.Linear(4, 4), nn.ReLU()])
        stages.append(nn.Sequential(*layers))


def forward_pipeline(x):
    with torch.no_grad():
        for stage_mesh, stage in zip(meshes, stages):
            x = x.to_mesh(stage_mesh)
            with stage_mesh.activate():
                x = stage(x)
        return x


with meshes[0].activate():
    input = torch.rand(3, 4)

output = forward_pipeline(input)
regency.show(output)
print(output.mesh.to_table())

# %%
# DDP: interleave the backward pass with the gradient reductions and parameter updates;
# grad_generator hands out the gradients one parameter at a time.


def train(model, input, target):
    loss = model(input, target)
    rparameters = list(reversed(list(model.parameters())))
    grads = regency.grad_generator(loss, rparameters)
    with torch.no_grad():
        it = iter(zip(rparameters, grads))
        todo = next(it, None)
        while todo is not None:
            param, grad = todo
            grad.reduce_("dp", "sum")
            todo = next(it, None)
            param += 0.01 * grad


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        layers = []
        for x in range(8):
            layers.append(nn.Linear(4, 4))
            layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, input, target):
        output = self.layers(input)
        return torch.nn.functional.cross_entropy(output, target)


def run_ddp():
    dp_mesh = mesh.rename(gpu="dp")
    with dp_mesh.activate():
        model = Net()
        train(model, torch.rand(3, 4), torch.full((3,), 1, dtype=torch.int64))
    regency.show(model.layers[0].bias)


run_ddp()

# %%
# Overlapping comms and compute: streams. The main stream runs computation in order; a
# comms stream runs communication (on a GPU, in parallel). To use a tensor on another stream,
# borrow it: the origin cannot use it until borrow.drop().

main = regency.get_active_stream()
comms = regency.Stream("comms")


def train(model, input, target):  # noqa: F811 (Monarch's example redefines it)
    loss = model(input, target)
    rparameters = list(reversed(list(model.parameters())))
    grads = regency.grad_generator(loss, rparameters)
    with torch.no_grad():
        it = iter(
            (param, grad, *comms.borrow(grad, mutable=True))
            for param, grad in zip(rparameters, grads)
        )

        todo = next(it, None)
        while todo is not None:
            param, grad, comm_grad, borrow = todo
            with comms.activate():
                comm_grad.reduce_("dp", "sum")
            borrow.drop()
            todo = next(it, None)
            param += 0.01 * grad


run_ddp()


def train(model, input, target):  # noqa: F811
    loss = model(input, target)
    rparameters = list(reversed(list(model.parameters())))
    grads = regency.grad_generator(loss, rparameters)
    with torch.no_grad():
        it = iter(
            (param, grad, *comms.borrow(grad, mutable=True))
            for param, grad in zip(rparameters, grads)
        )

        todo = next(it, None)
        while todo is not None:
            param, grad, comm_grad, borrow = todo
            with comms.activate():
                comm_grad.reduce_("dp", "sum")
            todo = next(it, None)
            # delay the borrow as late as possible
            borrow.drop()
            param += 0.01 * grad


run_ddp()
print("DONE")
