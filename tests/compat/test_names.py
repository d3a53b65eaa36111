"""Monarch's public names and formats that Regency programs meet: config, shutdown_context,
actor identity, rank and failure strings."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import regency
import regency.actor
from regency import config
from regency.core._config import current_config
from regency.supervision import FailureCause, MeshFailure

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def clean_config() -> Iterator[None]:
    saved = config.get_runtime_config()
    try:
        yield
    finally:
        config.clear_runtime_config()
        config.configure(**saved)


def test_monarch_keys_translate(clean_config: None) -> None:
    config.configure(
        message_delivery_timeout="1m 30s",
        stop_actor_timeout="250ms",
        codec_max_frame_length=1 << 20,
        default_transport="tcp",
        mesh_bootstrap_enable_pdeathsig=True,
    )
    now = current_config()
    assert now.delivery_timeout == 90.0
    assert now.stop_timeout == 0.25
    assert now.max_frame_bytes == 1 << 20
    assert now.default_transport == "tcp"
    assert config.get_runtime_config()["delivery_timeout"] == 90.0
    assert config.get_global_config()["stop_timeout"] == 0.25
    config.clear_runtime_config()
    assert "delivery_timeout" not in config.get_runtime_config()


def test_monarch_rdma_keys(clean_config: None) -> None:
    config.configure(rdma_disable_ibverbs=True, rdma_allow_tcp_fallback=True)
    assert current_config().rdma_backend == "tcp"
    config.configure(rdma_allow_tcp_fallback=False)
    assert current_config().rdma_backend == "ibverbs"
    with pytest.raises(ValueError, match="leaves no way to move RDMA bytes"):
        config.configure(rdma_disable_ibverbs=True, rdma_allow_tcp_fallback=False)


def test_regency_configure_takes_monarch_keys_too(clean_config: None) -> None:
    regency.configure(cleanup_timeout="2s")
    assert current_config().cleanup_timeout == 2.0


def test_configured_restores(clean_config: None) -> None:
    before = current_config().heartbeat_timeout
    with config.configured(supervision_watchdog_timeout="3s") as seen:
        assert seen["heartbeat_timeout"] == 3.0
    assert current_config().heartbeat_timeout == before


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"read_log_buffer": 100}, TypeError, "'read_log_buffer' is Monarch's and does not"),
        ({"no_such_key": 1}, TypeError, "unknown configuration key 'no_such_key'"),
        ({"message_delivery_timeout": "soon"}, ValueError, "such as '30s'"),
        ({"message_delivery_timeout": True}, TypeError, "message_delivery_timeout must be"),
        ({"mesh_bootstrap_enable_pdeathsig": False}, ValueError, "always die with their parent"),
        ({"default_transport": "carrier-pigeon"}, ValueError, "default_transport must be one of"),
    ],
)
def test_refused_keys_say_why_and_change_nothing(
    clean_config: None, settings: dict[str, object], error: type[Exception], message: str
) -> None:
    before = config.get_runtime_config()
    with pytest.raises(error, match=message):
        config.configure(stop_actor_timeout="1s", **settings)
    assert config.get_runtime_config() == before


def test_mesh_failure_names_its_type() -> None:
    failure = MeshFailure("trainers", "c1.trainers.0", (1,), FailureCause("proc died", exit_code=-9))
    assert str(failure).startswith("MeshFailure: actor mesh trainers failed at rank(s) 1")
    assert "and all its descendants have failed" in str(failure)
    assert "Killed(sig=9)" in failure.report()


def test_public_names_exist() -> None:
    for name in ("shutdown_context", "config"):
        assert name in regency.actor.__all__ and hasattr(regency.actor, name)
    assert regency.actor.config.prefix_python_logs_with_actor is True


@pytest.mark.slow
def test_identity_log_prefix_and_shutdown_context() -> None:
    script = textwrap.dedent(
        """
        import os
        import regency.actor
        from regency.actor import shutdown_context, this_host
        from tests.compat.actors import Named
        procs = this_host().spawn_procs(per_host={"f": 2})
        named = procs.spawn("the_name", Named)
        infos = named.report.call().get(30).values()
        for text, name, rank in infos:
            print("INFO", text, "|", name, "|", rank, flush=True)
        pids = named.pid.call().get(30).values()
        shutdown_context().get(30)
        shutdown_context().get(30)  # idempotent
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1][0] != "Z":
                        alive.append(pid)
            except FileNotFoundError:
                pass
        print("SHUTDOWN OK" if not alive else f"STILL ALIVE {alive}", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    infos = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("INFO")]
    assert len(infos) == 2
    texts, names, ranks = zip(*(info.split(" | ") for info in infos), strict=True)
    assert texts[0] == "<tests.compat.actors.Named the_name{'f': 0/2}>"
    assert texts[1] == "<tests.compat.actors.Named the_name{'f': 1/2}>"
    assert len(set(names)) == 2  # unique per instance
    assert list(ranks) == ["{'f': 0/2}", "{'f': 1/2}"]
    assert "[actor=<tests.compat.actors.Named the_name{'f': 0/2}>] hello from an actor" in (
        done.stderr
    )
    assert "SHUTDOWN OK" in done.stdout


