"""Exploring seeds: one program simulated on many seeds, in parallel worker processes.

:func:`explore` runs ``simulate(program, seed=s, ...)`` for each seed in worker processes
(the standard library's ``multiprocessing``, "forkserver" context where there is one, else
"spawn"), streams progress, stops after ``stop_after`` failing seeds and returns each failing
run with its replay line, its exception and the tail of its run log. With a Hypothesis
strategy of fault schedules (``fault_schedules(...)``) each seed runs under a schedule drawn
for that seed, and a failing schedule is shrunk with Hypothesis's ``find`` (as is a fixed
schedule with ``shrink=True``). ``regency sim explore MODULE:FUNCTION --seeds N`` is the same
from a shell (:func:`run_command`).

Each run is a whole simulated cluster inside one process and the runs share nothing, so the
pool is plain processes, one run at a time each: a run that kills its process costs that seed
only (the parent sees the process die and reports the seed), and stopping early kills the
processes still running seeds that are no longer needed.
"""

from __future__ import annotations

import collections
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, cast

import attrs

from ._cluster import ReplayDiverged, check_schedule, replay_line, simulate
from ._network import Faults, FaultSchedule, ScheduledFault

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext
    from multiprocessing.process import BaseProcess

    from hypothesis.strategies import SearchStrategy

__all__ = ["ExploreFailure", "ExploreResult", "explore"]

#: How many of a failing run's log entries a failure keeps.
LOG_TAIL = 20
#: The examples Hypothesis generates for one seed's schedule: the first is always the
#: simplest (no faults), the second a random one, which is the seed's schedule.
_DRAW_EXAMPLES = 3
_DRAW_INDEX = 2
#: The database key under which a fixed schedule is handed to Hypothesis to shrink.
_KEY = b"regency.sim.explore"
_RATES = ("delay", "disconnect", "partition", "clog", "crash", "pause")
_TIMES = ("at", "duration", "extra")

@attrs.frozen
class _Outcome:
    """What a worker sends back for one seed."""

    index: int
    seed: int
    seconds: float
    events: int = 0
    error: str | None = None
    error_type: str = ""
    traceback: str = ""
    log_tail: tuple[str, ...] = ()


