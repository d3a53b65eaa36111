"""Issue 11 (security and robustness) on one host: the secret stays out of procs'
environments, a value that fails to unpickle fails one call only, long C calls are not hangs,
and large frames leave no memory behind."""

from __future__ import annotations

import os

from regency.actor import this_host

from .hardening_actors import EnvProbe

T = 30


def test_the_secret_never_reaches_a_proc_or_the_zygote_environment() -> None:
    assert os.environ.get("REGENCY_SECRET"), "the test suite sets REGENCY_SECRET (conftest)"
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        seen = pm.spawn("env", EnvProbe).secret_seen.call_one().get(T)
        assert seen["os.environ"] is False
        assert seen["/proc/self/environ"] is False
        if seen["parent"] != os.getpid():  # forked by the zygote: it must not hold it either
            assert seen["/proc/parent/environ"] is False
    finally:
        pm.stop().get(T)


def test_the_secret_never_reaches_a_fresh_interpreter() -> None:
    """Without the zygote, and even when the caller passes it in ``env``."""
    from regency.core import current_runtime
    from regency.core._launcher import LocalLauncher

    rt = current_runtime()
    saved = rt.launcher
    rt.launcher = LocalLauncher(rt.nursery)
    try:
        pm = this_host().spawn_procs(per_host={"gpus": 1}, env={"REGENCY_SECRET": "x" * 20})
        seen = pm.spawn("env", EnvProbe).secret_seen.call_one().get(T)
        assert seen["os.environ"] is False and seen["/proc/self/environ"] is False
        pm.stop().get(T)
    finally:
        rt.launcher = saved
