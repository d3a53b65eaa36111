"""Monarch's ``get_meter``, ``span`` and ``traced``, on OpenTelemetry (regency.telemetry)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import regency.actor
from regency import telemetry
from regency.actor import Actor, ActorMesh, endpoint, get_meter, span, this_proc, traced

T = 30

_spans = InMemorySpanExporter()
_metrics = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    """The SDK, as a program installs it (OpenTelemetry takes one provider per process)."""
    tracer_provider = trace.get_tracer_provider()
    if not isinstance(tracer_provider, TracerProvider):
        tracer_provider = TracerProvider()
        trace.set_tracer_provider(tracer_provider)
    tracer_provider.add_span_processor(SimpleSpanProcessor(_spans))
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[_metrics]))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _spans.clear()
    yield _spans
    _spans.clear()


def _points(name: str) -> list[Any]:
    data = _metrics.get_metrics_data()
    assert data is not None
    found = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    assert scope.scope.name == "regency"
                    found.extend(metric.data.data_points)
    return found


def test_the_names_are_regency_actors_too() -> None:
    assert regency.actor.get_meter is telemetry.get_meter
    assert regency.actor.span is telemetry.span
    assert regency.actor.traced is telemetry.traced


def test_get_meter_is_the_regency_meter_and_records() -> None:
    assert get_meter() is get_meter()
    counter = get_meter().create_counter("regency_test_steps")
    counter.add(2, {"phase": "train"})
    counter.add(3, {"phase": "train"})
    get_meter().create_histogram("regency_test_latency_ms").record(1.5)
    [point] = _points("regency_test_steps")
    assert point.value == 5 and dict(point.attributes) == {"phase": "train"}
    [histogram] = _points("regency_test_latency_ms")
    assert histogram.count == 1 and histogram.sum == 1.5


def test_span_nests_and_records_errors(spans: InMemorySpanExporter) -> None:
    with span("outer") as outer:
        outer.set_attribute("step", 3)
        with span("inner"):
            pass
    with pytest.raises(ValueError), span("broken"):
        raise ValueError("bad step")
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert set(by_name) == {"outer", "inner", "broken"}
    assert by_name["inner"].parent is not None
    assert by_name["inner"].parent.span_id == by_name["outer"].context.span_id
    assert by_name["outer"].attributes is not None and by_name["outer"].attributes["step"] == 3
    assert by_name["outer"].instrumentation_scope is not None
    assert by_name["outer"].instrumentation_scope.name == "regency"
    assert by_name["broken"].status.status_code is StatusCode.ERROR
    assert "regency.actor" not in (by_name["outer"].attributes or {})  # not inside an actor


def test_traced_sync_and_async_with_and_without_a_name(spans: InMemorySpanExporter) -> None:
    import asyncio

    @traced
    def plain(x: int) -> int:
        return x + 1

    @traced(name="custom")
    def named() -> str:
        return "ok"

    @traced
    async def waits(x: int) -> int:
        with span("during"):
            await asyncio.sleep(0)
        return x * 2

    @traced(name="async_custom")
    async def waits_named() -> None:
        await asyncio.sleep(0)

    assert plain(1) == 2 and plain.__name__ == "plain"
    assert named() == "ok"
    assert asyncio.run(waits(4)) == 8
    asyncio.run(waits_named())
    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == ["plain", "custom", "during", "waits", "async_custom"]
    during, outer = finished[2], finished[3]
    assert during.parent is not None and during.parent.span_id == outer.context.span_id


class Traced(Actor):
    @endpoint
    def work(self) -> None:
        with span("in_actor"):
            pass

    @endpoint
    @traced(name="traced_endpoint")
    async def decorated(self) -> int:
        return 5


def test_spans_in_an_actor_carry_its_identity(spans: InMemorySpanExporter) -> None:
    mesh = this_proc().spawn("traced_actor", Traced)
    try:
        mesh.work.call_one().get(T)
        assert mesh.decorated.call_one().get(T) == 5
    finally:
        ActorMesh.stop(mesh).get(T)  # type: ignore[arg-type]
    [found] = [s for s in spans.get_finished_spans() if s.name == "in_actor"]
    attributes = dict(found.attributes or {})
    assert attributes["regency.actor"].startswith("<tests.compat.test_telemetry.Traced traced_actor")
    assert attributes["regency.rank"] == 0
    assert "regency.actor_id" in attributes and "regency.proc_id" in attributes
    [endpoint_span] = [s for s in spans.get_finished_spans() if s.name == "traced_endpoint"]
    assert dict(endpoint_span.attributes or {})["regency.actor"] == attributes["regency.actor"]


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="takes a str"), span(3):  # type: ignore[arg-type]
        pass
    with pytest.raises(TypeError, match="takes a str"):
        traced(name=3)  # type: ignore[call-overload]
