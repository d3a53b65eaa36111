"""A real single-node SLURM cluster for the job tests (installed with apt when root and
missing; the tests that need it skip with the reason otherwise)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from regency.testing import SlurmCluster, SlurmUnavailable, slurm_cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    try:
        cm = slurm_cluster()
        cluster = cm.__enter__()
    except SlurmUnavailable as exc:
        pytest.skip(f"no SLURM cluster: {exc}")
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf  # SlurmJob runs sbatch/squeue/scancel
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cm.__exit__(None, None, None)
