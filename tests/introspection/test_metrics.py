"""Regency's metrics with real procs (regency.telemetry.instrument, core/_metrics.py): the
SDK's in-memory reader and a Prometheus scrape see exact counts per mesh, rank and
endpoint, errors, handling times and their histogram, bytes received and sent, mailbox
depths, sends and casts at the controller, actor and proc failures; with metrics off the
procs keep nothing."""

from __future__ import annotations

import inspect
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import regency
from regency import telemetry
from regency.actor import ProcMesh
from regency.core import _codec, _inbound, _runtime
from regency.core import _messages as M
from regency.core._controller import current_runtime
from regency.core._metrics import BOUNDS, collect, frame_bytes

from ..conftest import RootFailures, SpawnProcs
from .actors import Stuck
from .metric_actors import AllAsync, Mixed

T = 30
STUCK = f"{Stuck.__module__}.{Stuck.__qualname__}"


class Metrics:
    """An SDK ``MeterProvider`` with an in-memory reader, instrumented."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.instruments = telemetry.instrument(self.provider, timeout=10.0)

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        assert scope.scope.name == "regency"
                        found.extend(metric.data.data_points)
        return found


def matching(points: list[Any], **attributes: Any) -> list[Any]:
    wanted = {f"regency.{k}": v for k, v in attributes.items()}
    return [p for p in points if all(p.attributes.get(k) == v for k, v in wanted.items())]


def value(points: list[Any], **attributes: Any) -> float:
    """The sum of the matching points' values (0 when none match)."""
    return sum(p.value for p in matching(points, **attributes))


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    made = Metrics()
    yield made
    made.instruments.close()
    made.provider.shutdown()


@pytest.fixture
def metered(spawn_procs: SpawnProcs, configured: Callable[..., None]) -> ProcMesh:
    configured(metrics=True)
    pm = spawn_procs({"gpus": 2})
    pm.initialized.get(T)
    return pm


@pytest.fixture
def released(tmp_path: Path) -> str:
    """A path that exists: ``Stuck.hang(path, rank)`` returns at once."""
    path = tmp_path / "released"
    path.touch()
    return str(path)


def test_handled_sent_errors_time_and_histogram_are_exact(
    metered: ProcMesh, metrics: Metrics, released: str
) -> None:
    mesh = metered.spawn("counted", Stuck)
    n = 7
    for _ in range(n):
        assert mesh.ping.call().get(T).values() == ["pong"] * 2
    for _ in range(3):
        with pytest.raises(Exception, match="bad value 42"):
            mesh.slice(gpus=1).fail.call_one().get(T)
    # A call is counted just after its reply is sent; the next call on the same rank is
    # handled after that, so once it has answered, the calls before it are all counted.
    mesh.hang.call(released, -1).get(T)

    handled = metrics.points("regency.messages.handled")
    for rank in (0, 1):
        (point,) = matching(handled, mesh="counted", rank=rank, endpoint="ping", outcome="ok")
        assert point.value == n and point.attributes["regency.actor_class"] == STUCK
        assert not matching(handled, mesh="counted", rank=rank, endpoint="ping", outcome="error")
    assert value(handled, mesh="counted", rank=1, endpoint="fail", outcome="error") == 3
    assert value(handled, mesh="counted", rank=1, endpoint="fail", outcome="ok") == 0
    assert not matching(handled, mesh="counted", rank=0, endpoint="fail")

    me = current_runtime().proc_id
    sent = metrics.points("regency.messages.sent")
    assert value(sent, mesh="counted", endpoint="ping", proc_id=me) == 2 * n
    assert value(sent, mesh="counted", endpoint="fail", proc_id=me) == 3
    assert value(sent, mesh="counted", endpoint="hang", proc_id=me) == 2
    casts = metrics.points("regency.casts")
    assert value(casts, mesh="counted", endpoint="ping", proc_id=me) == n
    assert value(casts, mesh="counted", endpoint="hang", proc_id=me) == 1
    assert value(casts, mesh="counted", endpoint="fail", proc_id=me) == 0

    seconds = value(metrics.points("regency.handler.time"), mesh="counted", rank=0, endpoint="ping")
    assert 0 < seconds < n * 5.0
    (hist,) = matching(
        metrics.points("regency.handler.duration"), mesh="counted", rank=0, endpoint="ping"
    )
    assert hist.count == n and sum(hist.bucket_counts) == n
    assert list(hist.explicit_bounds) == list(BOUNDS)
    assert hist.sum == pytest.approx(seconds, rel=1e-9)

    # More calls: the counters go on from where they were, the histogram takes only the new.
    for _ in range(4):
        mesh.slice(gpus=0).ping.call_one().get(T)
    mesh.slice(gpus=0).hang.call_one(released, -1).get(T)
    handled = metrics.points("regency.messages.handled")
    assert value(handled, mesh="counted", rank=0, endpoint="ping", outcome="ok") == n + 4
    assert value(handled, mesh="counted", rank=1, endpoint="ping", outcome="ok") == n
    (hist,) = matching(
        metrics.points("regency.handler.duration"), mesh="counted", rank=0, endpoint="ping"
    )
    assert hist.count == n + 4
    sent = metrics.points("regency.messages.sent")
    assert value(sent, mesh="counted", endpoint="ping", proc_id=me) == 2 * n + 4
    assert value(metrics.points("regency.casts"), mesh="counted", endpoint="ping") == n


