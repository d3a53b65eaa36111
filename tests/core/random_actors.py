"""Actor classes for tests/core/test_random_state.py (importable by child procs)."""

from __future__ import annotations

import os
import random
import sys
from typing import Any

from regency.actor import Actor, endpoint


class RandomDraws(Actor):
    """Reports this proc's random state as it found it: seeds and first draws."""

    @endpoint
    def draws(self) -> dict[str, Any]:
        import numpy
        import torch

        return {
            "pid": os.getpid(),
            "torch_seed": torch.initial_seed(),
            "torch_rand": torch.rand(4).tolist(),
            "numpy": numpy.random.random(4).tolist(),
            "random": [random.random() for _ in range(4)],
            # Reseeding must not initialise CUDA (a proc that never uses it pays nothing).
            "cuda_initialized": torch.cuda.is_initialized(),  # type: ignore[no-untyped-call]
        }

    @endpoint
    def imported(self, names: list[str]) -> dict[str, bool]:
        return {name: name in sys.modules for name in names}
