"""Monarch's ``monarch.config``, under ``regency.config``.

``configure(**settings)`` takes Regency's own keys (see :class:`regency.core.Config`) and the
keys of Monarch's ``configure`` that mean something here, translated: durations may be
Monarch's strings (``"30s"``, ``"1m 30s"``, ``"500ms"``) or seconds. A Monarch key that has
no meaning in Regency raises ``TypeError`` naming it and saying why, instead of being
ignored: a setting that silently does nothing is worse than an error.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import functools
import inspect
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import attrs

from .core._config import Config, current_config, overridden
from .core._config import configure as _configure_native
from .core._config import reset_overrides as _reset_overrides
from .core._config import runtime_overrides as _runtime_overrides

__all__ = [
    "ChannelTransport",
    "Encoding",
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


_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "d": 86400.0,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zµ]+)\s*")


def parse_duration(key: str, value: Any) -> float:
    """Seconds from a number or a Monarch duration string (``"1m 30s"``, ``"250ms"``)."""
    if isinstance(value, bool):
        raise TypeError(
            f"{key} must be a duration such as '30s' or a number of seconds (got {value!r})"
        )
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{key} must be a duration such as '30s' or a number of seconds (got {value!r})"
        )
    pos, total = 0, 0.0
    text = value.strip()
    while pos < len(text):
        part = _PART.match(text, pos)
        if part is None or part.group(2) not in _UNITS:
            raise ValueError(
                f"{key} must be a duration such as '30s', '1m 30s' or '500ms' (got {value!r})"
            )
        total += float(part.group(1)) * _UNITS[part.group(2)]
        pos = part.end()
    if not text:
        raise ValueError(f"{key} must be a duration such as '30s' (got an empty string)")
    return total


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
}


def _translate(settings: dict[str, Any]) -> dict[str, Any]:
    if settings.get("rdma_disable_ibverbs") is True and settings.get("rdma_allow_tcp_fallback") is False:
        raise ValueError(
            "rdma_disable_ibverbs=True with rdma_allow_tcp_fallback=False leaves no way to move "
            "RDMA bytes; drop one of them"
        )
    native = {f.name for f in attrs.fields(Config)}
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key in _MONARCH_KEYS:
            name, translated = _MONARCH_KEYS[key](key, value)
            if name == "":
                continue  # a setting Regency always has (checked above)
            if name not in native:
                raise TypeError(f"configuration key {key!r} is not available in this build")
            out[name] = translated
        elif key in native:
            out[key] = value
        elif key in _NOT_HERE:
            raise TypeError(
                f"configuration key {key!r} is Monarch's and does not apply to Regency: "
                f"{_NOT_HERE[key]}"
            )
        else:
            valid = sorted(native | set(_MONARCH_KEYS))
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"unknown configuration key {key!r}{hint}; valid keys: {valid}")
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
    """Every setting in effect (configured, from ``REGENCY_*`` variables, or default), and
    Monarch's RDMA switches as they follow from ``rdma_backend`` (Monarch programs and test
    helpers read ``rdma_disable_ibverbs`` and ``rdma_allow_tcp_fallback`` back)."""
    settings = attrs.asdict(current_config())
    backend = settings["rdma_backend"]
    settings["rdma_disable_ibverbs"] = backend == "tcp"
    settings["rdma_allow_tcp_fallback"] = backend != "ibverbs"
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