def reply_bytes(value: Any) -> int:
    """The size of the reply frame that carries ``value`` (any port, index: fixed fields)."""
    return frame_bytes(_codec.encode_reply(7, 0, M.OK, value))


def test_bytes_sent_per_endpoint_are_the_reply_frames(
    metered: ProcMesh, metrics: Metrics, released: str
) -> None:
    mesh = metered.spawn("talky", Stuck)
    n = 5
    for _ in range(n):
        mesh.ping.call().get(T)
    with pytest.raises(Exception, match="bad value 42"):
        mesh.slice(gpus=1).fail.call_one().get(T)
    assert mesh.hang.call(released, -1).get(T).values() == [0, 1]
    sent = metrics.points("regency.bytes.sent")
    for rank in (0, 1):
        (point,) = matching(sent, mesh="talky", rank=rank, endpoint="ping")
        assert point.value == n * reply_bytes("pong")
        assert point.attributes["regency.actor_class"] == STUCK
        assert value(sent, mesh="talky", rank=rank, endpoint="hang") == reply_bytes(rank)
    # An error's reply carries the failure (its traceback): counted, however long.
    assert value(sent, mesh="talky", rank=1, endpoint="fail") > reply_bytes(None)
    assert not matching(sent, mesh="talky", rank=0, endpoint="fail")
    # Counters: more calls add to them.
    mesh.slice(gpus=0).ping.call_one().get(T)
    sent = metrics.points("regency.bytes.sent")
    assert value(sent, mesh="talky", rank=0, endpoint="ping") == (n + 1) * reply_bytes("pong")


#: Whether the inbound paths (a call frame read by the loop, or by a thread) count the
#: bytes of call frames for their actors (``core/_metrics.count_received``).
RECEIVED_COUNTED = all(
    "count_received" in inspect.getsource(module) for module in (_inbound, _runtime)
)


@pytest.mark.skipif(
    not RECEIVED_COUNTED,
    reason="core/_inbound.py and core/_runtime.py do not call _metrics.count_received yet",
)
def test_bytes_received_per_endpoint_are_the_call_frames(
    metered: ProcMesh, metrics: Metrics
) -> None:
    mesh = metered.spawn("listening", Stuck)
    n = 6
    for _ in range(n):
        mesh.ping.call().get(T)
    # hang(path, -1) returns at once on every rank; its argument travels in the call frame.
    mesh.slice(gpus=0).hang.call_one("short", -1).get(T)
    mesh.slice(gpus=1).hang.call_one("long" * 1000, -1).get(T)
    mesh.ping.call().get(T)  # (each rank has counted the calls before it)
    received = metrics.points("regency.bytes.received")
    pings = [value(received, mesh="listening", rank=rank, endpoint="ping") for rank in (0, 1)]
    assert pings[0] == pings[1] > (n + 1) * 40  # (a call frame: its route, its arguments)
    hang = [value(received, mesh="listening", rank=rank, endpoint="hang") for rank in (0, 1)]
    assert hang[1] - hang[0] >= 4000 - len("short")
    (point,) = matching(received, mesh="listening", rank=0, endpoint="ping")
    assert point.attributes["regency.actor_class"] == STUCK


