"""Monarch 0.7's configuration API on Regency: Monarch's keys read back under their names and
in Monarch's form, the errors of unknown keys and bad durations (types that satisfy both
runtimes' ``except``), and what stays refused. Expected values were read from Monarch 0.7
(``torchmonarch==0.7.0``) itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import regency
from regency import config
from regency.config import (
    DurationFormatError,
    UnknownConfigKeyError,
    configure,
    configured,
    format_duration,
    get_global_config,
    parse_duration,
)
from regency.core import _config
from regency.core._config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Defaults only (no ``REGENCY_*`` variable, nothing configured); what was configured
    comes back afterwards."""
    for field in attrs.fields(Config):
        monkeypatch.delenv(f"REGENCY_{field.name.upper()}", raising=False)
    saved = config.get_runtime_config()
    config.clear_runtime_config()
    try:
        yield
    finally:
        config.clear_runtime_config()
        configure(**saved)


# -- durations in Monarch's form -------------------------------------------------------------

# (given, what Monarch 0.7's get_global_config reads back), each checked against Monarch.
MONARCH_READBACK = [
    ("30s", "30s"),
    ("90s", "1m 30s"),
    ("120s", "2m"),
    ("300s", "5m"),
    ("500ms", "500ms"),
    ("0.5s", "500ms"),
    ("1.5s", "1s 500ms"),
    ("1500ms", "1s 500ms"),
    ("1h30m", "1h 30m"),
    ("1 h 30 m", "1h 30m"),
    ("1.5h", "1h 30m"),
    ("3661s", "1h 1m 1s"),
    ("61m", "1h 1m"),
    ("2m 0s", "2m"),
    ("1h 1h", "2h"),
    ("1 s 2 m", "2m 1s"),
    (" 1s ", "1s"),
    ("1sec1ms", "1s 1ms"),
    ("100us", "100us"),
    ("1µs", "1us"),
    ("0.001ms", "1us"),
    ("1ns", "1ns"),
    ("1nanos", "1ns"),
    ("1millis", "1ms"),
    ("30sec", "30s"),
    ("1seconds", "1s"),
    ("1min", "1m"),
    ("1 hour", "1h"),
    ("1hrs", "1h"),
    ("1d", "1day"),
    ("2d", "2days"),
    ("25h", "1day 1h"),
    ("1w", "7days"),
    ("1wk", "7days"),
    ("1M", "1month"),
    ("2630015s", "30days 10h 33m 35s"),
    ("1y", "1year"),
    ("63115200s", "2years"),
]


@pytest.mark.parametrize(("given_value", "expected"), MONARCH_READBACK)
def test_durations_read_back_as_monarch_writes_them(
    clean: None, given_value: str, expected: str
) -> None:
    with configured(host_spawn_ready_timeout=given_value) as seen:
        assert seen["host_spawn_ready_timeout"] == expected
        assert seen["spawn_timeout"] == parse_duration("x", expected)


def test_numbers_are_seconds_and_read_back_in_monarchs_form(clean: None) -> None:
    # Monarch takes strings only (TypeError for a number); Regency also takes seconds.
    configure(process_exit_timeout=90, cleanup_timeout=0.25, message_delivery_timeout=172800)
    settings = get_global_config()
    assert settings["process_exit_timeout"] == "1m 30s"
    assert settings["cleanup_timeout"] == "250ms"
    assert settings["message_delivery_timeout"] == "2days"
    assert (settings["stop_timeout"], settings["delivery_timeout"]) == (90.0, 172800.0)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 1e-9, 0.1, 59, 60, 3600.5, 86400 * 3)] == [
        "0s", "1ns", "100ms", "59s", "1m", "1h 500ms", "3days"
    ]
    assert format_duration(31_557_600 + 2_630_016 * 2 + 1) == "1year 2months 1s"


@given(st.integers(min_value=0, max_value=10**16))
def test_formatted_durations_parse_back(nanos: int) -> None:
    seconds = nanos / 1e9
    assert parse_duration("k", format_duration(seconds)) == seconds


def test_an_unbounded_duration_reads_as_seconds(clean: None) -> None:
    configure(stop_timeout=float("inf"))
    assert get_global_config()["process_exit_timeout"] == float("inf")


