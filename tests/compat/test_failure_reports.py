"""Failure reports carry the facts Monarch's carry: which actor (class, mesh, coordinates with
sizes) failed with all its descendants, and how its proc died."""

from __future__ import annotations

import pytest

from regency.actor import this_host

from ..conftest import RootFailures
from .actors import Parent

T = 30


@pytest.mark.slow
def test_a_killed_grandchild_is_named_with_its_coordinates(roots: RootFailures) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        parent = procs.spawn("parent", Parent)
        parent.kill_child.call_one(1).get(T)
        failure = roots.wait_for("parent", T)
    finally:
        procs.stop().get(T)
    report = failure.report()
    lines = report.splitlines()
    assert lines[1] == (
        "  The actor <tests.compat.actors.Parent parent{'gpus': 0/1}> and all its "
        "descendants have failed."
    ), report
    assert (
        "    The actor <tests.compat.actors.Pid nested{'a_dim': 1/2}> and all its "
        "descendants have failed." in lines
    ), report
    assert "    the process this actor was running on failed: Killed(sig=9)" in lines, report
    assert "{'a_dim': 0/2}" not in report  # the healthy rank is not reported