def until(check: Callable[[], bool], what: Callable[[], object]) -> None:
    deadline = time.monotonic() + T
    while not check():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_concurrent_and_all_async_endpoints_are_counted(
    metered: ProcMesh, metrics: Metrics
) -> None:
    mixed = metered.spawn("mixed", Mixed)
    naps = [mixed.nap.call(0.01) for _ in range(20)]
    for _ in range(20):
        mixed.ping.call().get(T)
    assert all(f.get(T).values() == ["rested"] * 2 for f in naps)
    proper = metered.spawn("proper", AllAsync)
    for _ in range(6):
        proper.ping.call().get(T)
    with pytest.raises(Exception, match="async failure"):
        proper.slice(gpus=0).fail.call_one().get(T)

    def handled() -> list[Any]:
        return metrics.points("regency.messages.handled")

    # A concurrent call is recorded when its task ends, after its reply: wait for them.
    until(lambda: value(handled(), mesh="mixed", endpoint="nap") == 40, handled)
    points = handled()
    for rank in (0, 1):
        assert value(points, mesh="mixed", rank=rank, endpoint="nap", outcome="ok") == 20
        assert value(points, mesh="mixed", rank=rank, endpoint="ping", outcome="ok") == 20
    until(lambda: value(handled(), mesh="proper", endpoint="fail") == 1, handled)
    points = handled()
    assert value(points, mesh="proper", rank=0, endpoint="fail", outcome="error") == 1
    for rank in (0, 1):
        assert value(points, mesh="proper", rank=rank, endpoint="ping", outcome="ok") == 6
    (hist,) = matching(
        metrics.points("regency.handler.duration"), mesh="mixed", rank=1, endpoint="nap"
    )
    assert hist.count == 20 and hist.min >= 0.01 * 0.5


def test_the_histogram_starts_at_instrument_and_can_be_left_out(
    metered: ProcMesh, released: str
) -> None:
    mesh = metered.spawn("early", Stuck)
    for _ in range(3):
        mesh.ping.call().get(T)
    # A reply leaves before its call is recorded: a call of another endpoint after them
    # (one actor handles one message at a time) makes sure the pings are counted already.
    mesh.hang.call(released, -1).get(T)
    later = Metrics()
    bare = MeterProvider(metric_readers=[reader := InMemoryMetricReader()])
    without = telemetry.instrument(bare, histogram=False)
    try:
        for _ in range(2):
            mesh.ping.call().get(T)
        mesh.hang.call(released, -1).get(T)
        handled = later.points("regency.messages.handled")
        assert value(handled, mesh="early", rank=0, endpoint="ping", outcome="ok") == 5
        (hist,) = matching(
            later.points("regency.handler.duration"), mesh="early", rank=0, endpoint="ping"
        )
        assert hist.count == 2  # the calls handled since instrument()
        data = reader.get_metrics_data()
        assert data is not None
        names = {m.name for r in data.resource_metrics for sc in r.scope_metrics for m in sc.metrics}
        assert "regency.messages.handled" in names and "regency.handler.duration" not in names
    finally:
        later.instruments.close()
        later.provider.shutdown()
        without.close()
        bare.shutdown()


def test_instrument_once_per_provider_and_its_arguments() -> None:
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    try:
        made = telemetry.instrument(provider, timeout=5.0)
        assert telemetry.instrument(provider) is made
        for bad in (0, -1.0, float("inf"), True, "1"):
            with pytest.raises(ValueError, match="timeout"):
                telemetry.instrument(provider, timeout=bad)  # type: ignore[arg-type]
        made.close()
        assert telemetry.instrument(provider) is not made
    finally:
        provider.shutdown()


