"""Monarch 0.7's smaller public names: ``Uid``/``ProcId`` and the service identity helpers,
``ChannelTransport``/``enable_transport``, ``Encoding``, the RDMA warning classes,
``Context``/``Endpoint``, ``debug_controller``, the current job, the timer."""

from __future__ import annotations

import os
import pickle
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from regency import config
from regency.actor import (
    ChannelTransport,
    Context,
    Endpoint,
    ProcId,
    Uid,
    context,
    debug_controller,
    enable_transport,
)
from regency.core._config import current_config

T = 30


@pytest.fixture
def clean_config() -> Iterator[None]:
    saved = config.get_runtime_config()
    try:
        yield
    finally:
        config.clear_runtime_config()
        config.configure(**saved)


# -- Uid and ProcId ------------------------------------------------------------------------------


def test_uids_print_parse_compare_and_pickle_as_monarchs() -> None:
    service = Uid.instance("service")
    assert service.is_instance and not service.is_singleton and service.label == "service"
    text = str(service)
    assert text.startswith("service<") and text.endswith(">")
    again = Uid.from_string(text)
    assert again == service and hash(again) == hash(service)
    assert again.instance_value == service.instance_value
    assert pickle.loads(pickle.dumps(service)) == service
    # Instances are equal by value; the label is only for display.
    value = 2**64 - 1
    assert Uid.instance_from_value(value, "a") == Uid.instance_from_value(value, "b")
    assert str(Uid.instance_from_value(0)) == "<1>"  # base58 (Flickr), as Monarch prints it
    assert str(Uid.instance_from_value(57)) == "<Z>" and str(Uid.instance_from_value(58)) == "<21>"
    assert Uid.from_string(str(Uid.instance_from_value(value))).instance_value == value
    singleton = Uid.from_string("service")
    assert singleton.is_singleton and singleton.instance_value is None and str(singleton) == "service"
    assert singleton != Uid.instance("service") and singleton == Uid.from_string("service")
    assert Uid.anonymous().label is None and str(Uid.anonymous()).startswith("<")
    assert Uid.anonymous() != Uid.anonymous()


@pytest.mark.parametrize(
    "text", ["Service", "9lives", "a-", "", "a<0>", "<>", "x<abc", "a<zzzzzzzzzzzzzzzzzz>", "a b"]
)
def test_bad_uids_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid uid"):
        Uid.from_string(text)
    with pytest.raises(ValueError, match="invalid proc id"):
        ProcId.from_string(text)


def test_uid_constructors_check_their_arguments() -> None:
    with pytest.raises(TypeError, match="no constructor"):
        Uid()
    with pytest.raises(ValueError, match="invalid uid label"):
        Uid.instance("Bad")
    with pytest.raises(ValueError, match="64 bits"):
        Uid.instance_from_value(2**64)
    with pytest.raises(TypeError):
        ProcId("service")  # type: ignore[arg-type]


def test_proc_ids() -> None:
    uid = Uid.instance("service")
    proc = ProcId(uid)
    assert proc.uid == uid and proc.label == "service" and str(proc) == str(uid)
    assert ProcId.from_string(str(proc)) == proc and hash(ProcId.from_string(str(proc))) == hash(proc)
    assert pickle.loads(pickle.dumps(proc)) == proc
    assert proc != uid


def test_service_identity_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    from regency import job

    ids = [job.new_service_proc_id() for _ in range(3)]
    assert all(p.label == "service" and p.uid.is_instance for p in ids)
    assert len(set(ids)) == 3
    text = job.serialize_service_proc_ids(ids)
    assert job.deserialize_service_proc_ids(text) == ids
    assert job.service_proc_addr("tcp://h:1", None) == "tcp://h:1"
    assert job.service_proc_addr("tcp://h:1", ids[0]) == f"{ids[0]}@tcp://h:1"
    assert job.service_proc_addrs(["tcp://a:1", "tcp://b:2"], ids[:2]) == [
        f"{ids[0]}@tcp://a:1",
        f"{ids[1]}@tcp://b:2",
    ]
    assert job.service_proc_addrs(["tcp://a:1"], None) == ["tcp://a:1"]
    with pytest.raises(ValueError, match="2 worker addresses and 1 service ProcIds"):
        job.service_proc_addrs(["tcp://a:1", "tcp://b:2"], ids[:1])
    monkeypatch.delenv(job.SERVICE_PROC_IDS_ENV, raising=False)
    assert job.ranked_service_proc_id_from_env() is None
    monkeypatch.setenv(job.SERVICE_PROC_IDS_ENV, text)
    monkeypatch.delenv(job.SERVICE_PROC_RANK_ENV, raising=False)
    assert job.ranked_service_proc_id_from_env() is None
    monkeypatch.setenv(job.SERVICE_PROC_RANK_ENV, "2")
    assert job.ranked_service_proc_id_from_env() == ids[2]
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert job.ranked_service_proc_id_from_env(rank_env="SLURM_NODEID") == ids[1]
    assert job.SERVICE_PROC_IDS_ENV.startswith("REGENCY_")


