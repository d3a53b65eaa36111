"""Monarch's ``monarch.config``, under ``regency.config``.

``configure(**settings)`` takes Regency's own keys (see :class:`regency.core.Config`) and the
keys of Monarch's ``configure`` that mean something here, translated: durations may be
Monarch's strings (``"30s"``, ``"1m 30s"``, ``"500ms"``) or seconds. ``get_global_config``
reports those Monarch keys back under their names, in Monarch's form. A Monarch key that has
no meaning in Regency raises ``TypeError`` naming it and saying why, instead of being
ignored: a setting that silently does nothing is worse than an error. A key that neither
has raises :class:`UnknownConfigKeyError` (a ``ValueError``, as Monarch raises, and a
``TypeError``).
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import fractions
import functools
import inspect
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import attrs

from .core._config import Config, UnknownConfigKeyError, current_config, overridden
from .core._config import configure as _configure_native
from .core._config import reset_overrides as _reset_overrides
from .core._config import runtime_overrides as _runtime_overrides

__all__ = [
    "ChannelTransport",
    "DurationFormatError",
    "Encoding",
    "UnknownConfigKeyError",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]


class ChannelTransport(enum.Enum):
    """Monarch's kinds of channel (``monarch.actor.ChannelTransport``), with Monarch's values.

    ``configure(default_transport=...)`` and :func:`regency.actor.enable_transport` take them
    and use the Regency transport of :attr:`regency_transport`: ``Unix`` and ``Local`` the
    unix sockets (a proc's own actors talk in-process anyway), both ``Tcp...`` kinds
    ``tcp`` (procs listen on ``tcp_host``; a controller attached to workers listens where
    they reach it), and the TLS kinds nng over TLS (certificates from ``REGENCY_TLS_*``;
    docs/transports.md)."""

    TcpWithLocalhost = "tcp(localhost)"
    TcpWithHostname = "tcp(hostname)"
    MetaTlsWithHostname = "metatls(hostname)"
    MetaTlsWithIpV6 = "metatls(ipv6)"
    Tls = "tls"
    Local = "local"
    Unix = "unix"

    @property
    def regency_transport(self) -> str:
        """The ``default_transport`` this kind of channel means in Regency."""
        return _CHANNEL_TRANSPORTS[self]


_CHANNEL_TRANSPORTS = {
    ChannelTransport.TcpWithLocalhost: "tcp",
    ChannelTransport.TcpWithHostname: "tcp",
    ChannelTransport.MetaTlsWithHostname: "nng+tls+tcp",
    ChannelTransport.MetaTlsWithIpV6: "nng+tls+tcp",
    ChannelTransport.Tls: "nng+tls+tcp",
    ChannelTransport.Local: "unix",
    ChannelTransport.Unix: "unix",
}


class Encoding(enum.Enum):
    """Monarch's message encodings (``monarch.config.Encoding``). Regency has one codec
    (pickle protocol 5, big buffers out of band), so ``configure(default_encoding=...)``
    refuses every value with that reason; the enum exists so that Monarch code that names it
    imports."""

    Bincode = 0
    Json = 1
    Multipart = 2


class DurationFormatError(TypeError, ValueError):
    """A duration string that does not parse (``"30"``, ``"soon"``). A ``TypeError``, as
    Monarch's ``configure`` raises for it, and a ``ValueError``, as for any other bad value
    here, so either ``except`` catches it. The message starts "Invalid duration format", as
    Monarch's does, and names the key."""


_NS_PER_S = 1_000_000_000
#: Seconds in Monarch's (humantime's) month (30.44 days) and year (365.25 days).
_MONTH_S = 2_630_016
_YEAR_S = 31_557_600
#: Nanoseconds per unit, with every spelling of Monarch's (humantime's) parser.
_UNITS: dict[str, int] = {
    **dict.fromkeys(("ns", "nsec", "nanos"), 1),
    **dict.fromkeys(("us", "µs", "usec"), 1_000),
    **dict.fromkeys(("ms", "msec", "millis"), 1_000_000),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), _NS_PER_S),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60 * _NS_PER_S),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600 * _NS_PER_S),
    **dict.fromkeys(("d", "day", "days"), 86_400 * _NS_PER_S),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 7 * 86_400 * _NS_PER_S),
    **dict.fromkeys(("M", "month", "months"), _MONTH_S * _NS_PER_S),
    **dict.fromkeys(("y", "yr", "yrs", "year", "years"), _YEAR_S * _NS_PER_S),
}
_NUMBER = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")
_UNIT = re.compile(r"[A-Za-zµ]+")