def test_mailbox_depth_of_a_busy_actor(metered: ProcMesh, metrics: Metrics, tmp_path: Path) -> None:
    release = str(tmp_path / "release")
    mesh = metered.spawn("deep", Stuck)
    mesh.ping.call().get(T)
    hung = mesh.hang.call(release, 1)
    behind = [mesh.slice(gpus=1).ping.call_one() for _ in range(3)]
    try:
        deadline = time.monotonic() + T
        while True:
            depth = metrics.points("regency.mailbox.depth")
            # Rank 1 is in hang with three pings behind it; rank 0 returned from hang.
            rank_0 = matching(depth, mesh="deep", rank=0)
            if value(depth, mesh="deep", rank=1) == 3 and rank_0 and rank_0[0].value == 0:
                break
            assert time.monotonic() < deadline, depth
            time.sleep(0.05)
        (point,) = matching(depth, mesh="deep", rank=1)
        assert point.attributes["regency.actor_class"] == STUCK
    finally:
        Path(release).touch()
    assert hung.get(T).values() == [0, 1]
    assert [f.get(T) for f in behind] == ["pong"] * 3
    deadline = time.monotonic() + T
    while value(metrics.points("regency.mailbox.depth"), mesh="deep", rank=1) != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_actor_and_proc_failures(
    metered: ProcMesh, metrics: Metrics, spawn_procs: SpawnProcs, roots: RootFailures
) -> None:
    mesh = metered.spawn("doomed", Stuck)
    mesh.ping.call().get(T)
    mesh.slice(gpus=0).fail.broadcast()  # no caller waiting: the actor dies
    roots.wait_for("doomed", T)
    victims = spawn_procs({"gpus": 2})
    victims.spawn("victims", Stuck).ping.call().get(T)
    calm = spawn_procs({"gpus": 1})
    calm.spawn("calm", Stuck).ping.call().get(T)
    calm_ids = [p.proc_id for p in regency.stacks(calm).procs]
    calm.stop().get(T)  # stopped: not a failure
    stacks = regency.stacks(victims)
    os.kill(stacks.procs[1].pid, signal.SIGKILL)
    killed = stacks.procs[1].proc_id

    deadline = time.monotonic() + T
    while True:
        procs = metrics.points("regency.proc.failures")
        if matching(procs, proc_id=killed):
            break
        assert time.monotonic() < deadline, procs
        time.sleep(0.05)
    assert value(procs, proc_id=killed) == 1
    assert not any(matching(procs, proc_id=proc_id) for proc_id in calm_ids)
    actors = metrics.points("regency.actor.failures")
    (point,) = matching(actors, mesh="doomed")
    assert point.value == 1 and point.attributes["regency.rank"] == 0
    assert point.attributes["regency.actor_class"] == STUCK
    # Counted once, however often it is collected.
    assert value(metrics.points("regency.actor.failures"), mesh="doomed") == 1
    assert value(metrics.points("regency.proc.failures"), proc_id=killed) == 1
    # The dead actor's calls are still counted (it handled one ping, then the fail).
    handled = metrics.points("regency.messages.handled")
    assert value(handled, mesh="doomed", rank=0, endpoint="ping") == 1
    assert value(handled, mesh="doomed", rank=0, endpoint="fail", outcome="error") == 1


def test_a_prometheus_scrape(metered: ProcMesh) -> None:
    pytest.importorskip("opentelemetry.exporter.prometheus")
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    try:
        reader = PrometheusMetricReader(registry=registry)
    except TypeError:  # an older exporter: the global registry (its shutdown unregisters it)
        registry = REGISTRY
        reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instruments = telemetry.instrument(provider)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        mesh = metered.spawn("scraped", Stuck)
        for _ in range(5):
            mesh.ping.call().get(T)
        mesh.hang.call("/", -1).get(T)  # "/" exists: it returns at once
        port = server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=T) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(T)
        instruments.close()
        provider.shutdown()
    lines = [line for line in text.splitlines() if line.startswith("regency_messages_handled_total{")]
    labels = (
        f'regency_actor_class="{STUCK}"', 'regency_mesh="scraped"', 'regency_rank="1"',
        'regency_endpoint="ping"', 'regency_outcome="ok"',
    )
    found = [line for line in lines if all(label in line for label in labels)]
    assert len(found) == 1, text
    assert float(found[0].rsplit(" ", 1)[1]) == 5.0
    assert "regency_handler_duration" in text and "_bucket{" in text
    assert "regency_mailbox_depth{" in text
    assert "regency_messages_sent_total{" in text
    assert "regency_bytes_sent" in text


def test_metrics_off_keeps_nothing_in_procs(
    spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    configured(metrics=False)
    pm = spawn_procs({"gpus": 2})
    mesh = pm.spawn("unmetered", Stuck)
    for _ in range(3):
        mesh.ping.call().get(T)
    addresses = {p.address for p in regency.stacks(pm).procs}
    rt = current_runtime()
    answers = [p for p in collect(rt, T) if p.address in addresses]
    assert len(answers) == 2
    for proc in answers:
        assert proc.answered and not proc.enabled
        assert proc.actors == () and proc.sent == () and proc.casts == ()
        assert proc.failed_children == ()
