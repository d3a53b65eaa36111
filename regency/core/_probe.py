"""What a runtime lets an observer see: delivery and supervision decisions, as they happen.

A :class:`Probe` given as ``Environment.probe`` is told when a frame joins a delivery session,
when the receiver hands it on (after duplicate suppression), when a session fails for good, and
when supervision tells an owner (or the root) that actors failed. The simulator's invariant
checker (:mod:`regency.sim._invariants`) is one; a tracer could be another. Every method runs
on the runtime's trio thread, except :meth:`frame_sent`, which runs on the sending thread, and
none may raise or block. With no probe installed (production) the cost is one attribute test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..supervision import MeshFailure
    from ._runtime import Runtime


class Probe:
    """Observer hooks; this base class ignores everything."""

    def frame_sent(self, rt: Runtime, address: str, session: str, index: int) -> None:
        """Frame number ``index`` of delivery session ``session`` is on its way to ``address``."""

    def frame_handled(self, rt: Runtime, session: str, index: int) -> None:
        """``rt`` handed frame ``index`` of ``session`` to its dispatcher (at most once each)."""

    def session_failed(self, rt: Runtime, address: str, session: str) -> None:
        """``rt`` gave up delivering ``session`` to ``address``: its unacknowledged frames are
        lost, and everything waiting on that proc is failed instead."""

    def owner_told(self, rt: Runtime, owner: str | None, failure: MeshFailure) -> None:
        """Supervision in ``rt`` told ``owner`` (the actor key; None: the root hook) that the
        ranks in ``failure`` failed."""
