"""The invariants every simulated run is checked against, whatever its faults.

:class:`InvariantChecker` is installed as the :class:`~regency.core._probe.Probe` of every
runtime of a simulated cluster, so it sees what the production delivery and supervision code
decide, as they decide it. It checks:

1. **No frame is handled twice** (so no endpoint runs twice for one send), and
2. **per-pair order**: the frames of each delivery session (one sender to one receiver) are
   handed on as 0, 1, 2, ... with nothing skipped;
3. **no hang**: every frame sent is handled, or its session fails (and with it every call
   waiting on that proc), within a bound derived from the configuration (two spawn timeouts,
   two delivery timeouts and a few heartbeat ticks);
4. **each failed actor's owner is told exactly once**: never twice, and, for actors on a proc
   that crashed, at least once when the owner outlives the run;
5. at the end, **no simulated proc is left** once the controller stopped its procs, and no
   reply port still waits on a proc.

1 to 4 (the "never twice" half) are checked as the run goes; the rest by :meth:`finish` after
the program returns, with fault injection stopped, partitions healed, and time for the
failure reports to arrive. Violations raise :class:`InvariantViolation` naming the seed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import trio

from ..core._probe import Probe
from ..supervision import ROOT, MeshFailure

if TYPE_CHECKING:
    from ..core._runtime import Runtime
    from ._cluster import SimCluster


class InvariantViolation(AssertionError):
    """A simulated run broke one of the runtime's guarantees (see :mod:`._invariants`)."""


@attrs.define
class _InFlight:
    sender: str
    to: str
    #: Virtual time the checker first saw it in flight (stamped by the watch task).
    seen: float | None = None


@attrs.frozen
class _Orphan:
    """An actor that lived on a proc when the proc crashed."""

    mesh_key: str
    mesh_name: str
    rank: int
    owner_address: str
    owner_key: str


@attrs.define
class _Crash:
    proc_id: str
    at: float
    orphans: list[_Orphan]


