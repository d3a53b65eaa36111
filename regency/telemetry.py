"""Metrics and traces on the OpenTelemetry API: Monarch's ``get_meter``, ``span`` and ``traced``.

Regency records through the OpenTelemetry *API* only (``opentelemetry-api``): what happens to
the measurements and spans is up to the SDK the program installs (``opentelemetry-sdk``: a
``MeterProvider`` with a reader, a ``TracerProvider`` with exporters), as for any library
instrumented with OpenTelemetry. Without one, every call is a cheap no-op.

* :func:`get_meter` returns the process's meter named ``"regency"``, as Monarch's returns its
  ``"monarch"`` meter: ``get_meter().create_counter("steps").add(1)``.
* :func:`span` opens a span, current for the ``with`` block; inside an actor it carries the
  actor's identity (``regency.actor``, ``regency.actor_id``, ``regency.rank``,
  ``regency.proc_id``), which is how Monarch files a span under its actor.
* :func:`traced` wraps a sync or async function in a span named after it (or ``name=``).

* :func:`instrument` exports Regency's own metrics of the whole job (messages handled and sent
  per endpoint, bytes received and sent per endpoint, handling time and its histogram,
  mailbox depths, casts, actor and proc failures) through a ``MeterProvider``, read from every proc when the provider's reader
  collects. It needs ``regency.configure(metrics=True)`` before procs are spawned
  (docs/observability.md, "Metrics").

Spans do not follow calls from one process to another: each process reports its own, under
the actor that ran them. See docs/porting.md for the differences from Monarch's Rust-backed
telemetry. ``opentelemetry`` is imported at first use, so importing this module (and
``regency.actor``) costs nothing.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Histogram, Meter, MeterProvider, Observation
    from opentelemetry.trace import Span, Tracer

    from .core._metrics import EndpointStats, ProcMetrics

__all__ = ["INSTRUMENTATION_NAME", "Instrumentation", "get_meter", "instrument", "span", "traced"]

log = logging.getLogger("regency.telemetry")

#: The name of Regency's meter and tracer (the instrumentation scope in exported data).
INSTRUMENTATION_NAME = "regency"

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _version() -> str:
    from . import __version__

    return __version__


@functools.cache
def get_meter() -> Meter:
    """The process's OpenTelemetry meter, named ``"regency"`` (always the same object).

    Instruments made from it report to the ``MeterProvider`` the program installs with
    ``opentelemetry.metrics.set_meter_provider``, also one installed after this call."""
    from opentelemetry import metrics

    return metrics.get_meter(INSTRUMENTATION_NAME, _version())


@functools.cache
def _tracer() -> Tracer:
    from opentelemetry import trace

    return trace.get_tracer(INSTRUMENTATION_NAME, _version())


def _actor_attributes() -> dict[str, str | int]:
    """The running actor's identity, or nothing outside actors (the controller's own code).

    Reads the context variable only: a span must not start Regency's runtime."""
    from .core._context import current

    ctx = current.get()
    if ctx is None:
        return {}
    instance = ctx.actor_instance
    return {
        "regency.actor": str(instance),
        "regency.actor_id": instance.actor_id,
        "regency.rank": instance.rank.rank,
        "regency.proc_id": instance.proc_id,
    }


@contextmanager
def span(name: str) -> Iterator[Span]:
    """Open an OpenTelemetry span called ``name`` for the ``with`` block (the current span
    meanwhile, so spans opened inside are its children); yields the span, which takes
    attributes and events. Inside an actor the span carries the actor's identity. An
    exception that leaves the block is recorded on the span and marks it as an error."""
    if not isinstance(name, str):
        raise TypeError(f"span(name) takes a str (got {name!r})")
    with _tracer().start_as_current_span(name, attributes=_actor_attributes()) as opened:
        yield opened


@overload
def traced(fn: Callable[_P, _R], /) -> Callable[_P, _R]: ...


