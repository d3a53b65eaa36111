"""Endpoints are visible to the type checker: mypy --strict on a small user program."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent(
    """
    from regency.actor import Actor, Port, endpoint, this_host

    class Counter(Actor):
        def __init__(self, v: int) -> None:
            self.v = v

        @endpoint
        def incr(self, by: int = 1) -> None:
            self.v += by

        @endpoint
        async def value(self) -> int:
            return self.v

        @endpoint(explicit_response_port=True)
        def report(self, port: Port[str], prefix: str) -> None:
            port.send(prefix + str(self.v))

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    cs = procs.spawn("cs", Counter, 0)
    cs.incr.broadcast()
    cs.incr.call(by=2).get()
    n: int = cs.value.call_one().get()
    for point, v in cs.slice(gpus=0).value.call().get().items():
        print(point, v + 1)
    r: str = cs.report.call_one("v=").get()
    cs.incr.call_one("x", 3, 4)  # E: wrong arguments
    cs.nonexistent.call()  # E: no such endpoint
    x: str = cs.value.call_one().get()  # E: int is not str
    cs.report.call_one(5)  # E: prefix is a str
    """
)


@pytest.mark.slow
@pytest.mark.slow  # runs mypy in a subprocess
def test_mypy_checks_endpoint_calls(tmp_path: Path) -> None:
    program = tmp_path / "user_program.py"
    program.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    errors: dict[int, str] = {}
    for line in done.stdout.splitlines():
        found = re.match(r".*user_program\.py:(\d+): error: (.*)", line)
        if found:
            errors[int(found.group(1))] = errors.get(int(found.group(1)), "") + found.group(2)
    expected = [n for n, line in enumerate(PROGRAM.splitlines(), 1) if "# E:" in line]
    assert sorted(errors) == expected, done.stdout + done.stderr
    wrong_args, missing, assigned, port_arg = (errors[n] for n in expected)
    assert "Too many arguments" in wrong_args and 'type "str"; expected "int"' in wrong_args
    assert '"Counter" has no attribute "nonexistent"' in missing
    assert 'expression has type "int", variable has type "str"' in assigned
    assert 'type "int"; expected "str"' in port_arg
