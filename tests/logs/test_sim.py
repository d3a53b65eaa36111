"""Log forwarding in the simulator: virtual timestamps, deterministic output."""

from __future__ import annotations

import pytest

from regency.core._config import overridden
from regency.sim import simulate
from tests.logs.actors import Printer


def program(hosts: object) -> None:
    procs = hosts.spawn_procs(per_host={"gpus": 2})  # type: ignore[attr-defined]
    printers = procs.spawn("p", Printer)
    procs.logging_option(stream_to_client=True, aggregate_window_sec=None).get()
    printers.lines.call("sim", 2).get()
    procs.logging_option(stream_to_client=True, aggregate_window_sec=30).get()
    printers.lines.call("a simulated step is done, rank", 2).get()
    procs.stop().get()


def _run(seed: int, capsys: pytest.CaptureFixture[str]) -> str:
    with overridden(enable_log_forwarding=True):
        simulate(program, seed=seed, hosts=2)
    return capsys.readouterr().out


def test_forwarded_lines_and_windows_are_deterministic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = _run(3, capsys)
    lines = first.splitlines()
    for host, rank in (("host0", 0), ("host0", 1), ("host1", 2), ("host1", 3)):
        for i in (0, 1):
            assert any(
                line.startswith(f"[{host} ") and line.endswith(f"] [{rank}] sim {rank} line {i}")
                for line in lines
            ), first
    # The window closes at stop's flush; its timestamp is virtual time.
    assert "\x1b[33m[8 similar log lines]\x1b[0m [" in first
    assert ">>> Aggregated Logs (t=" in first
    assert _run(3, capsys) == first


async def timed_program(hosts: object) -> None:
    import trio

    procs = hosts.spawn_procs(per_host={"gpus": 2})  # type: ignore[attr-defined]
    printers = procs.spawn("p", Printer)
    await procs.logging_option(stream_to_client=True, aggregate_window_sec=2)
    await printers.lines.call("a window closes on its own timer, rank", 1)
    await trio.sleep(5)  # virtual: the 2 s window has closed meanwhile
    print("AFTER THE WINDOW")
    await procs.stop()


def test_a_window_closes_on_its_timer_in_virtual_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with overridden(enable_log_forwarding=True):
        simulate(timed_program, seed=5, hosts=1)
    out = capsys.readouterr().out
    block = out[: out.index("AFTER THE WINDOW")]
    assert "\x1b[33m[2 similar log lines]\x1b[0m [" in block
    assert "<<< Aggregated Logs (t=" in block