@overload
def traced(*, name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...


def traced(
    fn: Callable[_P, _R] | None = None, /, *, name: str | None = None
) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run each call of the function inside :func:`span`, named ``name`` or the function's
    ``__name__``. For ``async def`` functions the span covers the whole awaited call.

    ``@traced`` and ``@traced(name="step")`` both work, on sync and async functions."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"traced(name=...) takes a str (got {name!r})")

    def decorate(function: Callable[_P, _R]) -> Callable[_P, _R]:
        if not callable(function):
            raise TypeError(f"@traced decorates a function (got {function!r})")
        span_name = name if name is not None else getattr(function, "__name__", repr(function))
        if inspect.iscoroutinefunction(function):
            coroutine_function: Callable[_P, Coroutine[Any, Any, Any]] = function

            @functools.wraps(function)
            async def traced_async(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                with span(span_name):
                    return await coroutine_function(*args, **kwargs)

            return cast(Callable[_P, _R], traced_async)

        @functools.wraps(function)
        def traced_sync(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with span(span_name):
                return function(*args, **kwargs)

        return traced_sync

    if fn is not None:
        return decorate(fn)
    return decorate


# -- Regency's own metrics ------------------------------------------------------------------

#: The attributes of Regency's metrics.
ACTOR_CLASS = "regency.actor_class"
MESH = "regency.mesh"
RANK = "regency.rank"
ENDPOINT = "regency.endpoint"
OUTCOME = "regency.outcome"
PROC_ID = "regency.proc_id"

#: A gathering is reused by the callbacks that do not gather for at most this long (s).
_REUSE = 30.0

_instrumented: dict[int, tuple[object, Instrumentation]] = {}
_instrumented_lock = threading.Lock()

_Buckets = tuple[tuple[int, ...], tuple[float, ...]]


def instrument(
    meter_provider: MeterProvider | None = None,
    *,
    timeout: float = 2.0,
    histogram: bool = True,
) -> Instrumentation:
    """Export Regency's metrics of the whole job through ``meter_provider`` (default: the
    global one, ``opentelemetry.metrics.get_meter_provider()``). Call it in the controller.

    It registers, under the meter ``"regency"``, instruments whose callbacks ask every proc
    (procs spawned by actors included) for its numbers when the provider's reader collects
    (on the reader's thread: a periodic reader's, a Prometheus scrape's), each proc
    answering within ``timeout`` seconds:

    * ``regency.messages.handled`` (counter; actor class, mesh, rank, endpoint, outcome
      ``ok`` or ``error``), ``regency.handler.time`` (counter, seconds),
      ``regency.mailbox.depth`` (gauge; actor class, mesh, rank);
    * ``regency.handler.duration`` (histogram, seconds; unless ``histogram=False``): fed
      from the procs' latency buckets with the calls handled since this call, one
      measurement per call (docs/observability.md says what that costs);
    * ``regency.bytes.received`` and ``regency.bytes.sent`` (counters, bytes; actor class,
      mesh, rank, endpoint): the call frames each actor received and the reply frames it
      sent, per endpoint;
    * ``regency.messages.sent`` and ``regency.casts`` (counters; mesh, endpoint, the sending
      proc's id);
    * ``regency.actor.failures`` (actor class, mesh, rank) and ``regency.proc.failures``
      (proc id), counters.

    The procs keep these numbers only with ``regency.configure(metrics=True)`` (or
    ``REGENCY_METRICS=1``) set before they are spawned. Calling it again for the same
    provider returns the same :class:`Instrumentation`. Not in the simulator."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
        0 < timeout < math.inf
    ):
        raise ValueError(
            f"instrument(): timeout must be a positive number of seconds (got {timeout!r})"
        )
    from opentelemetry import metrics

    from .core._config import current_config

    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _instrumented_lock:
        known = _instrumented.get(id(provider))
        if known is not None and known[0] is provider and not known[1].closed:
            return known[1]
        made = Instrumentation(provider, float(timeout), histogram)
        _instrumented[id(provider)] = (provider, made)
    if not current_config().metrics:
        log.warning(
            "regency.telemetry.instrument(): metrics are off, so procs keep no numbers to "
            "export; set regency.configure(metrics=True) (or REGENCY_METRICS=1) before "
            "spawning procs"
        )
    return made


class Instrumentation:
    """Regency's instruments on one ``MeterProvider`` (made by :func:`instrument`).

    Each collection gathers once from every proc, in the first callback the reader runs
    (``regency.messages.handled``'s: readers run callbacks in the order the instruments
    were made); the other callbacks read what it gathered. The counters and the gauge are
    the procs' own numbers. The histogram and the failure counters are synchronous
    instruments, fed at each gathering with what changed since the one before."""

    def __init__(self, provider: MeterProvider, timeout: float, histogram: bool = True) -> None:
        from .core._metrics import BOUNDS

        self.timeout = timeout
        self.closed = False
        self._lock = threading.Lock()
        self._procs: list[ProcMetrics] = []
        self._taken = -math.inf
        self._bounds = BOUNDS
        #: Per proc address: the buckets (counts, sums) recorded so far per (actor key,
        #: endpoint).
        self._seen: dict[str, dict[tuple[str, str], _Buckets]] = {}
        self._failed_actors: set[str] = set()
        self._failed_procs: set[str] = set()
        meter = provider.get_meter(INSTRUMENTATION_NAME, _version())
        meter.create_observable_counter(
            "regency.messages.handled", [self._observe_handled], unit="{message}",
            description="Calls handled by actors, per endpoint and outcome",
        )
        meter.create_observable_counter(
            "regency.handler.time", [self._observe_time], unit="s",
            description="Time actors spent handling calls, per endpoint",
        )
        meter.create_observable_gauge(
            "regency.mailbox.depth", [self._observe_depth], unit="{message}",
            description="Messages waiting in each actor's mailbox",
        )
        meter.create_observable_counter(
            "regency.messages.sent", [self._observe_sent], unit="{message}",
            description="Calls sent, one per destination rank, per endpoint and sending proc",
        )
        meter.create_observable_counter(
            "regency.casts", [self._observe_casts], unit="{cast}",
            description="Sends to more than one rank, per endpoint and sending proc",
        )
        meter.create_observable_counter(
            "regency.bytes.received", [self._observe_bytes_received], unit="By",
            description="Bytes of the call frames actors received, per endpoint",
        )
        meter.create_observable_counter(
            "regency.bytes.sent", [self._observe_bytes_sent], unit="By",
            description="Bytes of the reply frames actors sent, per endpoint",
        )
        self._duration: Histogram | None = None
        if histogram:
            what = "Handling time of calls, per endpoint (from the procs' latency buckets)"
            try:
                self._duration = meter.create_histogram(
                    "regency.handler.duration", unit="s", description=what,
                    explicit_bucket_boundaries_advisory=list(BOUNDS),
                )
            except TypeError:  # an API older than 1.23: the SDK's default boundaries
                self._duration = meter.create_histogram(
                    "regency.handler.duration", unit="s", description=what
                )
        self._actor_failures = meter.create_counter(
            "regency.actor.failures", unit="{actor}", description="Actors that failed"
        )
        self._proc_failures = meter.create_counter(
            "regency.proc.failures", unit="{proc}",
            description="Procs that exited other than by being stopped (a status, a signal)",
        )
        if histogram:
            # The histogram takes the calls handled from now on: what the procs handled
            # before is the baseline (the counters have it; the histogram would have to
            # record each of those calls once).
            with self._lock:
                for proc in self._gather():
                    self._seen[proc.address] = {
                        (actor.key, stats.endpoint): (stats.counts, stats.sums)
                        for actor in proc.actors
                        for stats in actor.endpoints
                    }

    def close(self) -> None:
        """Stop reporting: the callbacks observe nothing from now on (OpenTelemetry cannot
        take instruments back from a provider): ``instrument()`` on that provider makes new
        ones."""
        self.closed = True
        with _instrumented_lock:
            for key, (_, made) in list(_instrumented.items()):
                if made is self:
                    del _instrumented[key]

    # -- gathering --------------------------------------------------------------------------

    def _snapshot(self, gather: bool) -> list[ProcMetrics]:
        with self._lock:
            if gather or time.monotonic() - self._taken > _REUSE:
                procs = self._gather()
                self._procs, self._taken = procs, time.monotonic()
                self._record(procs)
            return self._procs

    def _gather(self) -> list[ProcMetrics]:
        """The procs that answered, this runtime's own record first; nothing where there is
        no runtime yet, in the simulator, or on the runtime's own thread."""
        from .core._current import current_runtime_or_none
        from .core._metrics import collect

        rt = current_runtime_or_none()
        if (
            self.closed
            or rt is None
            or rt.env.simulated_host is not None
            or rt.on_runtime_thread()
            or rt.died is not None
            or not rt.started.is_set()
        ):
            return []
        try:
            return [p for p in collect(rt, self.timeout) if p.answered]
        except Exception as exc:
            log.debug("could not gather metrics: %s", exc)
            return []

    def _record(self, procs: list[ProcMetrics]) -> None:
        """Feed the synchronous instruments with what changed since the last gathering."""
        seen: dict[str, dict[tuple[str, str], _Buckets]] = {}
        for proc in procs:
            before = self._seen.get(proc.address, {})
            now = seen[proc.address] = {}
            for actor in proc.actors:
                attributes: dict[str, str | int] = {
                    ACTOR_CLASS: actor.cls, MESH: actor.mesh, RANK: actor.rank
                }
                if actor.state == "failed" and actor.key not in self._failed_actors:
                    self._failed_actors.add(actor.key)
                    self._actor_failures.add(1, attributes)
                for stats in actor.endpoints:
                    key = (actor.key, stats.endpoint)
                    last = before.get(key)
                    if self._duration is None or (last is not None and last[0] == stats.counts):
                        now[key] = last or (stats.counts, stats.sums)
                        continue
                    now[key] = self._histogram(
                        self._duration, {**attributes, ENDPOINT: stats.endpoint}, stats, last
                    )
            for proc_id, _how in proc.failed_children:
                if proc_id not in self._failed_procs:
                    self._failed_procs.add(proc_id)
                    self._proc_failures.add(1, {PROC_ID: proc_id})
        self._seen = seen

    def _histogram(
        self,
        duration: Histogram,
        attributes: dict[str, str | int],
        stats: EndpointStats,
        last: _Buckets | None,
    ) -> _Buckets:
        """Record each bucket's new calls: as many measurements as calls, each the mean of
        their times. The mean lies in the bucket, so the histogram's bucket counts and count
        are the procs' own, and its sum is theirs to rounding (its min and max are means).
        Returns what is now recorded: a bucket whose time grew without its count (a call
        read half-counted: core/_metrics.ActorStats) keeps that time for its next call."""
        record, bounds = duration.record, self._bounds
        sums = list(stats.sums)
        for bucket, count in enumerate(stats.counts):
            total = stats.sums[bucket]
            if last is not None and last[0][bucket] <= count:
                count -= last[0][bucket]
                total -= last[1][bucket]
            if count <= 0:
                if last is not None:
                    sums[bucket] = last[1][bucket]
                continue
            low = bounds[bucket - 1] if bucket else 0.0
            high = bounds[bucket] if bucket < len(bounds) else math.inf
            mean = min(max(total / count, math.nextafter(low, math.inf)), high)
            for _ in range(count):
                record(mean, attributes)
        return stats.counts, tuple(sums)

    # -- the callbacks ----------------------------------------------------------------------

    def _observe_handled(self, options: CallbackOptions) -> list[Observation]:
        out: dict[tuple[Any, ...], float] = {}
        for proc in self._snapshot(True):
            for actor in proc.actors:
                for stats in actor.endpoints:
                    base = (actor.cls, actor.mesh, actor.rank, stats.endpoint)
                    _add(out, (*base, "ok"), stats.ok)
                    if stats.errors:
                        _add(out, (*base, "error"), stats.errors)
        return _observations(out, (ACTOR_CLASS, MESH, RANK, ENDPOINT, OUTCOME))

    def _observe_time(self, options: CallbackOptions) -> list[Observation]:
        out: dict[tuple[Any, ...], float] = {}
        for proc in self._snapshot(False):
            for actor in proc.actors:
                for stats in actor.endpoints:
                    _add(out, (actor.cls, actor.mesh, actor.rank, stats.endpoint), stats.seconds)
        return _observations(out, (ACTOR_CLASS, MESH, RANK, ENDPOINT))

    def _observe_bytes_received(self, options: CallbackOptions) -> list[Observation]:
        return self._observe_bytes(received=True)

    def _observe_bytes_sent(self, options: CallbackOptions) -> list[Observation]:
        return self._observe_bytes(received=False)

    def _observe_bytes(self, *, received: bool) -> list[Observation]:
        out: dict[tuple[Any, ...], float] = {}
        for proc in self._snapshot(False):
            for actor in proc.actors:
                for stats in actor.endpoints:
                    count = stats.bytes_received if received else stats.bytes_sent
                    if count:
                        _add(out, (actor.cls, actor.mesh, actor.rank, stats.endpoint), count)
        return _observations(out, (ACTOR_CLASS, MESH, RANK, ENDPOINT))

    def _observe_depth(self, options: CallbackOptions) -> list[Observation]:
        out: dict[tuple[Any, ...], float] = {}
        for proc in self._snapshot(False):
            for actor in proc.actors:
                if actor.state == "running":
                    _add(out, (actor.cls, actor.mesh, actor.rank), actor.queued)
        return _observations(out, (ACTOR_CLASS, MESH, RANK))

    def _observe_sent(self, options: CallbackOptions) -> list[Observation]:
        out: dict[tuple[Any, ...], float] = {}
        for proc in self._snapshot(False):
            for mesh, endpoint, count in proc.sent:
                _add(out, (mesh, endpoint, proc.proc_id), count)
        return _observations(out, (MESH, ENDPOINT, PROC_ID))

    def _observe_casts(self, options: CallbackOptions) -> list[Observation]:
        out: dict[tuple[Any, ...], float] = {}
        for proc in self._snapshot(False):
            for mesh, endpoint, count in proc.casts:
                _add(out, (mesh, endpoint, proc.proc_id), count)
        return _observations(out, (MESH, ENDPOINT, PROC_ID))


def _add(out: dict[tuple[Any, ...], float], key: tuple[Any, ...], value: float) -> None:
    out[key] = out.get(key, 0) + value


def _observations(out: dict[tuple[Any, ...], float], names: tuple[str, ...]) -> list[Observation]:
    from opentelemetry.metrics import Observation

    return [Observation(value, dict(zip(names, key, strict=True))) for key, value in out.items()]
