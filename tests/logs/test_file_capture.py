"""Monarch's ``enable_file_capture`` and ``tail_log_lines``: each proc's output in files on
its host, and a dead proc's last lines in the failure the controller reports."""

from __future__ import annotations

import os
import re
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import regency
from regency import config
from regency.actor import ProcMesh, SupervisionError
from regency.core import _codec, _config
from regency.core import _messages as M
from regency.core._controller import current_runtime
from regency.core._output_tail import TailRing, format_tail, read_tail, tail_path
from regency.supervision import MeshFailure

from ..conftest import SpawnProcs, root_failures
from .capture_actors import Writer, fail_to_boot

T = 60


# -- configuration --------------------------------------------------------------------------


def test_defaults_are_monarchs_and_the_keys_apply(configured: Callable[..., None]) -> None:
    settings = config.get_global_config()
    assert settings["enable_file_capture"] is False and settings["tail_log_lines"] == 0
    # Monarch's own form (its config tests): both keys, with log forwarding.
    with config.configured(
        enable_log_forwarding=True, enable_file_capture=True, tail_log_lines=100
    ) as seen:
        assert seen["enable_file_capture"] is True and seen["tail_log_lines"] == 100
    assert config.get_global_config()["tail_log_lines"] == 0
    configured(tail_log_lines=5)
    assert _config.current_config().tees_output


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tail_log_lines": -1}, "tail_log_lines must be an int of 0 or more (got -1)"),
        ({"tail_log_lines": "100"}, "tail_log_lines must be an int of 0 or more (got '100')"),
        ({"tail_log_lines": 2.5}, "tail_log_lines must be an int of 0 or more (got 2.5)"),
        ({"tail_log_lines": True}, "tail_log_lines must be an int of 0 or more (got True)"),
        ({"enable_file_capture": "yes"}, "enable_file_capture must be True or False (got 'yes')"),
        ({"enable_file_capture": 1}, "enable_file_capture must be True or False (got 1)"),
        (
            {"file_capture_max_bytes": 0},
            "file_capture_max_bytes must be a positive int of bytes (got 0)",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(
    configured: Callable[..., None], settings: dict[str, object], message: str
) -> None:
    before = config.get_runtime_config()
    with pytest.raises(ValueError, match=re.escape(message)):
        config.configure(enable_log_forwarding=True, **settings)
    assert config.get_runtime_config() == before  # nothing applied


def test_bad_environment_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_TAIL_LOG_LINES", "many")
    with pytest.raises(ValueError, match="REGENCY_TAIL_LOG_LINES must be int"):
        _config.Config(**_config._from_env())
    monkeypatch.setenv("REGENCY_TAIL_LOG_LINES", "-2")
    with pytest.raises(ValueError, match=re.escape("tail_log_lines must be an int of 0 or more")):
        _config.Config(**_config._from_env())
    monkeypatch.setenv("REGENCY_TAIL_LOG_LINES", "7")
    monkeypatch.setenv("REGENCY_ENABLE_FILE_CAPTURE", "on")
    settings = _config.Config(**_config._from_env())
    assert settings.tail_log_lines == 7 and settings.enable_file_capture


# -- the tail ring, on its own ----------------------------------------------------------------


def test_the_ring_keeps_the_last_lines_through_wraps(tmp_path: Path) -> None:
    path = str(tmp_path / "p.tail")
    ring = TailRing(path, lines=3, line_bytes=64)
    written: list[tuple[str, str]] = []
    n = 0
    for batch in range(400):  # batches of 1..7 lines, of 0..80 characters, both streams
        stream = 1 + batch % 2
        lines = [f"{n + i}:" + "é" * ((n + i) % 40) for i in range(1 + batch % 7)]
        n += len(lines)
        ring.append(stream, lines)
        name = "stdout" if stream == 1 else "stderr"
        written += [(name, line.encode()[:64].decode("utf-8", "replace")) for line in lines]
        if batch % 37 == 0:
            assert read_tail(path, remove=False) == tuple(written[-3:])
    assert read_tail(path) == tuple(written[-3:])
    assert not os.path.exists(path)  # read once, removed
    assert read_tail(path) == ()


def test_a_batch_larger_than_the_ring_keeps_its_newest_lines(tmp_path: Path) -> None:
    path = str(tmp_path / "p.tail")
    ring = TailRing(path, lines=2, line_bytes=16)
    ring.append(1, [f"line {i}" for i in range(1000)])
    assert read_tail(path) == (("stdout", "line 998"), ("stdout", "line 999"))
    ring = TailRing(path, lines=5, line_bytes=16)
    ring.append(2, ["only one"])
    assert read_tail(path) == (("stderr", "only one"),)


def test_a_ring_asked_for_more_lines_than_fit_keeps_what_fits(tmp_path: Path) -> None:
    """Any count the setting accepts works: the ring holds at most what its 64 MiB fit."""
    path = str(tmp_path / "p.tail")
    ring = TailRing(path, lines=1 << 40, line_bytes=16)
    ring.append(2, ["first", "second"])
    assert read_tail(path) == (("stderr", "first"), ("stderr", "second"))


def test_the_failure_text_of_a_tail() -> None:
    assert format_tail(()) == ""
    assert format_tail((("stdout", "a"), ("stderr", "b"))) == (
        "; its last 2 lines of output:\n    [stdout] a\n    [stderr] b"
    )
    assert format_tail((("stderr", "b"),)) == "; its last 1 line of output:\n    [stderr] b"


def test_a_workers_exit_report_carries_the_tail() -> None:
    """Procs on other hosts: their worker reads the tail and sends it with the exit."""
    for record in (
        M.Exited("tcp://10.0.0.2:7001", -9),
        M.Exited("tcp://10.0.0.2:7001", 3, (("stdout", "step 5"), ("stderr", "dying now"))),
    ):
        frame = _codec.encode(record)
        data = frame if isinstance(frame, bytes) else b"".join(bytes(p) for p in frame)
        assert _codec.decode(memoryview(data)) == record


# -- capture files ----------------------------------------------------------------------------


def _job_dir(base: Path) -> Path:
    jobs = list(base.iterdir())
    assert len(jobs) == 1, jobs
    assert re.fullmatch(r"\d{8}-\d{6}-c\d+", jobs[0].name), jobs[0].name
    return jobs[0]


def test_each_proc_writes_its_own_files(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    configured(enable_file_capture=True, file_capture_dir=str(tmp_path))
    pm = spawn_procs({"gpus": 2})
    writers = pm.spawn("writers", Writer)
    who = writers.whoami.call().get(T)
    writers.say.call("A").get(T)
    pm.stop().get(T)  # the files are complete once the procs have exited
    job = _job_dir(tmp_path)
    assert stat.S_IMODE(job.stat().st_mode) == 0o700
    expected = set()
    for _, (proc_id, rank, _) in who.items():
        stem = f"{proc_id}.rank{rank}"
        expected |= {f"{stem}.stdout", f"{stem}.stderr"}
        out = (job / f"{stem}.stdout").read_text()
        err = (job / f"{stem}.stderr").read_text()
        # Python, raw fd writes and a subprocess, as written, each on its own stream.
        assert sorted(out.splitlines()) == sorted(
            [f"out A {rank}", f"raw A {rank}", f"sub A {rank}"]
        )
        assert err == f"err A {rank}\n"
        assert stat.S_IMODE((job / f"{stem}.stdout").stat().st_mode) == 0o600
    assert {p.name for p in job.iterdir()} == expected


def test_a_chatty_proc_is_bounded_by_rotation(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    limit = 4096
    configured(enable_file_capture=True, file_capture_dir=str(tmp_path),
               file_capture_max_bytes=limit)
    pm = spawn_procs({"gpus": 1})
    writer = pm.spawn("chatty", Writer)
    proc_id, rank, _ = writer.whoami.call_one().get(T)
    writer.lines.call_one(600).get(T)  # 600 lines of 53 bytes: about 8 times the limit
    pm.stop().get(T)
    job = _job_dir(tmp_path)
    stem = job / f"{proc_id}.rank{rank}.stdout"
    assert sorted(p.name for p in job.iterdir()) == sorted(
        [stem.name, stem.name + ".1", f"{proc_id}.rank{rank}.stderr"]
    )
    older, newest = Path(str(stem) + ".1").read_text(), stem.read_text()
    assert 0 < len(older.encode()) <= limit and 0 < len(newest.encode()) <= limit
    # Rotated at lines' ends: the two files hold the last lines, whole and in order.
    kept = (older + newest).splitlines()
    first = int(kept[0].split()[1])
    assert kept == [f"line {i:06d} " + "x" * 40 for i in range(first, 600)]


def test_an_unsafe_default_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default directory lies in the shared temporary directory: one that others may
    write is not used, and the proc says why on its host's stderr."""
    import tempfile

    from regency._logs._capture import FileCapture, default_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = Path(default_dir())
    assert base.parent == tmp_path and base.name.startswith("regency-logs-")
    base.mkdir(mode=0o700)
    os.chmod(base, 0o777)
    said: list[str] = []
    capture = FileCapture("", 1 << 20, "c1.p0", said.append)
    capture.write(1, b"secret\n")
    capture.open("job", 0)
    assert capture.broken and list(base.iterdir()) == []
    assert said == [
        f"[regency: file capture of proc c1.p0 is off: could not open the capture files in "
        f"{base}/job: {base} may be written by others (mode 777); make it 0700 or set "
        "file_capture_dir]\n"
    ]
    os.chmod(base, 0o700)
    capture = FileCapture("", 1 << 20, "c1.p0", said.append)
    capture.write(1, b"held until the rank is known\n")
    capture.open("job", 3)
    assert (base / "job" / "c1.p0.rank3.stdout").read_text() == "held until the rank is known\n"


# -- the last lines of a dead proc ------------------------------------------------------------

LAST_FOUR = (
    "; its last 4 lines of output:\n"
    "    [stdout] step 3\n"
    "    [stdout] step 4\n"
    "    [stdout] step 5\n"
    "    [stderr] dying now"
)


def _exits_with_status_3(pm: ProcMesh, name: str, tail: str) -> tuple[str, int, MeshFailure]:
    """Spawn a ``Writer`` as ``name`` on ``pm`` and have it print 6 lines and exit with
    status 3: the caller's error and the root's supervision event both end with ``tail``.
    The proc's id and rank, and the event."""
    dying = pm.spawn(name, Writer)
    proc_id, rank, _ = dying.whoami.call_one().get(T)
    with pytest.raises(SupervisionError) as caught:
        dying.last_words.call_one(6, 3).get(T)
    summary = f"proc {proc_id} exited with status 3{tail}"
    assert str(caught.value).endswith(summary), caught.value
    # The supervision event says it too (the root's report, here recorded by the tests).
    failure = root_failures.wait_for(name, T)
    assert failure.cause.summary == summary
    return proc_id, rank, failure


def test_os_exit_reports_the_last_lines(
    spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    configured(tail_log_lines=4)
    pm = spawn_procs({"gpus": 1})
    proc_id, _, failure = _exits_with_status_3(pm, "exits", LAST_FOUR)
    assert LAST_FOUR in str(failure)
    # The spawner read the proc's tail file and removed it.
    assert not os.path.exists(tail_path(current_runtime().jobdir, proc_id))


def test_sigkill_reports_the_last_lines_and_stacks_show_them(
    spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    configured(tail_log_lines=4)
    pm = spawn_procs({"gpus": 1})
    victim = pm.spawn("killed", Writer)
    proc_id, _, _ = victim.whoami.call_one().get(T)
    pid = victim.last_words.call_one(6, None).get(T)
    os.kill(pid, signal.SIGKILL)
    failure = root_failures.wait_for("killed", T)
    summary = f"proc {proc_id} was killed by signal 9 (SIGKILL){LAST_FOUR}"
    assert failure.cause.summary == summary
    with pytest.raises(SupervisionError, match=re.escape(summary)):
        victim.whoami.call_one().get(T)
    (proc,) = regency.stacks(pm).procs
    assert not proc.answered and proc.reason == f"exited: {summary}"


def test_a_proc_that_fails_to_boot_reports_its_traceback(
    spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    configured(tail_log_lines=2)
    pm = spawn_procs({"gpus": 1}, bootstrap=fail_to_boot)
    with pytest.raises(SupervisionError) as caught:
        pm.initialized.get(T)
    message = str(caught.value)
    head, _, tail = message.partition("; its last 2 lines of output:\n")
    # The proc reported what its bootstrap raised before it exited, traceback and all.
    assert re.match(
        r"proc c\d+\.p\d+'s bootstrap function raised builtins.ValueError: "
        r"no checkpoint at /ckpt/7\nRemote traceback:\n", head
    ), message
    assert "in fail_to_boot" in head, message
    # The proc's last words are its traceback (on stderr), ending with the exception.
    assert tail.splitlines()[-1].startswith("    [stderr] ")
    assert "ValueError: no checkpoint at /ckpt/7" in tail, message


def test_a_stopped_proc_drains_its_pipes_at_exit(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    """A proc told to stop exits through Python's finalization: what it wrote last, even
    a line without its newline, reaches its tail and its file."""
    configured(tail_log_lines=2, enable_file_capture=True, file_capture_dir=str(tmp_path))
    pm = spawn_procs({"gpus": 1})
    writer = pm.spawn("stopped", Writer)
    proc_id, rank, _ = writer.whoami.call_one().get(T)
    writer.say.call_one("S").get(T)
    writer.unfinished.call_one("no newline yet").get(T)
    pm.stop().get(T)
    (child,) = [c for c in current_runtime().children.values() if c.proc_id == proc_id]
    assert child.returncode == 0
    assert child.output_tail[-1] == ("stdout", "no newline yet")
    out = (_job_dir(tmp_path) / f"{proc_id}.rank{rank}.stdout").read_text()
    assert out.endswith("no newline yet")


def test_no_tail_without_tail_log_lines(
    spawn_procs: SpawnProcs, configured: Callable[..., None]
) -> None:
    configured(tail_log_lines=0)
    pm = spawn_procs({"gpus": 1})
    proc_id, _, _ = _exits_with_status_3(pm, "untailed", "")
    # Nothing was teed: no tail file was ever made.
    assert not os.path.exists(tail_path(current_runtime().jobdir, proc_id))


def test_procs_on_another_host_report_their_tail(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    """A worker reads its proc's tail and sends it with the exit; capture files are written
    on the worker's host under the controller's job name."""
    from regency.actor import attach_to_workers
    from regency.testing import virtual_hosts, virtual_hosts_available

    from ..conftest import TEST_SECRET

    why = virtual_hosts_available()
    if why is not None:
        pytest.skip(str(why))
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden: the test worker would not match")
    configured(tail_log_lines=4, enable_file_capture=True, file_capture_dir=str(tmp_path))
    local = spawn_procs({"gpus": 1})
    local.spawn("local", Writer).say.call("L").get(T)  # names the job here first
    with virtual_hosts(1) as (host,):
        host.start_worker(TEST_SECRET, scheme="tcp")
        try:
            mesh = attach_to_workers([host.worker_address], lease=30.0)
            try:
                pm = spawn_procs({"gpus": 1}, on=mesh)
                proc_id, rank, _ = _exits_with_status_3(pm, "remote", LAST_FOUR)
            finally:
                mesh.shutdown().get(T)
        finally:
            host.stop_worker()
    out = (_job_dir(tmp_path) / f"{proc_id}.rank{rank}.stdout").read_text()
    assert out == "".join(f"step {i}\n" for i in range(6))


def test_files_are_written_while_the_proc_runs(
    spawn_procs: SpawnProcs, configured: Callable[..., None], tmp_path: Path
) -> None:
    """A proc's files grow as it prints, not only when it ends (``tail -f`` works)."""
    configured(enable_file_capture=True, file_capture_dir=str(tmp_path))
    pm = spawn_procs({"gpus": 1})
    writer = pm.spawn("live", Writer)
    proc_id, rank, _ = writer.whoami.call_one().get(T)
    writer.lines.call_one(3, 1).get(T)  # returns once its tee has read them
    path = _job_dir(tmp_path) / f"{proc_id}.rank{rank}.stdout"
    assert path.read_text() == "".join(f"line {i:06d} x\n" for i in range(3))


def _simulated(hosts: object) -> None:
    procs = hosts.spawn_procs(per_host={"gpus": 2})  # type: ignore[attr-defined]
    writers = procs.spawn("w", Writer)
    writers.whoami.call().get()
    procs.stop().get()


def test_the_simulator_runs_with_both_settings_and_writes_nothing(tmp_path: Path) -> None:
    """Simulated procs have no tee (docs/logging.md): the settings are accepted, and no
    file is written (no real I/O inside a simulation)."""
    from regency.sim import simulate

    with _config.overridden(
        enable_file_capture=True, file_capture_dir=str(tmp_path), tail_log_lines=3
    ):
        simulate(_simulated, seed=1, hosts=1)
    assert list(tmp_path.iterdir()) == []
