"""``proc_mesh.logging_option(level=...)`` sets the procs' root logger level, with log
forwarding on or off (as Monarch's does)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from regency.actor import this_host

from .actors import FileLogger

T = 30


@pytest.mark.slow
def test_level_applies_without_forwarding(tmp_path: Path) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        loggers = procs.spawn("file_logger", FileLogger, str(tmp_path / "log"))
        loggers.slice(gpus=0).log.call_one(logging.INFO, "before").get(T)  # WARNING: dropped
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            procs.logging_option(level=logging.INFO).get(T)
        assert any("The level still applies" in str(w.message) for w in seen)
        loggers.log.call(logging.INFO, "after").get(T)
        procs.logging_option(
            stream_to_client=False, aggregate_window_sec=None, level=logging.ERROR
        ).get(T)
        loggers.slice(gpus=1).log.call_one(logging.WARNING, "too low now").get(T)
    finally:
        procs.stop().get(T)
    lines = sorted((tmp_path / "log").read_text().splitlines())
    assert lines == [
        f"[actor=<tests.compat.actors.FileLogger file_logger{{'gpus': {i}/2}}>] after"
        for i in range(2)
    ]