# -- Monarch's names and Regency's, one setting ----------------------------------------------

# Monarch's key, the Regency key it sets, a value to give it, and both read-backs.
PAIRS = [
    ("codec_max_frame_length", "max_frame_bytes", 1 << 20, 1 << 20, 1 << 20),
    ("message_delivery_timeout", "delivery_timeout", "45s", "45s", 45.0),
    ("host_spawn_ready_timeout", "spawn_timeout", "2m", "2m", 120.0),
    ("mesh_proc_spawn_max_idle", "spawn_timeout", "2m", "2m", 120.0),
    ("process_exit_timeout", "stop_timeout", "20s", "20s", 20.0),
    ("stop_actor_timeout", "stop_timeout", "15s", "15s", 15.0),
    ("mesh_terminate_timeout", "stop_timeout", "7500ms", "7s 500ms", 7.5),
    ("cleanup_timeout", "cleanup_timeout", "25s", "25s", "25s"),
    ("supervision_watchdog_timeout", "heartbeat_timeout", "90s", "1m 30s", 90.0),
    ("mesh_attach_config_timeout", "attach_timeout", "20s", "20s", 20.0),
    ("mesh_orphan_timeout", "worker_lease", "1m", "1m", 60.0),
    ("max_cast_dimension_size", "cast_fanout", 32, 32, 32),
]


@pytest.mark.parametrize(("monarch", "regency_key", "value", "as_monarch", "as_regency"), PAIRS)
def test_a_monarch_key_and_its_regency_key_are_one_setting(
    clean: None, monarch: str, regency_key: str, value: object, as_monarch: object,
    as_regency: object,
) -> None:
    default = get_global_config()
    with configured(**{monarch: value}) as seen:
        assert (seen[monarch], seen[regency_key]) == (as_monarch, as_regency)
    assert get_global_config() == default
    # ... and the other way round: Regency's key shows through Monarch's name.
    native = parse_duration(regency_key, as_monarch) if isinstance(as_monarch, str) else value
    with configured(**{regency_key: native}) as seen:
        assert seen[monarch] == as_monarch
    assert get_global_config() == default


def test_defaults_under_monarchs_names_are_regencys(clean: None) -> None:
    settings = get_global_config()
    monarch = {
        key: settings[key]
        for key in (
            "codec_max_frame_length", "message_delivery_timeout", "host_spawn_ready_timeout",
            "mesh_proc_spawn_max_idle", "process_exit_timeout", "stop_actor_timeout",
            "mesh_terminate_timeout", "cleanup_timeout", "supervision_watchdog_timeout",
            "mesh_attach_config_timeout", "mesh_orphan_timeout", "max_cast_dimension_size",
            "mesh_bootstrap_enable_pdeathsig", "rdma_disable_ibverbs", "rdma_allow_tcp_fallback",
            "enable_log_forwarding", "enable_file_capture", "tail_log_lines",
        )
    }
    assert monarch == {
        "codec_max_frame_length": 1 << 31,
        "message_delivery_timeout": "10s",
        "host_spawn_ready_timeout": "1m",
        "mesh_proc_spawn_max_idle": "1m",
        "process_exit_timeout": "5s",
        "stop_actor_timeout": "5s",
        "mesh_terminate_timeout": "5s",
        "cleanup_timeout": "3s",  # Monarch's too
        "supervision_watchdog_timeout": "10s",
        "mesh_attach_config_timeout": "1m",  # Monarch's too
        "mesh_orphan_timeout": "10s",
        "max_cast_dimension_size": 16,  # Monarch's too
        "mesh_bootstrap_enable_pdeathsig": True,  # Monarch's too; always so here
        "rdma_disable_ibverbs": False,
        "rdma_allow_tcp_fallback": True,
        "enable_log_forwarding": False,
        "enable_file_capture": False,
        "tail_log_lines": 0,
    }
    # Regency's own keys keep Regency's values (seconds).
    assert (settings["stop_timeout"], settings["spawn_timeout"]) == (5.0, 60.0)
    # Monarch keys with no meaning here are not reported (a value would be a fiction).
    assert "message_ack_time_interval" not in settings and "default_encoding" not in settings