def test_proc_addrs_lose_their_identity_where_workers_are_named() -> None:
    from regency.actor import _channel_address

    proc = ProcId(Uid.instance("service"))
    assert _channel_address(f"{proc}@tcp://h:1") == "tcp://h:1"
    assert _channel_address("service@tcp://h:1") == "tcp://h:1"  # Monarch's legacy form
    # A dial@bind alias is left whole (its left part is an address), so is anything else.
    assert _channel_address("tcp://h:1@tcp://0.0.0.0:1") == "tcp://h:1@tcp://0.0.0.0:1"
    assert _channel_address(f"{proc}@tcp://h:1@tcp://0.0.0.0:1") == "tcp://h:1@tcp://0.0.0.0:1"
    assert _channel_address("Not An Id@tcp://h:1") == "Not An Id@tcp://h:1"


# -- transports and encodings --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "expected"),
    [
        (ChannelTransport.Unix, "unix"),
        (ChannelTransport.Local, "unix"),
        (ChannelTransport.TcpWithHostname, "tcp"),
        (ChannelTransport.TcpWithLocalhost, "tcp"),
        (ChannelTransport.Tls, "nng+tls+tcp"),
        (ChannelTransport.MetaTlsWithHostname, "nng+tls+tcp"),
        (ChannelTransport.MetaTlsWithIpV6, "nng+tls+tcp"),
        ("tcp", "tcp"),
        ("ipc", "unix"),
        ("tls", "nng+tls+tcp"),
        ("metatls", "nng+tls+tcp"),
        ("metatls-hostname", "nng+tls+tcp"),
        ("nng+tcp", "nng+tcp"),
        ("unix", "unix"),
    ],
)
def test_enable_transport_and_configure_take_monarchs_transports(
    clean_config: None, transport: ChannelTransport | str, expected: str
) -> None:
    enable_transport(transport)
    assert current_config().default_transport == expected
    config.clear_runtime_config()
    config.configure(default_transport=transport)
    assert current_config().default_transport == expected


def test_channel_transport_has_monarchs_values() -> None:
    assert {t.name: t.value for t in ChannelTransport} == {
        "TcpWithLocalhost": "tcp(localhost)",
        "TcpWithHostname": "tcp(hostname)",
        "MetaTlsWithHostname": "metatls(hostname)",
        "MetaTlsWithIpV6": "metatls(ipv6)",
        "Tls": "tls",
        "Local": "local",
        "Unix": "unix",
    }
    assert config.ChannelTransport is ChannelTransport


def test_enable_transport_with_an_address(clean_config: None) -> None:
    enable_transport("tcp://127.0.0.2")
    assert (current_config().default_transport, current_config().tcp_host) == ("tcp", "127.0.0.2")
    enable_transport("tcp://127.0.0.3:0")
    assert current_config().tcp_host == "127.0.0.3"
    for bad in ("tcp://127.0.0.1:8080", "ipc:///tmp/x", "tcp://"):
        with pytest.raises(ValueError, match="tcp://HOST or tcp://HOST:0"):
            enable_transport(bad)
    with pytest.raises(ValueError, match="unknown transport 'pigeon'"):
        enable_transport("pigeon")
    with pytest.raises(TypeError):
        enable_transport(3)  # type: ignore[arg-type]


def test_encoding_exists_and_configuring_it_says_why_not(clean_config: None) -> None:
    assert [e.name for e in config.Encoding] == ["Bincode", "Json", "Multipart"]
    with pytest.raises(TypeError, match=r"pickle protocol 5"):
        config.configure(default_encoding=config.Encoding.Multipart)


def test_rdma_warning_classes_show_once() -> None:
    from regency import rdma

    for category in (
        rdma.RDMAReadTransferWarning,
        rdma.RDMAWriteTransferWarning,
        rdma.RDMATcpFallbackWarning,
    ):
        assert issubclass(category, Warning)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("once", category)
            for _ in range(3):
                warnings.warn("slow path", category, stacklevel=1)
        assert len(seen) == 1


