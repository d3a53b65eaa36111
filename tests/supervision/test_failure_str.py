"""str(MeshFailure): Regency's sentence, with the ``crashed_ranks=[...]`` field Monarch's shows."""

from __future__ import annotations

from regency.supervision._failure import FailureCause, MeshFailure


def _failure(ranks: tuple[int, ...]) -> MeshFailure:
    return MeshFailure("workers", "c1.p0.workers.1", ranks, FailureCause("endpoint w.f raised"))


def test_str_names_the_crashed_ranks_as_monarch_does() -> None:
    text = str(_failure((3,)))
    assert text == (
        "MeshFailure: actor mesh workers failed at rank(s) 3 (crashed_ranks=[3]), "
        "and all its descendants have failed: endpoint w.f raised"
    )
    assert "crashed_ranks=[0, 2]" in str(_failure((0, 2)))
    assert "crashed_ranks=[3]" in _failure((3,)).report()
