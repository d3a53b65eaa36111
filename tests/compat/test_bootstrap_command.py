"""``spawn_procs(bootstrap_command=...)`` and ``default_bootstrap_cmd()`` (Monarch's): how
procs on this host are started, for all of them or per point."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from regency.actor import BootstrapCommand, Point, default_bootstrap_cmd, this_host

from .actors import Environ

T = 30


def test_default_command_is_this_interpreter() -> None:
    base = default_bootstrap_cmd()
    assert (base.program, base.arg0, base.args, base.env) == (
        sys.executable,
        None,
        ("-m", "regency.core._bootstrap"),
        {},
    )
    marked = base.with_env({"CUDA_VISIBLE_DEVICES": "3"})
    assert marked.env == {"CUDA_VISIBLE_DEVICES": "3"} and base.env == {}  # a copy
    with pytest.raises(TypeError, match="args must be a list of str"):
        BootstrapCommand(sys.executable, None, "-m regency.core._bootstrap", {})
    with pytest.raises(TypeError, match="env must map str to str"):
        BootstrapCommand(sys.executable, None, [], {"N": 1})  # type: ignore[dict-item]


@pytest.mark.slow
def test_bootstrap_command_for_all_and_per_point(tmp_path: Path) -> None:
    # A wrapper, as a cluster would use (numactl, a container entry point): it marks the
    # environment and execs the real command.
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text('#!/bin/sh\nexport WRAPPED=yes\nexec "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    base = default_bootstrap_cmd()
    wrapped = BootstrapCommand(str(wrapper), None, [base.program, *base.args], {"TAG": "all"})

    def per_point(point: Point) -> BootstrapCommand:
        return base.with_env({"CUDA_VISIBLE_DEVICES": str(point["gpus"])})

    host = this_host()
    all_procs = host.spawn_procs(per_host={"gpus": 2}, bootstrap_command=wrapped)
    pointwise = host.spawn_procs(per_host={"gpus": 2}, bootstrap_command=per_point)
    plain = host.spawn_procs(per_host={"gpus": 1})
    try:
        a = all_procs.spawn("env_all", Environ)
        assert a.get.call("WRAPPED").get(T).values() == ["yes", "yes"]
        assert a.get.call("TAG").get(T).values() == ["all", "all"]
        b = pointwise.spawn("env_points", Environ)
        assert b.get.call("CUDA_VISIBLE_DEVICES").get(T).values() == ["0", "1"]
        # A spawn without a command does not inherit one.
        c = plain.spawn("env_plain", Environ)
        assert c.get.call_one("CUDA_VISIBLE_DEVICES").get(T) == os.environ.get(
            "CUDA_VISIBLE_DEVICES", ""
        )
        assert c.get.call_one("WRAPPED").get(T) == ""
    finally:
        for procs in (all_procs, pointwise, plain):
            procs.stop().get(T)


def test_bootstrap_command_refusals(tmp_path: Path) -> None:
    host = this_host()
    with pytest.raises(FileNotFoundError, match="is not an executable file"):
        host.spawn_procs(bootstrap_command=BootstrapCommand(str(tmp_path / "missing")))
    with pytest.raises(TypeError, match="must return a BootstrapCommand"):
        host.spawn_procs(bootstrap_command=lambda point: "python")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="bootstrap_command must be a BootstrapCommand"):
        host.spawn_procs(bootstrap_command="python")  # type: ignore[arg-type]


@pytest.mark.slow
def test_bootstrap_callable_may_use_the_runtime() -> None:
    """Monarch's setup pattern: ``bootstrap`` spawns an actor on its own proc and calls it
    (it runs once the proc's runtime listens, before the proc counts as started)."""
    from .actors import Booted, boot_with_actor, boot_with_actor_async

    sync = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=boot_with_actor)
    aio = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=boot_with_actor_async)
    try:
        assert sync.spawn("b", Booted).booted.call_one().get(T) == ["sync self"]
        assert aio.spawn("b", Booted).booted.call_one().get(T) == ["async self"]
    finally:
        sync.stop().get(T)
        aio.stop().get(T)


@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least two CPUs",
)
def test_proc_bind_pins_each_proc_of_a_host() -> None:
    from .actors import Affinity

    first, second = sorted(os.sched_getaffinity(0))[:2]
    procs = this_host().spawn_procs(
        per_host={"gpus": 2}, proc_bind=[{"cpus": str(first)}, {"cpus": str(second)}]
    )
    try:
        pinned = procs.spawn("affinity", Affinity).cpus.call().get(T).values()
        assert pinned == [[first], [second]]
    finally:
        procs.stop().get(T)


@pytest.mark.parametrize(
    ("proc_bind", "error", "message"),
    [
        ([{"cpus": "0"}], ValueError, r"proc_bind length \(1\) must equal procs_per_host \(2\)"),
        ([{"cpus": "0"}, {"cpu": "1"}], ValueError, r"keys must be among .*\['cpu'\]"),
        ([{"cpus": 0}, {"cpus": "1"}], TypeError, "must map str to str"),
        ({"cpus": "0"}, TypeError, "must be a list of dicts"),
    ],
)
def test_bad_proc_bind_is_refused(proc_bind: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=proc_bind)  # type: ignore[arg-type]
