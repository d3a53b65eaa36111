"""Every test here needs a CUDA GPU (CI and this project's own machine have none): skipped,
saying why, where torch sees no device."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    try:
        import torch
    except ImportError:
        reason = "needs torch with a CUDA GPU (torch is not installed)"
    else:
        if torch.cuda.is_available():
            return
        reason = "needs a CUDA GPU (this machine has none; torch.cuda.is_available() is False)"
    for item in items:
        if _HERE in item.path.parents:  # (this hook sees every test of the session)
            item.add_marker(pytest.mark.skip(reason=reason))
