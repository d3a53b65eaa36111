"""The log of one simulated run: the runtime's own warnings, in virtual time, kept apart.

Under faults a user asked for, the runtime logs what it should (a reconnect given up, a reply
for a proc that crashed, a proc killed as stuck): expected, and on a sweep of hundreds of
seeds, hundreds of lines. Inside :func:`regency.sim.simulate` those records (the loggers
under ``regency``, from the simulation's own threads: its trio loop and its lockstep threads)
are kept in the run's log, each line stamped with the virtual time, and Python's last-resort
handler (what prints a warning to stderr when logging was never configured) stays quiet for
them. The log comes back as ``SimResult.log``, goes into the exception of a run that fails,
and is printed as it is written with ``simulate(..., log=True)``.

Records keep propagating to the handlers a program configured (``logging.basicConfig``, a
test's ``caplog``): configuring logging is asking for them. Records from other threads (a
real runtime in the same process) are left exactly as they were.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

#: The logger whose records (and its children's) a simulated run keeps.
LOGGER = "regency"

#: How many of the last log entries a failed run's exception shows (all are attached).
SHOWN_ON_FAILURE = 30


class RunLog(logging.Handler):
    """A handler on the ``regency`` logger for the length of one simulated run."""

    def __init__(self, echo: IO[str] | None = None) -> None:
        super().__init__()
        self.entries: list[str] = []
        self._echo = echo
        self._thread = threading.get_ident()
        #: The run's lockstep (set once its cluster exists): whose threads are the run's.
        self.lockstep: object | None = None
        #: The run's virtual clock (set once its cluster exists).
        self.now: Callable[[], float] | None = None
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def ours(self) -> bool:
        """Whether the calling thread is one of the run's (its loop or a lockstep thread)."""
        if threading.get_ident() == self._thread:
            return True
        from ._lockstep import current_worker

        worker = current_worker()
        return worker is not None and worker.lockstep is self.lockstep

    def _virtual_time(self) -> float:
        if self.now is None:
            return 0.0
        try:
            return self.now()
        except RuntimeError:  # the cluster's clock is not there yet
            return 0.0

    def emit(self, record: logging.LogRecord) -> None:
        if not self.ours():
            _as_if_absent(self, record)
            return
        try:
            entry = f"{self._virtual_time():.9f} {self.format(record)}"
        except Exception:
            self.handleError(record)
            return
        self.entries.append(entry)
        if self._echo is not None:
            try:
                self._echo.write(entry + "\n")
                self._echo.flush()
            except Exception:
                self.handleError(record)

    @contextmanager
    def capturing(self) -> Iterator[RunLog]:
        """Keep the run's records while the block runs."""
        logger = logging.getLogger(LOGGER)
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)


def _as_if_absent(handler: logging.Handler, record: logging.LogRecord) -> None:
    """A record of another thread: what logging would have done without ``handler`` (which
    counts as a handler found, and so silences the last resort, for everyone)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(h is not handler and record.levelno >= h.level for h in logger.handlers):
            return  # another handler had it
        if not logger.propagate:
            break
        logger = logger.parent
    last = logging.lastResort
    if last is not None and record.levelno >= last.level:
        last.handle(record)


def describe(entries: Sequence[str], limit: int = SHOWN_ON_FAILURE) -> str:
    """The last ``limit`` entries of a run's log, for a failed run's exception."""
    shown = entries[-limit:]
    head = f"the run's log ({len(entries)} entries"
    head += f", the last {len(shown)} shown" if len(shown) < len(entries) else ""
    head += "; all in the exception's sim_log attribute):"
    return head + "\n  " + "\n  ".join(e.replace("\n", "\n  ") for e in shown)


@contextmanager
def root_faults_logged(run_log: RunLog) -> Iterator[None]:
    """While a run runs: an actor failure that reaches the root unhandled, with the default
    ``unhandled_fault_hook``, goes to the run's log instead of stderr. (The default hook
    would also try to stop the program by interrupting the process's main thread: inside
    ``simulate`` that is the simulation's own loop, and the interrupt only ever ended as a
    logged ``KeyboardInterrupt``.) A hook the program installed is left alone."""
    import regency.actor as actor_api

    from ..core._oversight import default_unhandled_fault_hook

    if actor_api.unhandled_fault_hook is not default_unhandled_fault_hook:
        yield
        return
    log = logging.getLogger("regency.sim")

    def hook(failure: Any) -> None:
        if run_log.ours():
            log.error(
                "an actor failure reached the root unhandled (a real program would stop "
                "here: no __supervise__ took it):\n%s",
                failure.report(),
            )
        else:
            default_unhandled_fault_hook(failure)

    actor_api.unhandled_fault_hook = hook
    try:
        yield
    finally:
        if actor_api.unhandled_fault_hook is hook:
            actor_api.unhandled_fault_hook = default_unhandled_fault_hook
