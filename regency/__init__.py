"""Regency: a single-controller actor runtime for distributed PyTorch.

User code imports :mod:`regency.actor` (Monarch's names); :func:`configure` selects
transports and limits.
"""

from .config import configure

__version__ = "0.1.0"
__all__ = ["configure"]