@attrs.frozen(eq=False)
class ExploreFailure:
    """One failing run: its seed, the arguments that shaped it, what it raised, and the end
    of its run log."""

    seed: int
    #: ``"AssertionError: the backup lost acknowledged writes ['k3']"``: the exception's
    #: type and message.
    error: str
    #: The exception's type by its qualified name (``builtins.AssertionError``).
    error_type: str
    #: The formatted exception, its notes (the run log's tail, the replay line) included.
    traceback: str = attrs.field(repr=False)
    #: The last entries of the run's log (``SimResult.log``), each with its virtual time.
    log_tail: tuple[str, ...] = attrs.field(repr=False)
    #: ``simulate``'s other arguments for this run: ``hosts``, ``faults`` (the schedule this
    #: seed ran under), ``buggify``.
    arguments: Mapping[str, Any] = attrs.field(repr=False)
    program: Callable[[Any], Any] = attrs.field(repr=False)
    #: The same seed under the smallest schedule Hypothesis found that fails the same way
    #: (same exception type), when the schedule was shrunk; else None.
    shrunk: ExploreFailure | None = attrs.field(default=None, repr=False)
    #: Why no shrunk schedule is given, when shrinking was asked for and found none.
    shrink_note: str = attrs.field(default="", repr=False)

    @property
    def faults(self) -> Faults | FaultSchedule | None:
        faults: Faults | FaultSchedule | None = self.arguments.get("faults")
        return faults

    @property
    def replay_line(self) -> str:
        """``regency.sim.simulate(program, seed=..., hosts=..., faults=..., ...)``, the call
        that reruns this run (as ``SimResult.replay_line``)."""
        arguments = dict(self.arguments)
        return replay_line(self.seed, arguments.pop("hosts"), arguments)

    @property
    def program_name(self) -> str:
        """``module:function``: the program as ``regency sim explore`` takes it."""
        module = getattr(self.program, "__module__", None) or "?"
        return f"{module}:{getattr(self.program, '__qualname__', repr(self.program))}"

    @property
    def replay_command(self) -> str:
        """A shell command that reruns this run: ``python -c '...simulate(module.function,
        seed=..., ...)'`` (for a program importable from the working directory)."""
        module, _, name = self.program_name.partition(":")
        call = self.replay_line.replace("simulate(program,", f"simulate({module}.{name},", 1)
        code = f"import regency.sim, {module}; from regency.sim import *; {call}"
        if not any(c in code for c in '"$`\\!'):
            return f'python -c "{code}"'
        return f"python -c {shlex.quote(code)}"

    def replay(self) -> None:
        """Run it again: raises the failure's exception, as ``simulate`` does. A run that
        passes this time raises :class:`ReplayDiverged`."""
        simulate(self.program, seed=self.seed, **self.arguments)
        raise ReplayDiverged(
            f"{self.replay_line} passed when run again; it failed with {self.error}. The "
            "program depends on something the simulation does not control (the global random "
            "module, time.time(), state it keeps between runs), or its code changed"
        )

    def describe(self, *, log: int = 5) -> str:
        """A few lines for a report: the seed and error, the replay line, the shrunk
        schedule's replay line, and the last ``log`` log entries."""
        lines = [f"seed {self.seed}: {_first_lines(self.error)}", f"  replay: {self.replay_line}"]
        if self.shrunk is not None:
            lines.append(f"  shrunk: {self.shrunk.replay_line}")
            if self.shrunk.error_type != self.error_type or self.shrunk.error != self.error:
                lines.append(f"          ({_first_lines(self.shrunk.error)})")
        elif self.shrink_note:
            lines.append(f"  not shrunk: {self.shrink_note}")
        if log and self.log_tail:
            lines.append(f"  run log (last {min(log, len(self.log_tail))}):")
            lines += ["    " + entry.replace("\n", "\n      ") for entry in self.log_tail[-log:]]
        return "\n".join(lines)


@attrs.frozen
class ExploreResult:
    """What :func:`explore` returns: the failing runs (in seed order) and what was run."""

    failures: tuple[ExploreFailure, ...]
    #: Seeds run to the end (failing or not).
    runs: int
    #: Seeds asked for (None for an iterable without a length).
    total: int | None
    #: Real seconds spent running seeds (shrinking not included).
    seconds: float
    #: Worker processes (0: the seeds ran in the calling process).
    workers: int
    #: True when ``stop_after`` failures ended the exploration before every seed ran.
    stopped: bool = False
    #: Simulated events of the runs that passed.
    events: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def seeds_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        total = f" of {self.total}" if self.total is not None else ""
        count = len(self.failures)
        head = (
            f"explored {self.runs}{total} seeds in {self.seconds:.1f} s "
            f"({self.seeds_per_second:.1f} seeds/s, {self.workers or 'no'} worker"
            f"{'' if self.workers == 1 else 's'}): "
            + ("no failures" if not count else f"{count} failure{'' if count == 1 else 's'}")
            + (" (stopped early)" if self.stopped else "")
        )
        return "\n".join([head, *(failure.describe() for failure in self.failures)])

    def __str__(self) -> str:
        return self.summary()


