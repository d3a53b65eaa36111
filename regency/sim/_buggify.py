"""Buggify: adversarial settings a simulated run may switch on, drawn from its seed.

After FoundationDB's BUGGIFY. Production code is written for its defaults (a 10 s delivery
timeout, acknowledgements every 64 frames or 50 ms, a second between heartbeats); bugs hide in
the corners those defaults never reach. A buggified run shrinks timeouts and changes how often
the delivery layer acknowledges, so that reconnects, resends, stall detection, false
suspicion of slow procs and stop timeouts all happen far more often than they would. The
program must still work (or fail with clean errors), and every run is still checked against
the invariants (:mod:`._invariants`).

Whether a run is buggified, and which points are on, comes from the seed: for the same seed,
the same choices. ``simulate(..., buggify=None)`` (the default) switches buggify on for about
half of the seeds; ``True`` or ``False`` force it. When on, each point is switched on with
probability 1/4 (so runs differ in which corners they explore) and takes one of its values.
Every choice is recorded in the run's trace as a ``buggify`` event.

The points are knobs the core exposes anyway: configuration keys (applied for the run with
:func:`regency.core._config.overridden`), the delivery layer's acknowledgement cadence
(``Environment.ack_every`` and ``Environment.ack_delay``), and the simulated network's connect timeout.
No ``if sim:`` in the core.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import attrs

from ._clock import Trace

if TYPE_CHECKING:
    from ..core._environment import Environment

#: name -> the values it may take when switched on. Configuration keys are set for the whole
#: run; heartbeat_timeout is tied to heartbeat_interval so that it stays several ticks long.
_CONFIG_POINTS: dict[str, tuple[float, ...]] = {
    "delivery_timeout": (1.0, 3.0),
    "spawn_timeout": (5.0,),
    "stop_timeout": (0.2, 1.0),
    "cleanup_timeout": (0.05,),
    "heartbeat_interval": (0.25,),
}
_RUNTIME_POINTS: dict[str, tuple[float, ...]] = {
    "ack_every": (1, 2, 5),
    "ack_delay": (0.0, 0.5, 3.0),
}
_NETWORK_POINTS: dict[str, tuple[float, ...]] = {
    "connect_timeout": (0.05, 5.0),
}
#: Chance that buggify is on for a seed (``buggify=None``), and that a point is on.
P_RUN = 0.5
P_POINT = 0.25


@attrs.frozen
class Buggify:
    """What one run switched on (empty when buggify is off)."""

    config: dict[str, float] = attrs.field(factory=dict)
    runtime: dict[str, float] = attrs.field(factory=dict)
    network: dict[str, float] = attrs.field(factory=dict)

    @property
    def on(self) -> bool:
        return bool(self.config or self.runtime or self.network)

    def describe(self) -> str:
        points = {**self.config, **self.runtime, **self.network}
        if not points:
            return "buggify off"
        return "buggify: " + ", ".join(f"{k}={v:g}" for k, v in sorted(points.items()))

    def apply_to_environment(self, env: Environment) -> Environment:
        """``env`` with this run's runtime points (acknowledgement batching) applied."""
        if "ack_every" in self.runtime:
            env = attrs.evolve(env, ack_every=int(self.runtime["ack_every"]))
        if "ack_delay" in self.runtime:
            env = attrs.evolve(env, ack_delay=self.runtime["ack_delay"])
        return env

    @classmethod
    def draw(cls, rng: random.Random, enabled: bool | None, trace: Trace | None) -> Buggify:
        """Decide, from ``rng``, whether this run is buggified and which points are on."""
        if enabled is None:
            enabled = rng.random() < P_RUN
        if not enabled:
            return cls()
        chosen: list[dict[str, float]] = []
        for points in (_CONFIG_POINTS, _RUNTIME_POINTS, _NETWORK_POINTS):
            picked: dict[str, float] = {}
            for name, values in points.items():  # insertion order: deterministic
                if rng.random() < P_POINT:
                    picked[name] = values[rng.randrange(len(values))]
            chosen.append(picked)
        config, runtime, network = chosen
        if "heartbeat_interval" in config:
            config["heartbeat_timeout"] = 6 * config["heartbeat_interval"]
        result = cls(config, runtime, network)
        if trace is not None:
            trace.record_event("buggify", result.describe())
        return result
