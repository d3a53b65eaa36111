"""``grad_generator``: gradients one parameter at a time, for interleaving with reductions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch


def grad_generator(
    roots: Any = (), with_respect_to: Sequence[Any] = (), grad_roots: Any = ()
) -> Iterator[Any]:
    """Yield the gradient of ``roots`` with respect to each of ``with_respect_to``, in order.

    Issues the whole backward on the first ``next()`` (it runs asynchronously on the mesh),
    then hands out one gradient per step, so reductions issued between steps overlap with it.
    """
    roots_l = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    wrt = list(with_respect_to)
    grads_in = [grad_roots] if isinstance(grad_roots, torch.Tensor) else list(grad_roots)
    if not wrt:
        return
    grads = torch.autograd.grad(roots_l, wrt, grad_outputs=grads_in or None, allow_unused=True)
    yield from grads