def test_environment_shows_through_monarchs_names(
    clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGENCY_STOP_TIMEOUT", "150")
    config.clear_runtime_config()
    assert get_global_config()["process_exit_timeout"] == "2m 30s"


def test_conflicting_values_for_one_setting_are_refused(clean: None) -> None:
    before = config.get_runtime_config()
    with pytest.raises(ValueError, match=re.escape(
        "host_spawn_ready_timeout='300s' and mesh_proc_spawn_max_idle='120s' both set "
        "Regency's spawn_timeout, to different values; give one of them"
    )):
        configure(host_spawn_ready_timeout="300s", mesh_proc_spawn_max_idle="120s")
    with pytest.raises(ValueError, match="stop_timeout=3 and process_exit_timeout='4s' both"):
        configure(stop_timeout=3, process_exit_timeout="4s")
    assert config.get_runtime_config() == before
    # The same value twice is one setting.
    configure(stop_timeout=4, process_exit_timeout="4s", stop_actor_timeout=4.0)
    assert get_global_config()["mesh_terminate_timeout"] == "4s"


# -- errors ----------------------------------------------------------------------------------


def test_an_unknown_key_is_a_value_error_and_a_type_error(clean: None) -> None:
    before = config.get_runtime_config()
    with pytest.raises(UnknownConfigKeyError) as caught, configured(stop_timeout=1, does_not_exist=42):
        pass
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)
    message = str(caught.value)
    assert message.startswith("unknown configuration key 'does_not_exist'; valid keys: [")
    assert "'process_exit_timeout'" in message and "'stop_timeout'" in message
    assert config.get_runtime_config() == before  # nothing applied
    with pytest.raises(ValueError, match=re.escape(
        "unknown configuration key 'process_exit_timout' (did you mean 'process_exit_timeout'?)"
    )):
        regency.configure(process_exit_timout="1s")
    with pytest.raises(TypeError, match=re.escape("unknown configuration keys ['colour']")):
        _config.configure(colour="red")  # the core's configure raises the same type
    assert UnknownConfigKeyError is _config.UnknownConfigKeyError


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("30", "time unit needed"),
        ("1 ", "time unit needed"),
        ("invalid", "expected a number at 0"),
        ("abc123", "expected a number at 0"),
        ("-1s", "expected a number at 0"),
        ("", "value was empty"),
        ("1s,2s", "expected a number at 2"),
        ("1.5.5s", "expected a time unit at 3"),
        ("1H", "unknown time unit 'H'"),
        ("1mo", "unknown time unit 'mo'"),
        ("0.0001ns", "values below 1ns are not supported"),
    ],
)
def test_a_bad_duration_is_a_type_error_and_a_value_error(
    clean: None, value: str, reason: str
) -> None:
    before = config.get_runtime_config()
    with pytest.raises(DurationFormatError) as caught:
        configure(cleanup_timeout="1s", message_delivery_timeout=value)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        f"Invalid duration format for message_delivery_timeout: {value!r} ({reason}); give a "
        "duration such as '30s', '1m 30s' or '500ms', or a number of seconds"
    )
    assert config.get_runtime_config() == before


@pytest.mark.parametrize("value", [True, None, ["30s"]])
def test_a_duration_of_another_type_is_a_type_error(clean: None, value: object) -> None:
    with pytest.raises(TypeError, match=re.escape(
        f"process_exit_timeout must be a duration such as '30s' or a number of seconds "
        f"(got {value!r})"
    )):
        configure(process_exit_timeout=value)


def test_monarch_keys_with_no_meaning_here_stay_refused(clean: None) -> None:
    with pytest.raises(TypeError, match=re.escape(
        "configuration key 'message_ack_time_interval' is Monarch's and does not apply to "
        "Regency: acknowledgement cadence is internal to delivery sessions"
    )) as caught:
        configure(message_ack_time_interval="2s")
    assert not isinstance(caught.value, ValueError)  # not an unknown key: a refused one
    with pytest.raises(ValueError, match="always die with their parent"):
        configure(mesh_bootstrap_enable_pdeathsig=False)