class InvariantChecker(Probe):
    """Checks the invariants of one simulated cluster (see the module docstring)."""

    #: Seconds between scans for frames in flight too long.
    SCAN = 1.0

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.violations: list[str] = []
        #: Frames sent and not yet handled, by session, by index.
        self._in_flight: dict[str, dict[int, _InFlight]] = {}
        #: The index each session's next handled frame must have.
        self._next: dict[str, int] = {}
        #: Sessions each runtime sends on (dropped with the runtime).
        self._sessions_of: dict[int, list[str]] = {}
        #: How often each (mesh key, rank) failure was reported to an owner.
        self._told: dict[tuple[str, int], int] = {}
        self._crashes: list[_Crash] = []
        #: Set once the run is winding down: kills from then on are the shutdown's.
        self.stopping = False
        self._bound: float | None = None

    # -- probe ---------------------------------------------------------------------------

    def frame_sent(self, rt: Runtime, address: str, session: str, index: int) -> None:
        frames = self._in_flight.get(session)
        if frames is None:
            frames = self._in_flight[session] = {}
            self._sessions_of.setdefault(id(rt), []).append(session)
        frames[index] = _InFlight(rt.proc_id, address)

    def frame_handled(self, rt: Runtime, session: str, index: int) -> None:
        expected = self._next.get(session, 0)
        if index != expected:
            if index < expected:
                what = f"was handled twice (frames up to #{expected - 1} were handled before)"
            else:
                what = f"was handled before #{expected}..#{index - 1} (order broken or frames lost)"
            self._violate(f"frame #{index} of delivery session {session} at {rt.proc_id} {what}")
        self._next[session] = max(expected, index + 1)
        frames = self._in_flight.get(session)
        if frames is not None:
            frames.pop(index, None)

    def session_failed(self, rt: Runtime, address: str, session: str) -> None:
        self._in_flight.pop(session, None)

    def owner_told(self, rt: Runtime, owner: str | None, failure: MeshFailure) -> None:
        for rank in failure.ranks:
            key = (failure.mesh_key, rank)
            count = self._told[key] = self._told.get(key, 0) + 1
            if count == 2:
                self._violate(
                    f"the owner of actor mesh {failure.mesh_name} ({failure.mesh_key}) was told "
                    f"twice that rank {rank} failed (now at {rt.proc_id}: {failure})"
                )

    # -- what the cluster reports --------------------------------------------------------

    def proc_crashed(self, rt: Runtime) -> None:
        """``rt``'s proc is being killed; remember whose actors died with it."""
        if self.stopping:
            return
        orphans = [
            _Orphan(cell.key, cell.name, cell.point.rank, cell.owner[0], cell.owner[1])
            for cell in rt.actors.values()
        ]
        self._crashes.append(_Crash(rt.proc_id, trio.current_time(), orphans))

    def proc_exited(self, rt: Runtime) -> None:
        """``rt`` is gone: what it had in flight will never be delivered, by design."""
        for session in self._sessions_of.pop(id(rt), ()):
            self._in_flight.pop(session, None)

    # -- checks --------------------------------------------------------------------------

    def _violate(self, message: str) -> None:
        # Every caller runs on the simulation's loop (probe hooks but frame_sent, the scans).
        self.violations.append(f"t={trio.current_time():.6f}: {message}")

    def bound(self) -> float:
        """Virtual seconds within which a frame is handled or its session fails."""
        if self._bound is None:
            assert self.cluster.controller is not None
            config = self.cluster.controller.config
            self._bound = (
                2 * config.spawn_timeout
                + 2 * config.delivery_timeout
                + 3 * config.heartbeat_interval
                + self.cluster.network.connect_timeout
            )
        return self._bound

    def frames_in_flight(self) -> bool:
        """Whether a frame was sent and neither handled nor failed yet."""
        return any(self._in_flight.values())

    async def watch(self) -> None:
        """Flag frames that are neither handled nor failed within :meth:`bound` (a hang),
        scanning every :attr:`SCAN` seconds (a periodic job of the cluster's ticker)."""
        await self.cluster.ticker.every(lambda: self.SCAN, self.scan, owner=self, kind="scan")

    def scan(self, now: float) -> None:
        bound = self.bound()
        for session, frames in list(self._in_flight.items()):
            for index, frame in frames.items():
                if frame.seen is None:
                    frame.seen = now
                elif now - frame.seen > bound:
                    self._violate(
                        f"frame #{index} of delivery session {session} from "
                        f"{frame.sender} to {frame.to} was neither handled nor failed "
                        f"within {bound:.0f} s (a hang)"
                    )
                    del self._in_flight[session]
                    break

    def _owner_alive(self, orphan: _Orphan) -> bool:
        cluster = self.cluster
        if cluster.controller is not None and orphan.owner_address == cluster.controller.address:
            rt: Runtime | None = cluster.controller
        else:
            proc = cluster.procs.get(orphan.owner_address)
            rt = proc.rt if proc is not None and not proc.crashed else None
        if rt is None:
            return False
        return orphan.owner_key == ROOT or orphan.owner_key in rt.actors

    def _untold(self) -> list[tuple[_Crash, _Orphan]]:
        return [
            (crash, orphan)
            for crash in self._crashes
            for orphan in crash.orphans
            if (orphan.mesh_key, orphan.rank) not in self._told and self._owner_alive(orphan)
        ]

    async def finish(self) -> None:
        """After the program: let failure reports arrive, stop every proc, check the end state.

        The caller has stopped fault injection and healed the network.
        """
        cluster = self.cluster
        rt = cluster.controller
        assert rt is not None
        config = rt.config
        net = cluster.network
        # Reports of crashes travel on links that may still be clogged or paused.
        quiet = max(
            [trio.current_time(), *net._clogs.values()]
            + [getattr(p.transport, "paused_until", -math.inf) for p in cluster.procs.values()]
        )
        patience = 2 * config.delivery_timeout + config.heartbeat_timeout + net.connect_timeout
        deadline = quiet + patience + 1.0
        while self._untold() and trio.current_time() < deadline:
            await trio.sleep(0.5)
        for crash, orphan in self._untold():
            self._violate(
                f"proc {crash.proc_id} crashed at t={crash.at:.6f}, but the owner of actor "
                f"mesh {orphan.mesh_name} ({orphan.mesh_key}) was never told that rank "
                f"{orphan.rank} failed, though it is alive"
            )
        # Stop what is left, as a program's exit does, and check that nothing remains.
        self.stopping = True
        from ..core._children import _stop_procs
        from ..core._future import Future

        running = [a for a, c in rt.children.items() if c.returncode is None]
        if running:
            await _stop_procs(rt, running, Future())
        with trio.move_on_after(config.stop_timeout + patience):
            while cluster.procs:
                await trio.sleep(0.1)
        if cluster.procs:
            self._violate(
                f"{len(cluster.procs)} simulated proc(s) still run after the controller stopped "
                f"its procs: {', '.join(list(cluster.procs)[:5])}"
            )
        waiting = [
            f"port {port_id} (waits on {', '.join(sorted(handler.dests))})"
            for port_id, handler in rt.ports.items()
            if handler.dests
        ]
        if waiting:
            self._violate(
                f"{len(waiting)} reply port(s) of the controller still wait on procs that are "
                f"gone (calls that never ended): {'; '.join(waiting[:5])}"
            )

    def raise_if_violated(self, replay: str) -> None:
        if self.violations:
            shown = "\n  ".join(self.violations[:20])
            more = len(self.violations) - 20
            raise InvariantViolation(
                f"{len(self.violations)} invariant violation(s):\n  {shown}"
                + (f"\n  ... and {more} more" if more > 0 else "")
                + f"\nreplay: {replay}"
            )

