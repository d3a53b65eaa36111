"""Test-wide setup: actor failures that reach the root are recorded, not fatal.

The default ``unhandled_fault_hook`` stops the program, which here would be pytest itself;
tests that check that default run a controller in a subprocess.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import regency.actor
from regency.supervision import MeshFailure

root_failures: list[MeshFailure] = []


@pytest.fixture(autouse=True, scope="session")
def _record_root_failures() -> Iterator[None]:
    regency.actor.unhandled_fault_hook = root_failures.append
    yield