#: Every key of Monarch 0.7's ``configure`` (its ``ConfigureArgs``).
MONARCH_07_KEYS = [
    "default_transport", "enable_log_forwarding", "enable_file_capture", "tail_log_lines",
    "codec_max_frame_length", "message_delivery_timeout", "host_spawn_ready_timeout",
    "mesh_proc_spawn_max_idle", "process_exit_timeout", "message_ack_time_interval",
    "message_ack_every_n_messages", "message_ttl_default", "split_max_buffer_size",
    "split_max_buffer_age", "stop_actor_timeout", "cleanup_timeout", "default_encoding",
    "channel_net_rx_buffer_full_check_interval", "channel_tcp_congestion",
    "message_latency_sampling_rate", "enable_dest_actor_reordering_buffer",
    "mesh_bootstrap_enable_pdeathsig", "mesh_terminate_concurrency", "mesh_terminate_timeout",
    "small_write_threshold", "max_cast_dimension_size", "remote_alloc_bind_to_inaddr_any",
    "remote_alloc_bootstrap_addr", "remote_alloc_allowed_port_range", "read_log_buffer",
    "force_file_log", "prefix_with_rank", "actor_spawn_max_idle", "get_actor_state_max_idle",
    "supervision_watchdog_timeout", "proc_stop_max_idle", "get_proc_state_max_idle",
    "mesh_admin_addr", "mesh_attach_config_timeout", "mesh_orphan_timeout", "pyspy_bin",
    "rdma_allow_tcp_fallback", "rdma_disable_ibverbs", "rdma_max_chunk_size_mb",
    "rdma_ibverbs_target", "rdma_peer_device_affinity", "rdma_max_nics_per_buffer",
    "rdma_min_stripe_size_kb", "rdma_qps_per_cq", "rdma_cq_poller_per_device",
    "rdma_runtime_worker_threads",
]  # fmt: skip


@pytest.mark.parametrize("key", MONARCH_07_KEYS)
def test_every_monarch_key_is_reported_or_refused_with_its_reason(clean: None, key: str) -> None:
    """None is "unknown": a Monarch key that sets something reads back under its name;
    every other one is refused saying why it has no meaning here."""
    if key in get_global_config():
        return
    with pytest.raises(TypeError, match=re.escape(
        f"configuration key {key!r} is Monarch's and does not apply to Regency: "
    )) as caught:
        configure(**{key: None})
    assert not isinstance(caught.value, UnknownConfigKeyError)


# -- real procs --------------------------------------------------------------------------------


@pytest.mark.slow
def test_monarch_names_set_what_real_procs_use() -> None:
    """Monarch's ``codec_max_frame_length`` bounds the frames of a fresh runtime (a bigger
    call is refused at the call site, naming both sizes, and the actor goes on), and a proc
    reads the controller's settings under Monarch's names."""
    script = """
        from regency.actor import Actor, endpoint, this_host
        from regency.config import configured, get_global_config

        class Chunker(Actor):
            @endpoint
            def process(self, chunks: list[bytes]) -> int:
                return len(chunks)

            @endpoint
            def seen(self, key: str) -> object:
                return get_global_config()[key]

        chunks = [bytes(1 << 18) for _ in range(4)]
        with configured(codec_max_frame_length=1 << 20, process_exit_timeout="20s"):
            procs = this_host().spawn_procs()
            chunker = procs.spawn("chunker", Chunker)
            print("SEEN", chunker.seen.call_one("process_exit_timeout").get(30),
                  chunker.seen.call_one("codec_max_frame_length").get(30))
            try:
                chunker.process.call_one(chunks).get(30)
            except ValueError as exc:
                print("REFUSED", exc)
            print("AFTER", chunker.process.call_one([b"x"]).get(30))
            procs.stop().get(30)
        with configured(codec_max_frame_length=2 << 20):
            procs = this_host().spawn_procs()
            print("BIGGER", procs.spawn("chunker", Chunker).process.call_one(chunks).get(30))
            procs.stop().get(30)
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "SEEN 20s 1048576", done.stdout
    assert re.fullmatch(
        r"REFUSED message of 10487\d\d bytes exceeds max_frame_bytes=1048576; raise it with "
        r"regency\.configure\(max_frame_bytes=\.\.\.\)",
        lines[1],
    ), done.stdout
    assert lines[2:] == ["AFTER 1", "BIGGER 4"], done.stdout