@pytest.mark.slow
def test_del_runs_when_proc_mesh_stops(tmp_path: Path) -> None:
    """Monarch's test_del_runs_on_proc_mesh_stop: procs stop by letting Python finalize."""
    script = textwrap.dedent(
        f"""
        from regency.actor import this_host
        from tests.compat.actors import Finalized
        procs = this_host().spawn_procs(per_host={{"gpus": 2}})
        mesh = procs.spawn("fin", Finalized)
        for i in range(2):
            mesh.slice(gpus=i).arm.call_one({str(tmp_path)!r} + f"/w{{i}}").get(30)
        procs.stop().get(30)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert [(tmp_path / f"w{i}").read_text() for i in range(2)] == ["finalized", "finalized"]


@pytest.mark.slow
def test_with_python_executable(tmp_path: Path) -> None:
    from regency.actor import this_host

    from .actors import Interpreter

    python = tmp_path / "python-for-procs"
    python.symlink_to(sys.executable)
    hosts = this_host().with_python_executable(str(python))
    assert hosts.is_fake_in_process is False
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        got = procs.spawn("interp", Interpreter).executable.call().get(30).values()
    finally:
        procs.stop().get(30)
    assert got == [str(python), str(python)]
    with pytest.raises(FileNotFoundError, match="is not an executable file"):
        this_host().with_python_executable(str(tmp_path / "missing"))


@pytest.mark.slow
def test_an_actor_stops_itself_after_draining_its_mailbox() -> None:
    from regency.actor import SupervisionError, context, this_host

    from .actors import Finisher

    with pytest.raises(RuntimeError, match="root client cannot stop itself"):
        context().actor_instance.stop()
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        one = procs.spawn("finisher", Finisher).slice(gpus=0)
        assert one.finish.call_one().get(30) == "stopping"
        with pytest.raises(SupervisionError, match="stopped"):
            one.work.call_one().get(30)
        # Messages already queued when it stops itself are handled first.
        two = procs.spawn("finisher2", Finisher).slice(gpus=0)
        futures = [two.work.call_one(), two.finish.call_one()]
        assert [f.get(30) for f in futures] == [1, "stopping"]
        with pytest.raises(SupervisionError, match="stopped"):
            two.work.call_one().get(30)
    finally:
        procs.stop().get(30)


@config.parametrize_config(stop_actor_timeout={"1s", "2s"}, cleanup_timeout={"3s"})
def test_parametrize_config_runs_each_combination() -> None:
    now = current_config()
    assert now.stop_timeout in (1.0, 2.0) and now.cleanup_timeout == 3.0


@config.parametrize_config_pointwise(stop_actor_timeout=["1s", "4s"], cleanup_timeout=[5, 6])
def test_parametrize_config_pointwise_runs_in_lockstep(tmp_path: Path) -> None:
    now = current_config()
    assert (now.stop_timeout, now.cleanup_timeout) in ((1.0, 5.0), (4.0, 6.0))
    assert tmp_path.exists()  # the test's own fixtures still arrive


def test_parametrize_config_restores_and_refuses_bad_keys() -> None:
    assert current_config().stop_timeout == 5.0  # the parametrized runs left nothing behind
    with pytest.raises(TypeError, match="'force_file_log' is Monarch's and does not apply"):
        config.parametrize_config(force_file_log={True})
    with pytest.raises(ValueError, match="sequences of one length"):
        config.parametrize_config_pointwise(stop_actor_timeout=["1s"], cleanup_timeout=[1, 2])


@pytest.mark.slow
def test_actor_instance_children_lists_spawned_proc_meshes() -> None:
    """Monarch's private ``actor_instance._children``, which its test fixtures use to stop
    what a test spawned: the proc meshes spawned from here, in order; assignable."""
    from regency.actor import context, this_host

    me = context().actor_instance
    before = me._children
    first = this_host().spawn_procs(per_host={"gpus": 1})
    second = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert (me._children or [])[-2:] == [first, second]
        assert context().actor_instance._children is not None  # one list per actor, not per call
        me._children = before
        assert me._children == before
    finally:
        first.stop().get(30)
        second.stop().get(30)


def test_global_config_reports_monarchs_rdma_switches(clean_config: None) -> None:
    with config.configured(rdma_disable_ibverbs=True):
        settings = config.get_global_config()
        assert (settings["rdma_disable_ibverbs"], settings["rdma_allow_tcp_fallback"]) == (
            True,
            True,
        )
    with config.configured(rdma_allow_tcp_fallback=False):
        settings = config.get_global_config()
        assert (settings["rdma_disable_ibverbs"], settings["rdma_allow_tcp_fallback"]) == (
            False,
            False,
        )


@pytest.mark.slow
def test_unpicklable_argument_is_a_type_error_and_a_runtime_error() -> None:
    """Monarch raises RuntimeError at the call site; Regency's TypeError is both."""
    import threading

    from regency.actor import this_host

    from .actors import Environ

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("env_pickle", Environ)
        for expected in (TypeError, RuntimeError):
            with pytest.raises(expected, match=r"cannot pickle argument #0 \(lock\) of endpoint"):
                mesh.get.call_one(threading.Lock())  # type: ignore[arg-type]
    finally:
        procs.stop().get(30)


def test_actor_logger_is_named_after_its_class_and_assignable() -> None:
    import logging

    from regency.actor import Actor

    class Plain(Actor):
        pass

    class Own(Actor):
        def __init__(self) -> None:
            self.logger = logging.getLogger("mine")  # Monarch code does this too

    plain = Plain()
    assert plain.logger is logging.getLogger(f"{__name__}.{Plain.__qualname__}")
    assert plain.logger is plain.logger
    assert plain.logger.level == logging.DEBUG  # as Monarch's: info() is not filtered out
    assert Own().logger.name == "mine"


# -- every public name of Monarch 0.7 ------------------------------------------------------------

#: The ``__all__`` of each public module of Monarch 0.7, copied from the torchmonarch 0.7.0
#: wheel (python/monarch/{actor,job,rdma,config,spmd,timer}/__init__.py), in its order.
MONARCH_07_NAMES: dict[str, list[str]] = {
    "actor": [
        "Accumulator", "Actor", "ActorError", "current_actor_name", "as_endpoint",
        "current_rank", "current_size", "concurrent_endpoint", "endpoint", "Future",
        "returns_future", "Point", "ProcMesh", "ProcId", "Channel", "send", "shutdown_context",
        "ValueMesh", "debug_controller", "get_or_spawn_controller", "this_host", "this_proc",
        "default_bootstrap_cmd", "HostMesh", "context", "Port", "PortReceiver", "Endpoint",
        "Extent", "run_worker_loop_forever", "run_worker_loop_until_shutdown",
        "start_worker_loop_forever", "attach_to_workers", "attach", "enable_transport",
        "Context", "ChannelTransport", "unhandled_fault_hook", "MeshFailure", "config",
        "get_meter", "span", "traced", "Uid",
    ],
    "job": [
        "DEFAULT_JOB_PATH", "deserialize_service_proc_ids", "exec_command", "hosts_from_config",
        "JobTrait", "job_load", "job_loads", "JobState", "load_current_job", "LocalJob",
        "MeshAdminConfig", "new_service_proc_id", "PortForwarder", "ProcessJob",
        "ranked_service_proc_id_from_env", "serialize_service_proc_ids", "service_proc_addr",
        "service_proc_addrs", "SERVICE_PROC_IDS_ENV", "SERVICE_PROC_RANK_ENV",
        "set_current_job", "shell", "SlurmJob", "TelemetryConfig",
    ],
    "rdma": [
        "get_rdma_backend", "is_ibverbs_available", "is_rdma_available", "RDMABuffer",
        "RDMAAction", "RDMAReadTransferWarning", "RDMATcpFallbackWarning",
        "RDMAWriteTransferWarning",
    ],
    "config": [
        "clear_runtime_config", "configure", "configured", "Encoding", "get_global_config",
        "get_runtime_config", "parametrize_config", "parametrize_config_pointwise",
    ],
    "spmd": ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"],
    "timer": [
        "ExecutionTimer", "execution_timer_start", "execution_timer_stop",
        "get_latest_timer_measurement", "get_execution_timer_average_ms",
    ],
}  # fmt: skip

PORTING = Path(ROOT) / "docs" / "porting.md"
_NOT_HERE_HEADING = "## Monarch 0.7 names that Regency does not have"
_ROW = re.compile(r"^\|\s*`monarch\.(\w+)`\s*\|\s*`(\w+)`\s*\|\s*(.*?)\s*\|\s*$")


def _names_not_here() -> dict[tuple[str, str], str]:
    """The rows of porting.md's table of Monarch names Regency lacks: (module, name) -> why."""
    text = PORTING.read_text()
    assert _NOT_HERE_HEADING in text, f"docs/porting.md has no section {_NOT_HERE_HEADING!r}"
    section = text.split(_NOT_HERE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is not None:
            rows[(match.group(1), match.group(2))] = match.group(3)
    return rows


def _regency_module(name: str) -> types.ModuleType:
    return importlib.import_module(f"regency.{name}")


@pytest.mark.parametrize("module", sorted(MONARCH_07_NAMES))
def test_every_monarch_name_is_here_or_listed_with_why(module: str) -> None:
    regency_module = _regency_module(module)
    exported = set(getattr(regency_module, "__all__", ()))
    listed = _names_not_here()
    missing = []
    for name in MONARCH_07_NAMES[module]:
        here = name in exported and hasattr(regency_module, name)
        why = listed.get((module, name))
        if here:
            assert why is None, f"monarch.{module}.{name} is in regency.{module}: drop its row"
        elif not why:
            missing.append(name)
    assert not missing, (
        f"names of monarch.{module} neither in regency.{module}.__all__ nor listed (with the "
        f"reason) in docs/porting.md: {missing}"
    )


def test_the_table_lists_only_monarch_names() -> None:
    for module, name in _names_not_here():
        assert name in MONARCH_07_NAMES.get(module, []), f"monarch.{module}.{name} is not Monarch's"
