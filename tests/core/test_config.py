"""Configuration: configure() over REGENCY_* variables over defaults, validated, scoped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from regency.core import _config
from regency.core._config import Config, configure, current_config, overridden


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    """Put the process's configuration back as it was, whatever the test did."""
    saved, current = dict(_config._overrides), _config._current
    try:
        yield
    finally:
        _config._overrides.clear()
        _config._overrides.update(saved)
        _config._current = current


def test_defaults() -> None:
    config = Config()
    assert (config.runtime, config.default_transport, config.delivery_timeout) == (
        "real",
        "unix",
        10.0,
    )


def test_configure_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_STOP_TIMEOUT", "2.5")
    monkeypatch.setenv("REGENCY_SEED", "42")
    _config._overrides.clear()
    _config._current = None
    assert current_config().stop_timeout == 2.5 and current_config().seed == 42
    configure(stop_timeout=7.0)
    assert current_config().stop_timeout == 7.0 and current_config().seed == 42


def test_a_bad_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_SPAWN_TIMEOUT", "soon")
    _config._current = None
    with pytest.raises(ValueError, match="REGENCY_SPAWN_TIMEOUT must be float \\(got 'soon'\\)"):
        current_config()


def test_the_largest_frame_setting_is_the_u32_length_below_the_lanes_mark() -> None:
    before = current_config()
    try:
        configure(max_frame_bytes=0xFFFF_FFFE)
        assert current_config().max_frame_bytes == 0xFFFF_FFFE
        with pytest.raises(ValueError, match="max_frame_bytes must be at most 4294967294"):
            configure(max_frame_bytes=0xFFFF_FFFF)
    finally:
        configure(max_frame_bytes=before.max_frame_bytes)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"colour": "red"}, TypeError, "unknown configuration keys \\['colour'\\]; valid keys"),
        ({"default_transport": "udp"}, ValueError, "default_transport must be one of"),
        ({"runtime": "fake"}, ValueError, "runtime must be one of \\('real', 'sim'\\)"),
        ({"rdma_backend": "magic"}, ValueError, "rdma_backend must be one of"),
        ({"delivery_timeout": 0}, ValueError, "delivery_timeout must be positive \\(got 0\\)"),
        ({"heartbeat_interval": -1.0}, ValueError, "heartbeat_interval must be positive"),
        (
            {"reconnect_refused_s": -1.0},
            ValueError,
            "reconnect_refused_s must be zero or more \\(got -1.0\\)",
        ),
        (
            {"max_frame_bytes": 1 << 32},
            ValueError,
            "max_frame_bytes must be at most 4294967294 \\(a frame's length is a u32",
        ),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(
    settings: dict[str, object], error: type[Exception], message: str
) -> None:
    before = current_config()
    with pytest.raises(error, match=message):
        configure(**settings)
    assert current_config() == before


def test_overridden_restores_what_was_there() -> None:
    configure(stop_timeout=3.0)
    with overridden(stop_timeout=0.5, delivery_timeout=1.0) as inside:
        assert inside.stop_timeout == 0.5 and current_config().delivery_timeout == 1.0
    assert current_config().stop_timeout == 3.0
    assert current_config().delivery_timeout == Config().delivery_timeout


def test_children_get_the_configuration_as_environment_variables() -> None:
    env = Config(stop_timeout=1.5, default_transport="tcp").to_env()
    assert env["REGENCY_STOP_TIMEOUT"] == "1.5" and env["REGENCY_DEFAULT_TRANSPORT"] == "tcp"
    assert set(env) == {f"REGENCY_{f.upper()}" for f in Config.__annotations__}
