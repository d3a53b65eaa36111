"""When ``import regency`` starts a zygote (regency/_prestart.py), without starting one."""

from __future__ import annotations

import sys

import pytest

from regency import _prestart


@pytest.mark.parametrize(
    ("argv", "env", "wanted"),
    [
        (["script.py"], {}, True),
        (["-m"], {}, False),  # python -m regency...: a proc, the zygote, a worker daemon
        (["/venv/bin/regency", "debug"], {}, False),  # a command that never spawns
        (["/venv/bin/regency", "worker", "--listen", "tcp://h:1"], {}, True),
        (["script.py"], {"REGENCY_ZYGOTE": "0"}, False),
        (["script.py"], {"REGENCY_RUNTIME": "sim"}, False),
    ],
)
def test_who_starts_a_zygote_at_import(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], wanted: bool
) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "platform", "linux")
    for name in ("REGENCY_ZYGOTE", "REGENCY_RUNTIME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _prestart.wanted() is wanted


def test_no_zygote_off_linux_or_without_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["script.py"])
    monkeypatch.delenv("REGENCY_ZYGOTE", raising=False)
    monkeypatch.delenv("REGENCY_RUNTIME", raising=False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not _prestart.wanted()
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delattr(sys, "argv")  # an embedded interpreter
    assert not _prestart.wanted()