# -- Context, Endpoint, debug_controller ---------------------------------------------------------


def test_context_and_endpoint_are_the_types_actors_meet() -> None:
    assert isinstance(context(), Context)
    from regency.core import Endpoint as CoreEndpoint

    assert Endpoint is CoreEndpoint


def test_debug_controller_is_the_singleton_breakpoints_report_to() -> None:
    from regency._debugger._controller import DebugController
    from regency.actor import get_or_spawn_controller

    controller = debug_controller()
    assert debug_controller() is controller
    assert controller.list.call_one().get(T) == []
    same = get_or_spawn_controller("debug_controller", DebugController).get(T)
    assert same.list.call_one().get(T) == []


# -- the current job ---------------------------------------------------------------------------


def test_set_and_load_the_current_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from regency import job

    monkeypatch.chdir(tmp_path)
    (tmp_path / "myjobs_for_current.py").write_text(
        textwrap.dedent(
            """
            from regency.job import LocalJob
            train = LocalJob(("trainers",))
            not_a_job = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="set_current_job"):
        job.load_current_job()
    # A plain state file from before moves into the default context.
    os.makedirs(".regency")
    Path(job.DEFAULT_JOB_PATH).write_bytes(b"old state")
    job.set_current_job("myjobs_for_current.train")
    link = Path(job.DEFAULT_JOB_PATH)
    assert job.DEFAULT_JOB_PATH == job.DEFAULT_STATE_PATH == ".regency/job_state.pkl"
    assert link.is_symlink() and os.readlink(link) == "default/state.pkl"
    assert Path(".regency/default/state.pkl").read_bytes() == b"old state"
    assert Path(".regency/default/spec").read_text().strip() == "myjobs_for_current.train"
    assert os.stat(".regency/default").st_mode & 0o077 == 0
    loaded = job.load_current_job()
    assert isinstance(loaded, job.LocalJob)
    # Dumping the job follows the symlink into the context.
    loaded.dump(job.DEFAULT_JOB_PATH)
    assert link.is_symlink() and isinstance(job.job_load(), job.LocalJob)
    job.set_current_job("myjobs_for_current:not_a_job")
    with pytest.raises(TypeError, match="must be a JobTrait"):
        job.load_current_job()
    job.set_current_job("myjobs_for_current.missing")
    with pytest.raises(AttributeError, match="has no 'missing'"):
        job.load_current_job()
    job.set_current_job("nodots")
    with pytest.raises(ValueError, match=r"module\.attr"):
        job.load_current_job()


# -- the timer ----------------------------------------------------------------------------------


@pytest.fixture
def timer() -> Iterator[type]:
    from regency.timer import ExecutionTimer

    ExecutionTimer.reset()
    yield ExecutionTimer
    ExecutionTimer.reset()


def test_timer_on_the_cpu(timer: type) -> None:
    import time

    from regency import timer as module

    for _ in range(3):
        with timer.time("sleep", use_cpu=True):
            time.sleep(0.01)
    module.execution_timer_start("outer", use_cpu=True)
    module.execution_timer_start("outer", use_cpu=True)  # the same name, nested
    module.execution_timer_stop("outer", use_cpu=True)
    module.execution_timer_stop("outer", use_cpu=True)
    summary = timer.summary()
    assert summary["sleep"]["count"] == 3 and summary["outer"]["count"] == 2
    assert 9.0 <= summary["sleep"]["min_ms"] <= summary["sleep"]["mean_ms"]
    assert summary["sleep"]["max_ms"] <= summary["sleep"]["total_ms"]
    assert summary["sleep"]["total_ms"] == pytest.approx(3 * summary["sleep"]["mean_ms"])
    assert timer.get_latest_measurement("sleep") >= 9.0
    assert timer.get_latest_measurement("never") == 0.0
    with pytest.raises(RuntimeError, match="did you run start"):
        timer.stop("never", use_cpu=True)


def test_timer_results_as_tensors(timer: type) -> None:
    torch = pytest.importorskip("torch")
    from regency import timer as module

    with timer.time(use_cpu=True):  # the "default" section
        pass
    average = module.get_execution_timer_average_ms()
    latest = module.get_latest_timer_measurement()
    assert average.dtype == torch.float64 and average.dim() == 0
    assert latest.item() == pytest.approx(average.item())
    if not torch.cuda.is_available():
        with timer.time("gpu_or_not"):  # no GPU: timed on the CPU, with a warning once
            pass
        assert timer.summary()["gpu_or_not"]["count"] == 1
