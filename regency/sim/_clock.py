"""Virtual time and exact replay: the trace instrument and the deterministic runner.

A simulated cluster lives inside one ``trio.run`` on ``trio.testing.MockClock(autojump_threshold=0)``:
whenever every task is blocked, virtual time jumps straight to the next deadline, so an hour of
sleeps costs microseconds of real time. Replaying a run from its seed needs three things to
be fixed, and :func:`run_deterministic` fixes all three:

* Every simulated decision (latency, faults, workload choices) is drawn from one
  ``random.Random(seed)`` that is passed in, never from the global ``random`` module.
* trio's scheduler shuffles each batch of runnable tasks with its private generator
  ``trio._core._run._r``. Seeding it is not enough on its own: the batch is built in an order
  that depends on ``id()`` (the deadline heap breaks ties by it), so
  ``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING`` must also be set. It makes trio sort
  each batch by spawn order before the seeded shuffle (trio's own Hypothesis plugin does the
  same). Both are trio internals, which is why ``pyproject.toml`` pins trio; the determinism
  tests in ``tests/sim`` are the tripwire for an upgrade that changes them.
* No real I/O, threads, ``time.time()``, ``os.urandom``, global ``random`` or iteration over
  ``id()``-ordered containers (or sets of strings, whose order depends on ``PYTHONHASHSEED``)
  inside the simulation. A real socket plus autojump makes timeouts fire at once.

A :class:`Trace` is a trio ``Instrument`` that hashes the schedule (the name of every task in
``before_task_step`` order), every random draw the network makes and every network event, and
keeps the event log. Two runs of one seed must give the same hash; :func:`check_determinism`
runs a workload twice and names the first event where they part.
"""

from __future__ import annotations

import contextvars
import hashlib
import random
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio
import trio.testing
from trio._core import _run as _trio_run


class _PerThreadRandom:
    """Stands in for trio's private scheduler generator (``trio._core._run._r``), giving each
    thread its own. A simulation seeds the one of the thread that runs it; a real runtime's
    loop on another thread of the same process (a controller next to a simulation, or the
    test suite) draws from its own and cannot perturb the simulated schedule."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _rng(self) -> random.Random:
        rng: random.Random | None = getattr(self._local, "rng", None)
        if rng is None:
            rng = self._local.rng = random.Random()
        return rng

    def __getattr__(self, name: str) -> object:
        return getattr(self._rng(), name)


if not isinstance(_trio_run._r, _PerThreadRandom):
    _trio_run._r = _PerThreadRandom()  # type: ignore[assignment]

T = TypeVar("T")

#: trio's switch that sorts each scheduler batch by spawn order before the seeded shuffle.
_DETERMINISTIC_FLAG = "_ALLOW_DETERMINISTIC_SCHEDULING"

#: Simulations that never finish (a deadlock, a task that loops forever) end after this many
#: virtual seconds instead of hanging: with autojump, the deadline is reached at once.
DEFAULT_TIMEOUT = 24 * 3600.0

_current_trace: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "regency_sim_trace", default=None
)


def current_trace() -> Trace | None:
    """The trace of the :func:`run_deterministic` run this code is in, or None outside one."""
    return _current_trace.get()


@attrs.frozen
class SimEvent:
    """One thing that happened on a simulated network, at a virtual time.

    ``kind`` is a short noun (``send``, ``deliver``, ``drop``, ``partition``, ...); ``detail``
    names what it happened to. Events compare by value, so two logs can be diffed.
    """

    time: float
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.time:.9f} {self.kind} {self.detail}"


class Trace(trio.abc.Instrument):
    """Hashes a simulated run: the schedule, every random draw and every network event.

    Install it as a trio instrument to hash the schedule (``run_deterministic`` does); the
    network feeds it draws and events through :meth:`record_draw` and :meth:`record_event`.
    ``keep_schedule`` also keeps every stepped task name, so :func:`check_determinism` can say
    where two schedules part; it costs memory proportional to the run.
    """

    def __init__(self, *, keep_schedule: bool = False) -> None:
        self.events: list[SimEvent] = []
        #: Stepped task names, in order; only filled when ``keep_schedule`` is set.
        self.schedule: list[str] = []
        self.steps = 0
        self.draws = 0
        self._keep_schedule = keep_schedule
        self._hash = hashlib.blake2b(digest_size=16)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
        self._hash.update(b"S" + task.name.encode())
        if self._keep_schedule:
            self.schedule.append(task.name)

    def record_draw(self, label: str, value: object) -> None:
        """Fold one random draw into the hash; ``label`` says what it decided."""
        self.draws += 1
        self._hash.update(f"D{label}={value!r}".encode())

    def record_event(self, kind: str, detail: str) -> SimEvent:
        """Append an event stamped with the current (virtual) time and fold it into the hash."""
        event = SimEvent(trio.current_time(), kind, detail)
        self.events.append(event)
        self._hash.update(b"E" + str(event).encode())
        return event

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def run_deterministic(
    async_fn: Callable[[random.Random], Awaitable[T]],
    seed: int,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    trace: Trace | None = None,
) -> tuple[T, str, list[SimEvent]]:
    """Run ``async_fn(random.Random(seed))`` in a fresh ``trio.run`` on virtual time.

    Returns ``(result, trace_hash, event_log)``. The same ``async_fn`` and ``seed`` give the
    same hash and log, provided the workload keeps the rules in this module's docstring and
    draws its own decisions from the generator it is given. Networks made inside pick up this
    run's :class:`Trace` through :func:`current_trace`.

    trio's scheduler is made deterministic for the duration of the run (its private generator
    seeded from ``seed``, batches sorted by spawn order) and put back as it was afterwards. A
    run still going after ``timeout`` virtual seconds (a deadlock: with autojump that costs no
    real time) is cancelled and raises :class:`TimeoutError` naming the seed; ``None`` means no
    limit, and then a deadlock hangs for real. Must not be called from inside a trio run.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of virtual seconds (got {timeout!r})")
    trace = trace if trace is not None else Trace()
    rng = random.Random(seed)
    finished = False

    async def main() -> T:
        nonlocal finished
        if timeout is None:
            result = await async_fn(rng)
            finished = True
            return result
        with trio.move_on_after(timeout):
            result = await async_fn(rng)
            finished = True
            return result
        raise TimeoutError(
            f"simulation with seed {seed} did not finish within {timeout} virtual seconds: a "
            "deadlock or a task that never ends (pass timeout=None to wait forever)"
        )

    saved_flag = getattr(_trio_run, _DETERMINISTIC_FLAG)
    saved_state = _trio_run._r.getstate()
    token = _current_trace.set(trace)
    setattr(_trio_run, _DETERMINISTIC_FLAG, True)
    # A separate stream from the workload's: seeding both with the same number would correlate
    # the schedule with the first draws of the workload.
    _trio_run._r.seed(f"regency.sim scheduler {seed}")
    try:
        result = trio.run(
            main,
            clock=trio.testing.MockClock(autojump_threshold=0),
            instruments=[trace],
        )
    finally:
        _trio_run._r.setstate(saved_state)
        setattr(_trio_run, _DETERMINISTIC_FLAG, saved_flag)
        _current_trace.reset(token)
    assert finished
    return result, trace.hexdigest(), trace.events


