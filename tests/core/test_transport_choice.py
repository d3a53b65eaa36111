"""The same program over every transport, selected by configuration only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

#: Real processes: the slow tier (pytest -m "not slow" skips it).
pytestmark = pytest.mark.slow


PROGRAM = textwrap.dedent(
    """
    import sys
    import regency
    from regency.actor import this_host
    from regency.core import current_runtime
    from tests.core.actors import Counter
    if len(sys.argv) > 1:
        regency.configure(default_transport=sys.argv[1])
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    cs = pm.spawn("cs", Counter, 1)
    cs.incr.broadcast(2)
    print(cs.value.call().get(30).values(), [a for _, a in pm._procs])
    """
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("transport", ["unix", "tcp", "nng+ipc", "nng+tcp"])
def test_environment_selects_the_transport(transport: str) -> None:
    out = _run([], {"REGENCY_DEFAULT_TRANSPORT": transport})
    scheme = transport if transport != "unix" else "unix"
    assert out.startswith("[3, 3]"), out
    assert f"'{scheme}://" in out


def test_configure_selects_the_transport() -> None:
    out = _run(["tcp"], {})
    assert out.startswith("[3, 3]") and "'tcp://127.0.0.1:" in out


def test_bad_configuration_is_named() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import regency; regency.configure(default_transport='carrier')"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert "default_transport must be one of ('unix', 'tcp', 'nng+ipc', 'nng+tcp', 'nng+tls+tcp') (got 'carrier')" in out.stderr
    out = subprocess.run(
        [sys.executable, "-c", "import regency; regency.configure(transport='tcp')"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert "unknown configuration key 'transport'" in out.stderr
