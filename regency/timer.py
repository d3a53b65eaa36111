"""Timing sections of code on the CPU or the GPU: Monarch's ``monarch.timer``.

``ExecutionTimer.time("step")`` (or ``execution_timer_start``/``execution_timer_stop``)
measures a section each time it runs: with CUDA events on the current stream when torch sees
a GPU (the time the GPU spent between the two points, read without blocking the caller),
else, or with ``use_cpu=True``, with ``time.perf_counter``. ``ExecutionTimer.summary()``
gives count, mean, total, min and max per section, in milliseconds.
``get_execution_timer_average_ms`` and ``get_latest_timer_measurement`` answer as 0-dim
float64 tensors, so they can serve as remote functions of the tensor engine. Each process
(each proc) keeps its own measurements. torch is imported only where a GPU or a tensor is
involved: CPU timing works without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_latest_timer_measurement",
]

log = logging.getLogger(__name__)

_DEFAULT = "default"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class ExecutionTimer:
    """Per-process timings of named sections (class methods only; ``name`` defaults to
    ``"default"``). Sections may nest, and the same name may be open more than once (a stop
    closes the latest start)."""

    #: Whether sections are timed on the GPU (decided on first use; False without torch).
    _enable_cuda: ClassVar[bool | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _times: ClassVar[dict[str, list[float]]] = {}
    _cpu_starts: ClassVar[dict[str, list[float]]] = {}
    _events: ClassVar[dict[str, list[tuple[Any, Any, Any]]]] = {}
    _threads: ClassVar[dict[str, list[threading.Thread]]] = {}
    _cuda_warning_shown: ClassVar[bool] = False

    @classmethod
    def _use_cuda(cls, use_cpu: bool) -> bool:
        if cls._enable_cuda is None:
            cls._enable_cuda = _cuda_available()
        if not cls._enable_cuda and not use_cpu and not cls._cuda_warning_shown:
            log.warning("CUDA not available, falling back to CPU timing")
            cls._cuda_warning_shown = True
        return bool(cls._enable_cuda) and not use_cpu

    @classmethod
    @contextmanager
    def time(cls, name: str | None = None, use_cpu: bool = False) -> Iterator[None]:
        """Time the ``with`` block as section ``name``."""
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @classmethod
    def start(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """Start a measurement of section ``name``."""
        name = name or _DEFAULT
        with cls._lock:
            cls._times.setdefault(name, [])
        if not cls._use_cuda(use_cpu):
            with cls._lock:
                cls._cpu_starts.setdefault(name, []).append(time.perf_counter())
            return
        import torch

        stream = torch.cuda.current_stream()
        start_event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end_event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start_event.record(stream)
        with cls._lock:
            cls._events.setdefault(name, []).append((start_event, end_event, stream))

    @classmethod
    def stop(cls, name: str | None = None, use_cpu: bool = False) -> None:
        """End the latest measurement of section ``name`` (``use_cpu`` as at its start)."""
        name = name or _DEFAULT
        if not cls._use_cuda(use_cpu):
            end = time.perf_counter()
            with cls._lock:
                starts = cls._cpu_starts.get(name)
                if not starts:
                    raise RuntimeError(f"No CPU start time found for {name}, did you run start()?")
                cls._times[name].append((end - starts.pop()) * 1000)
            return
        with cls._lock:
            events = cls._events.get(name)
            if not events:
                raise RuntimeError(f"No CUDA start event found for {name}, did you run start()?")
            start_event, end_event, stream = events.pop()
        end_event.record(stream)
        # The GPU reaches the end event later: a thread waits for it, not the caller.
        thread = threading.Thread(
            target=cls._record_when_done, args=(name, start_event, end_event), daemon=True
        )
        thread.start()
        with cls._lock:
            cls._threads.setdefault(name, []).append(thread)

    @classmethod
    def _record_when_done(cls, name: str, start_event: Any, end_event: Any) -> None:
        while not end_event.query():
            time.sleep(0.01)
        elapsed = float(start_event.elapsed_time(end_event))
        with cls._lock:
            cls._times.setdefault(name, []).append(elapsed)

    @classmethod
    def _join(cls, name: str | None = None) -> None:
        with cls._lock:
            if name is None:
                threads = [t for ts in cls._threads.values() for t in ts]
                cls._threads = {}
            else:
                threads = cls._threads.pop(name, [])
        for thread in threads:
            thread.join()

    @classmethod
    def reset(cls) -> None:
        """Forget every measurement (and every open start)."""
        cls._join()
        with cls._lock:
            cls._times = {}
            cls._cpu_starts = {}
            cls._events = {}

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        """Per section with measurements: ``count``, ``mean_ms``, ``total_ms``, ``min_ms``,
        ``max_ms`` (waits for GPU measurements still in flight)."""
        cls._join()
        with cls._lock:
            return {
                name: {
                    "count": len(times),
                    "mean_ms": sum(times) / len(times),
                    "total_ms": sum(times),
                    "min_ms": min(times),
                    "max_ms": max(times),
                }
                for name, times in cls._times.items()
                if times
            }

    @classmethod
    def get_latest_measurement(cls, name: str | None = None) -> float:
        """The latest measurement of section ``name`` in ms (0.0, with a warning, when it has
        none)."""
        name = name or _DEFAULT
        cls._join(name)
        with cls._lock:
            times = cls._times.get(name)
            if not times:
                log.warning("Section %s not found in timing data.", name)
                return 0.0
            return times[-1]


def execution_timer_start(name: str | None = None, use_cpu: bool = False) -> None:
    """``ExecutionTimer.start``."""
    ExecutionTimer.start(name=name, use_cpu=use_cpu)


def execution_timer_stop(name: str | None = None, use_cpu: bool = False) -> None:
    """``ExecutionTimer.stop``."""
    ExecutionTimer.stop(name=name, use_cpu=use_cpu)


def get_execution_timer_average_ms(name: str = _DEFAULT) -> Any:
    """The mean of section ``name`` in ms, as a 0-dim float64 ``torch.Tensor`` (KeyError
    when it has no measurement)."""
    import torch

    return torch.tensor(ExecutionTimer.summary()[name]["mean_ms"], dtype=torch.float64)


def get_latest_timer_measurement(name: str | None = None) -> Any:
    """The latest measurement of section ``name`` in ms, as a 0-dim float64 tensor."""
    import torch

    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)