def explore(
    program: Callable[[Any], Any],
    seeds: Iterable[int] = range(100),
    *,
    hosts: int = 4,
    faults: Faults | FaultSchedule | SearchStrategy[FaultSchedule] | None = None,
    buggify: bool | None = False,
    workers: int | None = None,
    stop_after: int | None = 1,
    progress: Callable[[int, int | None, int], object] | bool | None = None,
    shrink: bool | None = None,
    shrink_seconds: float = 60.0,
) -> ExploreResult:
    """Run ``simulate(program, seed=s, hosts=hosts, faults=..., buggify=buggify)`` for each
    seed ``s`` of ``seeds`` in ``workers`` worker processes (default: ``os.cpu_count()``;
    ``0`` runs them in this process, one after another), and return the runs that failed.

    A run fails when ``simulate`` raises: an :class:`InvariantViolation`, or the program's
    own exception (an ``assert``, an actor's error it did not catch); a run that kills its
    worker process fails as ``WorkerDied``. ``program`` must be importable by
    reference (a function defined at the top level of a module), since the workers import
    it; a lambda, a nested function or a function of a notebook's ``__main__`` is refused
    with ``TypeError`` saying how to fix it.

    ``faults`` is passed to every run as it is, except a Hypothesis strategy of schedules
    (:func:`fault_schedules`): then each seed runs under a schedule Hypothesis draws for that
    seed (the same one every time), and a failing one is shrunk (below).

    ``stop_after`` failures end the exploration (``None`` or ``0``: run every seed); the
    failures returned are the first ``stop_after`` failing seeds in the order of ``seeds``,
    whatever the number of workers. ``progress``: ``None`` draws a progress line on stderr
    when stderr is a terminal; a callable gets ``(done, total, failures)`` after each run
    (``total`` is None for an iterable without a length); ``False`` shows nothing.

    Shrinking (``shrink=None``: when ``faults`` is a strategy; ``shrink=True`` also shrinks a
    fixed ``Faults`` or ``FaultSchedule``): for each failing seed, Hypothesis's ``find``
    looks, with the seed fixed, for the smallest schedule on which the program fails with
    the same exception type: fewer explicit faults, earlier and shorter ones, lower random
    rates. A strategy's failing schedule is shrunk in the strategy's own terms (Hypothesis
    generates that seed's schedule again, then shrinks it); a fixed one by dropping its
    faults and moving each time, duration, extra delay and rate toward zero. Each failure
    gets the result as ``shrunk`` (a failure of its own, with its replay line). Shrinking
    runs in this process, at most ``shrink_seconds`` per failure.
    """
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 0:
        raise TypeError(f"hosts must be a number of simulated hosts (got {hosts!r})")
    if buggify not in (True, False, None):
        raise TypeError(f"buggify must be True, False or None (the seed decides); got {buggify!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 0):
        raise TypeError(f"workers must be a number of processes >= 0 or None (got {workers!r})")
    if stop_after is not None and (isinstance(stop_after, bool)
                                   or not isinstance(stop_after, int) or stop_after < 0):
        raise TypeError(
            f"stop_after must be a number of failures >= 0 or None (got {stop_after!r})"
        )
    strategy = cast("SearchStrategy[FaultSchedule]", faults) if _is_strategy(faults) else None
    fixed: Faults | FaultSchedule | None = None
    if strategy is None:
        if faults is not None and not isinstance(faults, Faults | FaultSchedule):
            raise TypeError(
                "faults must be a Faults, a FaultSchedule, a Hypothesis strategy of schedules "
                f"(regency.sim.fault_schedules(...)) or None (got {faults!r})"
            )
        fixed = faults
        check_schedule(fixed, hosts)
    if shrink is None:
        shrink = strategy is not None
    if shrink and strategy is None and fixed is None:
        raise ValueError("shrink=True shrinks a fault schedule, and faults is None")
    if not callable(program):
        raise TypeError(f"program must be a function of the host mesh (got {program!r})")
    total = len(seeds) if hasattr(seeds, "__len__") else None  # type: ignore[arg-type]
    count = (os.cpu_count() or 1) if workers is None else workers
    if total is not None and count:
        count = max(1, min(count, total))
    payload = _pickled(program) if count else b""

    def tasks() -> Iterator[tuple[int, int, Faults | FaultSchedule | None]]:
        for index, seed in enumerate(seeds):
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise TypeError(f"seeds must be ints (got {seed!r})")
            yield index, seed, (_draw(strategy, seed) if strategy is not None else fixed)

    shown = _Progress(progress, total)
    explorer = _Explorer(program, payload, count, hosts, buggify, stop_after or None, shown)
    start = time.perf_counter()
    try:
        explorer.run(tasks())
    finally:
        shown.close()
    seconds = time.perf_counter() - start
    failures = []
    for index in explorer.failing_indices():
        outcome, schedule = explorer.failing[index]
        failure = _failure(program, outcome, hosts, schedule, buggify)
        if shrink and schedule is not None:
            shown.note(f"shrinking the fault schedule of seed {outcome.seed} ...")
            failure = _shrunk(failure, strategy, shrink_seconds)
        failures.append(failure)
    return ExploreResult(
        tuple(failures), explorer.done, total, seconds, count,
        stopped=explorer.stopped, events=explorer.events,
    )


# -- running seeds ----------------------------------------------------------------------


class _Explorer:
    """Hands seeds to workers in order, one at a time each, and collects their outcomes."""

    def __init__(
        self,
        program: Callable[[Any], Any],
        payload: bytes,
        workers: int,
        hosts: int,
        buggify: bool | None,
        stop_after: int | None,
        progress: _Progress,
    ) -> None:
        self.program, self.payload, self.workers = program, payload, workers
        self.hosts, self.buggify, self.stop_after = hosts, buggify, stop_after
        self.progress = progress
        self.done = self.events = 0
        self.failing: dict[int, tuple[_Outcome, Faults | FaultSchedule | None]] = {}
        self.limit: int | None = None  # the last index that still matters, once stopping
        self.stopped = False

    def failing_indices(self) -> list[int]:
        return sorted(i for i in self.failing if self.limit is None or i <= self.limit)

    def record(self, outcome: _Outcome, schedule: Faults | FaultSchedule | None) -> None:
        self.done += 1
        if outcome.error is None:
            self.events += outcome.events
        else:
            self.failing[outcome.index] = (outcome, schedule)
            if self.stop_after and len(self.failing) >= self.stop_after:
                self.limit = sorted(self.failing)[self.stop_after - 1]
        self.progress.update(self.done, len(self.failing_indices()))

    def run(self, tasks: Iterator[tuple[int, int, Faults | FaultSchedule | None]]) -> None:
        if not self.workers:
            for index, seed, schedule in tasks:
                self.record(_run(self.program, index, seed, self.hosts, schedule, self.buggify),
                            schedule)
                if self.limit is not None:
                    self.stopped = next(tasks, None) is not None
                    return
            return
        context = _context()
        idle: list[_Worker] = []
        busy: dict[_Worker, tuple[int, int, Faults | FaultSchedule | None]] = {}
        # Seeds ready to go (their schedules drawn while the workers ran), in order.
        ahead: collections.deque[tuple[int, int, Faults | FaultSchedule | None]] = (
            collections.deque()
        )
        exhausted = False

        def draw_ahead() -> None:
            nonlocal exhausted
            task = next(tasks, None)
            if task is None:
                exhausted = True
            else:
                ahead.append(task)

        try:
            while True:
                while self.limit is None and (idle or len(busy) < self.workers):
                    if not ahead and not exhausted:
                        draw_ahead()
                    if not ahead:
                        break
                    task = ahead.popleft()
                    worker = idle.pop() if idle else _Worker(context, self)
                    worker.send(task)
                    busy[worker] = task
                if self.limit is not None:  # seeds after the last failure that counts
                    for worker, task in list(busy.items()):
                        if task[0] > self.limit:
                            worker.kill()
                            del busy[worker]
                            self.stopped = True
                    if ahead or not exhausted:
                        self.stopped = True
                if not busy:
                    return
                waits: dict[Any, _Worker] = {}
                for worker in busy:
                    waits[worker.conn] = waits[worker.process.sentinel] = worker
                # While every worker runs, draw the next seeds' schedules (a strategy's draw
                # costs this process a few milliseconds), one per worker at most.
                while (self.limit is None and not exhausted and len(ahead) < self.workers
                       and not multiprocessing.connection.wait(list(waits), timeout=0)):
                    draw_ahead()
                for ready in multiprocessing.connection.wait(list(waits)):
                    worker = waits[ready]
                    if worker not in busy:
                        continue  # its connection and its sentinel were both ready
                    task = busy.pop(worker)
                    outcome = worker.receive(task)
                    if worker.alive:
                        idle.append(worker)
                    self.record(outcome, task[2])
        finally:
            for worker in [*idle, *busy]:
                worker.kill()


class _Worker:
    """One worker process and the pipe it takes seeds from."""

    def __init__(self, context: BaseContext, explorer: _Explorer) -> None:
        self.conn, child = context.Pipe()
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            args=(child, explorer.payload, list(sys.path), explorer.hosts, explorer.buggify),
            name="regency-explore",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.alive = True

    def send(self, task: tuple[int, int, Faults | FaultSchedule | None]) -> None:
        self.conn.send(task)

    def receive(self, task: tuple[int, int, Faults | FaultSchedule | None]) -> _Outcome:
        try:
            if self.conn.poll():
                outcome: _Outcome = self.conn.recv()
                return outcome
        except (EOFError, OSError):
            pass
        self.process.join(5)
        self.kill()
        index, seed, _ = task
        code = self.process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else (
            f"exited with status {code}")
        return _Outcome(
            index, seed, 0.0, error=f"WorkerDied: the worker process running seed {seed} {how}",
            error_type="regency.sim.WorkerDied",
        )

    def kill(self) -> None:
        self.alive = False
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


def _context() -> BaseContext:
    """forkserver (workers fork from a clean server that has imported regency.sim once),
    else spawn. Not fork: the caller may have threads (a runtime, a notebook's) that a
    forked child would inherit in whatever state they were in."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        server = getattr(forkserver, "_forkserver", None)
        preload = list(getattr(server, "_preload_modules", None) or ["__main__"])
        if "regency.sim" not in preload:
            forkserver.set_forkserver_preload([*preload, "regency.sim"])
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def _worker_main(
    conn: multiprocessing.connection.Connection,
    payload: bytes,
    path: list[str],
    hosts: int,
    buggify: bool | None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C and stops us
    sys.path[:] = path
    program: Callable[[Any], Any] | None = None
    problem = ""
    try:
        program = pickle.loads(payload)
    except BaseException as exc:
        problem = f"the worker process could not import the program: {type(exc).__name__}: {exc}"
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, seed, faults = task
        if program is None:
            conn.send(_Outcome(index, seed, 0.0, error=f"ImportError: {problem}",
                               error_type="builtins.ImportError"))
            continue
        conn.send(_run(program, index, seed, hosts, faults, buggify))


def _run(
    program: Callable[[Any], Any],
    index: int,
    seed: int,
    hosts: int,
    faults: Faults | FaultSchedule | None,
    buggify: bool | None,
) -> _Outcome:
    start = time.perf_counter()
    try:
        result = simulate(program, seed=seed, hosts=hosts, faults=faults, buggify=buggify)
    except Exception as exc:
        kind = type(exc)
        message = str(exc)
        return _Outcome(
            index, seed, time.perf_counter() - start,
            error=f"{kind.__name__}: {message}" if message else kind.__name__,
            error_type=f"{kind.__module__}.{kind.__qualname__}",
            traceback="".join(traceback.format_exception(exc)),
            log_tail=tuple(getattr(exc, "sim_log", ()))[-LOG_TAIL:],
        )
    return _Outcome(index, seed, time.perf_counter() - start, events=len(result.events))


def _failure(
    program: Callable[[Any], Any],
    outcome: _Outcome,
    hosts: int,
    faults: Faults | FaultSchedule | None,
    buggify: bool | None,
) -> ExploreFailure:
    assert outcome.error is not None
    return ExploreFailure(
        outcome.seed, outcome.error, outcome.error_type, outcome.traceback, outcome.log_tail,
        {"hosts": hosts, "faults": faults, "buggify": buggify}, program,
    )


# -- what a worker can import -------------------------------------------------------------


def _pickled(program: Callable[[Any], Any]) -> bytes:
    """The program pickled by reference, or a ``TypeError`` saying why a worker process
    could not import it and what to do instead."""
    name = getattr(program, "__qualname__", None) or repr(program)
    module = getattr(program, "__module__", None)
    fix = (
        "Define it with def at the top level of a module (a .py file importable from here, "
        "e.g. programs.py next to your notebook or script) and pass that function, or pass "
        "workers=0 to run the seeds in this process"
    )
    if "<lambda>" in name or "<locals>" in name:
        what = "a lambda" if "<lambda>" in name else "a function defined inside another function"
        raise TypeError(
            f"explore() runs the program in worker processes, which import it by reference "
            f"(module and name); {module}.{name} is {what}, which they cannot import. {fix}."
        )
    main = sys.modules.get("__main__")
    if module == "__main__" and getattr(main, "__file__", None) is None:
        raise TypeError(
            f"explore() runs the program in worker processes, which import it by reference "
            f"(module and name); {name} is defined in the __main__ of an interactive session "
            f"(a notebook, a REPL, python -c), which they cannot import. {fix}."
        )
    try:
        payload = pickle.dumps(program)
        pickle.loads(payload)
    except Exception as exc:
        raise TypeError(
            f"explore() runs the program in worker processes, which import it by reference "
            f"(module and name); {program!r} cannot be pickled that way ({exc}). {fix}."
        ) from None
    return payload


def _is_strategy(value: object) -> bool:
    strategies = sys.modules.get("hypothesis.strategies")
    return strategies is not None and isinstance(value, strategies.SearchStrategy)


# -- drawing and shrinking schedules with Hypothesis ---------------------------------------


def _settings(**kw: Any) -> Any:
    from hypothesis import HealthCheck, Verbosity, settings

    parent = kw.pop("parent", None)
    return settings(
        parent, deadline=None, verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck), print_blob=False, **kw,
    )


def _search(
    strategy: SearchStrategy[FaultSchedule], seed: int, condition: Callable[[Any], bool],
    *, shrink: bool,
) -> Any:
    """Hypothesis's ``find`` over ``strategy``, seeded by ``seed``: the examples it generates
    are the same for the same strategy and seed, up to the first that meets ``condition``,
    which it then shrinks when ``shrink`` is set."""
    from hypothesis import Phase, find

    phases = (Phase.generate, Phase.shrink) if shrink else (Phase.generate,)
    return find(
        strategy, condition, random=random.Random(seed),
        settings=_settings(database=None, phases=phases, max_examples=_DRAW_EXAMPLES),
    )


def _draw(strategy: SearchStrategy[FaultSchedule], seed: int) -> FaultSchedule:
    """The seed's schedule: the second example Hypothesis generates with the seed (the first
    is always the simplest), so the same strategy and seed give the same schedule, and
    :func:`_shrunk` meets it again (searching with the seed for a failing schedule)."""
    from hypothesis.errors import NoSuchExample

    examples: list[FaultSchedule] = []

    def collect(example: FaultSchedule) -> bool:
        examples.append(example)
        return False  # (no example is "found": Hypothesis prints nothing)

    try:
        _search(strategy, seed, collect, shrink=False)
    except NoSuchExample:
        pass
    if len(examples) < _DRAW_INDEX:
        raise ValueError(
            f"the fault strategy gave {len(examples)} example(s) for seed {seed}; explore() "
            f"takes the seed's schedule to be the example number {_DRAW_INDEX}"
        )
    return examples[_DRAW_INDEX - 1]


class _Fails:
    """The condition shrinking keeps: the seed fails with the same exception type. Each
    schedule runs once (outcomes are kept by the schedule's repr); past the deadline only the
    schedules that already failed count, which ends the shrink."""

    def __init__(self, failure: ExploreFailure, seconds: float) -> None:
        self.failure = failure
        self.deadline = time.monotonic() + seconds
        self.outcomes: dict[str, _Outcome] = {}
        self.first: object = None

    def __call__(self, schedule: Faults | FaultSchedule) -> bool:
        if self.first is None:
            self.first = schedule
        key = repr(schedule)
        outcome = self.outcomes.get(key)
        if outcome is None:
            if time.monotonic() > self.deadline:
                return False
            arguments = self.failure.arguments
            outcome = _run(self.failure.program, 0, self.failure.seed, arguments["hosts"],
                           schedule, arguments["buggify"])
            self.outcomes[key] = outcome
        return outcome.error is not None and outcome.error_type == self.failure.error_type


def _shrunk(
    failure: ExploreFailure, strategy: SearchStrategy[FaultSchedule] | None, seconds: float
) -> ExploreFailure:
    from hypothesis import Phase, find
    from hypothesis.errors import HypothesisException

    original = failure.faults
    assert original is not None
    fails = _Fails(failure, seconds)
    try:
        if strategy is not None:
            found: Faults | FaultSchedule = _search(strategy, failure.seed, fails, shrink=True)
        else:
            from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

            # Under the secondary key: Hypothesis takes a failing example from the primary
            # key to be shrunk already and would return it as it is.
            database = InMemoryExampleDatabase()
            database.save(_KEY + b".secondary", choices_to_bytes(_original_choices(original)))
            found = find(
                _reductions(original), fails, database_key=_KEY,
                # derandomized (the shrinker's random seeded from find's own test) and
                # with the database the schedule waits in: settings refuses the two
                # together in one call, not a derandomized parent with a database.
                settings=_settings(parent=_settings(derandomize=True), database=database,
                                   phases=(Phase.reuse, Phase.shrink)),
            )
            if repr(fails.first) != repr(original):
                return attrs.evolve(failure, shrink_note=(
                    "Hypothesis did not start from the failing schedule "
                    f"(it began with {fails.first!r})"
                ))
    except HypothesisException as exc:
        return attrs.evolve(failure, shrink_note=(
            f"Hypothesis found no failing schedule on seed {failure.seed} "
            f"({type(exc).__name__})"
        ))
    outcome = fails.outcomes[repr(found)]
    arguments = {**failure.arguments, "faults": found}
    shrunk = ExploreFailure(
        failure.seed, outcome.error or "", outcome.error_type, outcome.traceback,
        outcome.log_tail, arguments, failure.program,
    )
    return attrs.evolve(failure, shrunk=shrunk)


def _toward_zero(value: float) -> SearchStrategy[float]:
    from hypothesis import strategies as st

    return st.floats(min_value=0.0, max_value=value, allow_nan=False)


def _reductions(original: Faults | FaultSchedule) -> SearchStrategy[Faults | FaultSchedule]:
    """Schedules no larger than ``original``: each rate and each fault's time, duration and
    extra delay between zero and its value, each explicit fault kept or dropped. Its choices
    for ``original`` itself are :func:`_original_choices`."""
    from hypothesis import strategies as st

    rates = original if isinstance(original, Faults) else original.rates
    faults = () if isinstance(original, Faults) else original.faults

    @st.composite
    def reduced(draw: st.DrawFn) -> Faults | FaultSchedule:
        changed = {name: draw(_toward_zero(getattr(rates, name)))
                   for name in _RATES if getattr(rates, name) > 0}
        new_rates = attrs.evolve(rates, **changed)
        if isinstance(original, Faults):
            return new_rates
        kept: list[ScheduledFault] = []
        for fault in faults:
            if draw(st.booleans()):
                times = {name: draw(_toward_zero(getattr(fault, name)))
                         for name in _TIMES if getattr(fault, name, 0) > 0}
                kept.append(attrs.evolve(cast(Any, fault), **times))
        return FaultSchedule(new_rates, tuple(kept))

    return reduced()


def _original_choices(original: Faults | FaultSchedule) -> list[Any]:
    rates = original if isinstance(original, Faults) else original.rates
    choices: list[Any] = [getattr(rates, name) for name in _RATES if getattr(rates, name) > 0]
    if isinstance(original, FaultSchedule):
        for fault in original.faults:
            choices.append(True)
            choices += [getattr(fault, name) for name in _TIMES if getattr(fault, name, 0) > 0]
    return choices


# -- progress ---------------------------------------------------------------------------


class _Progress:
    """A callback, a progress line on a terminal's stderr, or nothing."""

    def __init__(self, progress: Callable[[int, int | None, int], object] | bool | None,
                 total: int | None) -> None:
        self.total = total
        self.callback = progress if callable(progress) else None
        stream: IO[str] | None = sys.stderr
        self.stream = stream if progress is True or (
            progress is None and stream is not None and stream.isatty()) else None
        self.start = time.perf_counter()
        self.shown = 0.0
        self.drawn = False

    def update(self, done: int, failures: int) -> None:
        if self.callback is not None:
            self.callback(done, self.total, failures)
        if self.stream is None:
            return
        now = time.perf_counter()
        if now - self.shown < 0.1 and done != self.total:
            return
        self.shown = now
        rate = done / (now - self.start) if now > self.start else 0.0
        if self.total:
            filled = int(30 * done / self.total)
            line = f"[{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} seeds"
        else:
            line = f"{done} seeds"
        line += f", {failures} failing, {rate:.1f} seeds/s"
        self.stream.write(f"\r{line}\x1b[K")
        self.stream.flush()
        self.drawn = True

    def note(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(f"{text}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _first_lines(text: str, lines: int = 3) -> str:
    parts = text.splitlines()
    return "\n    ".join(parts[:lines]) + (" ..." if len(parts) > lines else "")


# -- regency sim explore ---------------------------------------------------------------------


def run_command(args: Any) -> int:
    """``regency sim explore MODULE:FUNCTION --seeds N [--hosts H] [--workers W] [--faults
    random]``: explore, print the summary and each failure's replay line; exit status 1
    when a seed failed."""
    import importlib

    module_name, _, name = args.program.partition(":")
    if not module_name or not name:
        raise ValueError(f"the program is MODULE:FUNCTION (got {args.program!r})")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does
    try:
        program: Any = importlib.import_module(module_name)
        for part in name.split("."):
            program = getattr(program, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {args.program}: {exc}") from None
    if args.seeds < 0:
        raise ValueError(f"--seeds must be >= 0 (got {args.seeds})")
    faults = _faults_argument(args.faults, args.hosts)
    buggify = {"off": False, "on": True, "seed": None}[args.buggify]
    try:
        result = explore(
            program, range(args.first_seed, args.first_seed + args.seeds), hosts=args.hosts,
            faults=faults, buggify=buggify, workers=args.workers,
            stop_after=args.stop_after, shrink=False if args.no_shrink else None,
        )
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    except KeyboardInterrupt:
        print("regency sim explore: interrupted", file=sys.stderr)
        return 130
    head, *_ = result.summary().splitlines()
    print(head)
    for failure in result.failures:
        print(failure.describe(log=args.log_tail))
        print(f"  program = {failure.program_name}; run: "
              f"{(failure.shrunk or failure).replay_command}")
    return 1 if result.failures else 0


def _faults_argument(text: str, hosts: int) -> Any:
    from . import _network

    if text == "none":
        return None
    if text == "random":
        return _network.fault_schedules(max(hosts, 1), crashes=hosts > 0, procs=True)
    import regency.sim as names

    namespace = {name: getattr(names, name) for name in names.__all__}
    namespace["inf"] = math.inf
    try:
        value = eval(text, {"__builtins__": {"float": float}}, namespace)
    except Exception as exc:
        raise ValueError(f"--faults {text!r}: {type(exc).__name__}: {exc}") from None
    if not (value is None or isinstance(value, Faults | FaultSchedule) or _is_strategy(value)):
        raise ValueError(
            f"--faults takes none, random, or a Faults, FaultSchedule or fault_schedules(...) "
            f"expression (got {value!r})"
        )
    return value