def check_determinism(
    async_fn: Callable[[random.Random], Awaitable[T]],
    seed: int,
    runs: int = 2,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> tuple[T, str, list[SimEvent]]:
    """Run ``async_fn`` ``runs`` times with ``seed``; raise at the first divergence.

    Compares each later run with the first: the event logs event by event, then the
    schedules step by step, then the trace hashes (which also cover the random draws). Raises
    :class:`AssertionError` naming the seed, the runs, the index and the two differing
    entries. Returns the first run's ``(result, trace_hash, event_log)``.
    """
    if runs < 2:
        raise ValueError(f"runs must be at least 2 to compare anything (got {runs})")
    first_trace = Trace(keep_schedule=True)
    first = run_deterministic(async_fn, seed, timeout=timeout, trace=first_trace)
    for run in range(2, runs + 1):
        trace = Trace(keep_schedule=True)
        _, digest, events = run_deterministic(async_fn, seed, timeout=timeout, trace=trace)
        where = f"seed {seed} is not deterministic: run {run} diverged from run 1"
        index = _first_difference(first[2], events)
        if index is not None:
            raise AssertionError(
                f"{where} at event {index}: run 1 had {_entry(first[2], index)}, "
                f"run {run} had {_entry(events, index)}"
            )
        step = _first_difference(first_trace.schedule, trace.schedule)
        if step is not None:
            raise AssertionError(
                f"{where}: the event logs agree but the schedule differs at step {step}: run 1 "
                f"stepped {_entry(first_trace.schedule, step)}, run {run} stepped "
                f"{_entry(trace.schedule, step)}"
            )
        if digest != first[1]:
            raise AssertionError(
                f"{where}: the event logs and schedules agree but the random draws differ "
                f"(trace hash {first[1]} vs {digest}; {first_trace.draws} vs {trace.draws} draws)"
            )
    return first


def _first_difference(a: list[SimEvent] | list[str], b: list[SimEvent] | list[str]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def _entry(log: list[SimEvent] | list[str], index: int) -> str:
    if index < len(log):
        return repr(str(log[index]))
    return f"nothing (its log ends after {len(log)} entries)"
