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

Spans do not follow calls from one process to another: each process reports its own, under
the actor that ran them. See docs/porting.md for the differences from Monarch's Rust-backed
telemetry. ``opentelemetry`` is imported at first use, so importing this module (and
``regency.actor``) costs nothing.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Span, Tracer

__all__ = ["INSTRUMENTATION_NAME", "get_meter", "span", "traced"]

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