def _bad_duration(key: str, value: str, reason: str) -> DurationFormatError:
    return DurationFormatError(
        f"Invalid duration format for {key}: {value!r} ({reason}); give a duration such as "
        "'30s', '1m 30s' or '500ms', or a number of seconds"
    )


def parse_duration(key: str, value: Any) -> float:
    """Seconds from a number or a Monarch duration string: numbers with units, summed
    (``"1m 30s"``, ``"1h30m"``, ``"1.5s"``, ``"250ms"``), with the units of Monarch's parser.
    Numbers (seconds) are Regency's own addition: Monarch takes strings only."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(
            f"{key} must be a duration such as '30s' or a number of seconds (got {value!r})"
        )
    if not isinstance(value, str):
        return float(value)
    if not value.strip():
        raise _bad_duration(key, value, "value was empty")
    pos, total = 0, fractions.Fraction(0)
    while pos < len(value) and not value[pos:].isspace():
        number = _NUMBER.match(value, pos)
        if number is None:
            raise _bad_duration(key, value, f"expected a number at {pos}")
        unit = _UNIT.match(value, number.end())
        if unit is None:
            if number.end() == len(value):
                raise _bad_duration(key, value, "time unit needed")
            raise _bad_duration(key, value, f"expected a time unit at {number.end()}")
        if unit.group() not in _UNITS:
            raise _bad_duration(key, value, f"unknown time unit {unit.group()!r}")
        total += fractions.Fraction(number.group(1)) * _UNITS[unit.group()]
        pos = unit.end()
    if total.denominator != 1:
        raise _bad_duration(key, value, "values below 1ns are not supported")
    return total.numerator / _NS_PER_S


def format_duration(seconds: float) -> str:
    """A duration as Monarch's ``get_global_config`` writes it (humantime's form): from
    years down to nanoseconds, each non-zero part once, largest first: 90 s is
    ``"1m 30s"``, 1.5 s ``"1s 500ms"``, 2 days ``"2days"``, 0 ``"0s"``."""
    total = round(seconds * _NS_PER_S)
    if total <= 0:
        return "0s"
    secs, nanos = divmod(total, _NS_PER_S)
    years, secs = divmod(secs, _YEAR_S)
    months, secs = divmod(secs, _MONTH_S)
    days, secs = divmod(secs, 86_400)
    hours, secs = divmod(secs, 3_600)
    minutes, secs = divmod(secs, 60)
    millis, nanos = divmod(nanos, 1_000_000)
    micros, nanos = divmod(nanos, 1_000)
    parts = [
        f"{n}{name}{'s' if n > 1 else ''}"
        for n, name in ((years, "year"), (months, "month"), (days, "day"))
        if n
    ]
    parts += [
        f"{n}{unit}"
        for n, unit in (
            (hours, "h"), (minutes, "m"), (secs, "s"), (millis, "ms"), (micros, "us"),
            (nanos, "ns"),
        )
        if n
    ]
    return " ".join(parts)


def _same(name: str) -> Callable[[str, Any], tuple[str, Any]]:
    return lambda key, value: (name, value)


def _seconds(name: str) -> Callable[[str, Any], tuple[str, Any]]:
    return lambda key, value: (name, parse_duration(key, value))


def _always_on(key: str, value: Any) -> tuple[str, Any]:
    if value is not True:
        raise ValueError(
            f"{key}={value!r}: Regency procs always die with their parent (parent-death "
            "signal locally, leases on workers); it cannot be switched off"
        )
    return ("", None)


def _orphan_timeout(key: str, value: Any) -> tuple[str, Any]:
    if value is None:
        # Monarch's None keeps orphans forever; Regency's procs never outlive their controller
        # for longer than the lease.
        raise ValueError(
            f"{key}=None: Regency procs always die when their controller is gone (at once on "
            "this machine, after the worker_lease on workers); give a number of seconds"
        )
    return ("worker_lease", parse_duration(key, value))


def _no_ibverbs(key: str, value: Any) -> tuple[str, Any]:
    if not isinstance(value, bool):
        raise TypeError(f"{key} must be True or False (got {value!r})")
    # Monarch without ibverbs moves RDMA bytes over its TCP fallback; so does this.
    return ("rdma_backend", "tcp") if value else ("", None)


def _tcp_fallback(key: str, value: Any) -> tuple[str, Any]:
    if not isinstance(value, bool):
        raise TypeError(f"{key} must be True or False (got {value!r})")
    # No fallback means RDMA over ibverbs only (transfers fail with the reason without a NIC).
    return ("", None) if value else ("rdma_backend", "ibverbs")


def _transport(key: str, value: Any) -> tuple[str, Any]:
    if isinstance(value, ChannelTransport):
        return ("default_transport", value.regency_transport)
    name = getattr(value, "name", value)  # Monarch passes a ChannelTransport or a string
    text = str(name).lower()
    text = {
        "metatls": "nng+tls+tcp",
        "metatls-hostname": "nng+tls+tcp",
        "tls": "nng+tls+tcp",
        "local": "unix",
        "ipc": "unix",
    }.get(text, text)
    return ("default_transport", text)


#: Monarch's keys that apply here, and how they translate.
_MONARCH_KEYS: dict[str, Callable[[str, Any], tuple[str, Any]]] = {
    "default_transport": _transport,
    "enable_log_forwarding": _same("enable_log_forwarding"),
    "enable_file_capture": _same("enable_file_capture"),
    "tail_log_lines": _same("tail_log_lines"),
    "codec_max_frame_length": _same("max_frame_bytes"),
    "message_delivery_timeout": _seconds("delivery_timeout"),
    "host_spawn_ready_timeout": _seconds("spawn_timeout"),
    "mesh_proc_spawn_max_idle": _seconds("spawn_timeout"),
    "process_exit_timeout": _seconds("stop_timeout"),
    "stop_actor_timeout": _seconds("stop_timeout"),
    "mesh_terminate_timeout": _seconds("stop_timeout"),
    "cleanup_timeout": _seconds("cleanup_timeout"),
    "supervision_watchdog_timeout": _seconds("heartbeat_timeout"),
    # How long attaching waits for a worker, and how long a worker's procs outlive a
    # controller it no longer hears from (the lease; docs/porting.md).
    "mesh_attach_config_timeout": _seconds("attach_timeout"),
    "mesh_orphan_timeout": _orphan_timeout,
    "mesh_bootstrap_enable_pdeathsig": _always_on,
    "rdma_disable_ibverbs": _no_ibverbs,
    "rdma_allow_tcp_fallback": _tcp_fallback,
    # Monarch bounds a cast tree's fan-out by reshaping dims to at most this size.
    "max_cast_dimension_size": _same("cast_fanout"),
}

def _duration(name: str) -> Callable[[Config], Any]:
    def read(config: Config) -> Any:
        seconds: float = getattr(config, name)
        # Monarch has no form for an unbounded duration; such a setting reads as seconds.
        return format_duration(seconds) if math.isfinite(seconds) else seconds

    return read


def _field(name: str) -> Callable[[Config], Any]:
    return lambda config: getattr(config, name)


#: What :func:`get_global_config` reports under Monarch's names, in Monarch's form (durations
#: as Monarch writes them), read from the Regency setting each one sets. Monarch's keys that
#: are also Regency's names and values (``tail_log_lines``, ...) need no entry;
#: ``cleanup_timeout`` is Regency's name too, and reads in Monarch's form.
_MONARCH_READS: dict[str, Callable[[Config], Any]] = {
    "codec_max_frame_length": _field("max_frame_bytes"),
    "message_delivery_timeout": _duration("delivery_timeout"),
    "host_spawn_ready_timeout": _duration("spawn_timeout"),
    "mesh_proc_spawn_max_idle": _duration("spawn_timeout"),
    "process_exit_timeout": _duration("stop_timeout"),
    "stop_actor_timeout": _duration("stop_timeout"),
    "mesh_terminate_timeout": _duration("stop_timeout"),
    "cleanup_timeout": _duration("cleanup_timeout"),
    "supervision_watchdog_timeout": _duration("heartbeat_timeout"),
    "mesh_attach_config_timeout": _duration("attach_timeout"),
    "mesh_orphan_timeout": _duration("worker_lease"),
    "mesh_bootstrap_enable_pdeathsig": lambda config: True,
    "rdma_disable_ibverbs": lambda config: config.rdma_backend == "tcp",
    "rdma_allow_tcp_fallback": lambda config: config.rdma_backend != "ibverbs",
    "max_cast_dimension_size": _field("cast_fanout"),
}

#: Monarch's keys that have no meaning in Regency, and why.
_NOT_HERE = {
    "message_ack_time_interval": "acknowledgement cadence is internal to delivery sessions",
    "message_ack_every_n_messages": "acknowledgement cadence is internal to delivery sessions",
    "message_ttl_default": "Regency messages have no TTL; delivery_timeout bounds a link",
    "split_max_buffer_size": "Regency batches writes per connection without a split buffer",
    "split_max_buffer_age": "Regency batches writes per connection without a split buffer",
    "default_encoding": "Regency's codec is pickle protocol 5 with out-of-band buffers",
    "channel_net_rx_buffer_full_check_interval": "no such buffer in Regency's transports",
    "channel_tcp_congestion": "no such setting in Regency's transports",
    "message_latency_sampling_rate": "Regency does not sample message latency",
    "enable_dest_actor_reordering_buffer": "Regency's delivery is in order per sender already",
    "mesh_terminate_concurrency": "procs are stopped all at once",
    "small_write_threshold": "no such threshold in Regency's transports",
    "remote_alloc_bind_to_inaddr_any": "workers listen on the address given to `regency worker`",
    "remote_alloc_bootstrap_addr": "workers listen on the address given to `regency worker`",
    "remote_alloc_allowed_port_range": "procs bind port 0 and report the port they got",
    "read_log_buffer": "no such buffer in Regency's log forwarding",
    "force_file_log": "Regency logs through Python's logging; configure its handlers",
    "prefix_with_rank": "forwarded lines always carry their rank",
    "actor_spawn_max_idle": "spawn_timeout bounds a spawn",
    "get_actor_state_max_idle": "Regency has no actor-state query",
    "proc_stop_max_idle": "stop_timeout bounds stopping a proc",
    "get_proc_state_max_idle": "Regency has no proc-state query",
    "mesh_admin_addr": "Regency has no mesh admin server; regency.serve_dashboard(port, "
    "host=...) takes the dashboard's address",
    "pyspy_bin": "procs report their own stacks (regency.stacks()); no py-spy runs",
    **dict.fromkeys(
        (
            "rdma_max_chunk_size_mb", "rdma_ibverbs_target", "rdma_peer_device_affinity",
            "rdma_max_nics_per_buffer", "rdma_min_stripe_size_kb", "rdma_qps_per_cq",
            "rdma_cq_poller_per_device", "rdma_runtime_worker_threads",
        ),
        "Regency's RDMA has no such setting; rdma_backend picks how bytes move (docs/rdma.md)",
    ),
}


def _translate(settings: dict[str, Any]) -> dict[str, Any]:
    if settings.get("rdma_disable_ibverbs") is True and settings.get("rdma_allow_tcp_fallback") is False:
        raise ValueError(
            "rdma_disable_ibverbs=True with rdma_allow_tcp_fallback=False leaves no way to move "
            "RDMA bytes; drop one of them"
        )
    native = {f.name for f in attrs.fields(Config)}
    out: dict[str, Any] = {}
    set_by: dict[str, str] = {}  # Regency's key -> the key given for it
    for key, value in settings.items():
        if key in _MONARCH_KEYS:
            name, translated = _MONARCH_KEYS[key](key, value)
            if name == "":
                continue  # a setting Regency always has (checked above)
            if name not in native:
                raise TypeError(f"configuration key {key!r} is not available in this build")
        elif key in native:
            name, translated = key, value
        elif key in _NOT_HERE:
            raise TypeError(
                f"configuration key {key!r} is Monarch's and does not apply to Regency: "
                f"{_NOT_HERE[key]}"
            )
        else:
            valid = sorted(native | set(_MONARCH_KEYS))
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownConfigKeyError(
                f"unknown configuration key {key!r}{hint}; valid keys: {valid}"
            )
        if name in out and out[name] != translated:
            other = set_by[name]
            raise ValueError(
                f"{other}={settings[other]!r} and {key}={value!r} both set Regency's "
                f"{name}, to different values; give one of them"
            )
        out[name] = translated
        set_by[name] = key
    return out


def configure(**settings: Any) -> None:
    """Set configuration for this process and the procs it spawns from now on (Regency's
    keys, or Monarch's where they apply). Nothing is applied when any key is refused."""
    _configure_native(**_translate(settings))


@contextlib.contextmanager
def configured(**settings: Any) -> Iterator[dict[str, Any]]:
    """Apply ``configure(**settings)`` inside a ``with`` block, then restore what was set
    before. Yields the configuration in effect, as :func:`get_global_config` does."""
    with overridden(**_translate(settings)):
        yield get_global_config()


def get_global_config() -> dict[str, Any]:
    """Every setting in effect (configured, from ``REGENCY_*`` variables, or default) under
    Regency's names, and the Monarch keys that mean something here under Monarch's names and
    in Monarch's form (``"process_exit_timeout": "5s"``, ``"supervision_watchdog_timeout":
    "1m 30s"``), read from the Regency setting each one sets. Monarch programs and test
    helpers read these back. ``cleanup_timeout``, a name both share, reads as Monarch's
    ``"3s"``; ``current_config().cleanup_timeout`` has the seconds."""
    config = current_config()
    settings = attrs.asdict(config)
    settings.update({key: read(config) for key, read in _MONARCH_READS.items()})
    return settings


def get_runtime_config() -> dict[str, Any]:
    """Only the settings made with :func:`configure` in this process."""
    return _runtime_overrides()


def clear_runtime_config() -> None:
    """Forget every :func:`configure` setting: back to ``REGENCY_*`` variables and defaults."""
    _reset_overrides()


def parametrize_config(**options: Iterable[Any]) -> Callable[[_F], _F]:
    """A pytest decorator: run the test once per combination (cartesian product) of the
    given settings, each run inside ``configured(...)``. Keys are checked now, so a typo fails
    at collection instead of running the test under the defaults."""
    if not options:
        raise ValueError("parametrize_config needs at least one setting to vary")
    keys = list(options)
    return _parametrize(keys, list(itertools.product(*(list(options[k]) for k in keys))))


def parametrize_config_pointwise(**options: Sequence[Any]) -> Callable[[_F], _F]:
    """Like :func:`parametrize_config`, but the i-th run takes the i-th value of every
    setting (all sequences must have the same length)."""
    if not options:
        raise ValueError("parametrize_config_pointwise needs at least one setting to vary")
    keys = list(options)
    lengths = {k: len(options[k]) for k in keys}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"parametrize_config_pointwise needs sequences of one length (got {lengths})"
        )
    return _parametrize(keys, list(zip(*(options[k] for k in keys), strict=True)))


_F = TypeVar("_F", bound=Callable[..., Any])


def _parametrize(keys: list[str], rows: list[tuple[Any, ...]]) -> Callable[[_F], _F]:
    import pytest

    settings = [dict(zip(keys, row, strict=True)) for row in rows]
    for one in settings:
        _translate(one)  # refuse unknown or inapplicable keys before any test runs
    ids = ["-".join(f"{k}={v}" for k, v in one.items()) for one in settings]

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)
        extra = inspect.Parameter("_regency_config", inspect.Parameter.KEYWORD_ONLY)
        wrapped_signature = signature.replace(parameters=[*signature.parameters.values(), extra])
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, _regency_config: dict[str, Any], **kwargs: Any) -> Any:
                with configured(**_regency_config):
                    return await fn(*args, **kwargs)

            wrapper: Any = run_async
        else:

            @functools.wraps(fn)
            def run(*args: Any, _regency_config: dict[str, Any], **kwargs: Any) -> Any:
                with configured(**_regency_config):
                    return fn(*args, **kwargs)

            wrapper = run
        wrapper.__signature__ = wrapped_signature
        return cast(_F, pytest.mark.parametrize("_regency_config", settings, ids=ids)(wrapper))

    return decorate
