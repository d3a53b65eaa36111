"""Monarch 0.7 tests that failed on Regency: Monarch's ``mesh_attach_config_timeout``
and ``mesh_orphan_timeout`` keys, ``ActorInstance.creator``, and the per-user job secret
``~/.regency/secret`` that workers and a controller of one user share without
``REGENCY_SECRET``."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from regency.actor import Actor, context, endpoint, this_proc
from regency.config import configure, configured, get_global_config
from regency.core import _controller
from regency.core._hosts import secret_text, user_secret, user_secret_path

from ..conftest import SpawnProcs

T = 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- 1. mesh_attach_config_timeout, mesh_orphan_timeout -------------------------------------


def test_monarch_attach_and_orphan_timeouts_set_regencys_settings() -> None:
    with configured(mesh_attach_config_timeout="2s", mesh_orphan_timeout=7) as config:
        assert config["attach_timeout"] == 2.0
        assert config["worker_lease"] == 7.0
    assert get_global_config()["attach_timeout"] == 60.0
    assert get_global_config()["worker_lease"] == 10.0
    with pytest.raises(ValueError, match="always die when their controller is gone"):
        configure(mesh_orphan_timeout=None)


def _run(script: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_attach_gives_up_after_mesh_attach_config_timeout() -> None:
    """A 'worker' that accepts connections and never answers: attaching fails closed after the
    configured timeout, not the 60 s default."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        out = _run(
            f"""
            import time
            from regency.actor import attach_to_workers
            from regency.config import configure
            configure(mesh_attach_config_timeout="1.5s")
            started = time.monotonic()
            try:
                attach_to_workers(["tcp://127.0.0.1:{port}"]).initialized.get()
            except ConnectionError as exc:
                print("FAILED", round(time.monotonic() - started, 1), exc)
            """
        )
    assert out.startswith("FAILED"), out
    assert float(out.split()[1]) < 10, out
    assert "within 1.5 s (attach_timeout)" in out


@pytest.mark.slow
def test_mesh_orphan_timeout_is_the_lease_attach_to_workers_gives_workers() -> None:
    out = _run(
        """
        import socket
        from regency.actor import attach_to_workers, start_worker_loop_forever
        from regency.config import configure
        from regency.core._controller import current_runtime

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        lifetime = start_worker_loop_forever(
            address=f"tcp://127.0.0.1:{port}", ca="trust_all_connections"
        )
        configure(mesh_orphan_timeout="2.5s")
        hosts = attach_to_workers([f"tcp://127.0.0.1:{port}"])
        print("LEASE", current_runtime().hosts.lease)
        hosts.shutdown().get(30)
        lifetime.get(30)
        """
    )
    assert "LEASE 2.5" in out, out


# --- 2. ActorInstance.creator -----------------------------------------------------------------


class Named(Actor):
    @endpoint
    def report(self) -> tuple[str, str | None, str, bool]:
        creator = context().actor_instance.creator
        assert creator is not None
        return creator.name, creator.class_name, str(creator), creator.creator is None

    @endpoint
    def spawn_child(self) -> tuple[str, str | None, str, str, bool]:
        child = this_proc().spawn("child", Named)
        name, class_name, text, _ = child.report.call_one().get(T)
        creator_of_creator = child.creator_of_creator.call_one().get(T)
        same = child.creator_id.call_one().get(T) == context().actor_instance.actor_id
        return name, class_name, text, creator_of_creator, same

    @endpoint
    def creator_of_creator(self) -> str:
        creator = context().actor_instance.creator
        assert creator is not None and creator.creator is not None
        return str(creator.creator)

    @endpoint
    def creator_id(self) -> str:
        creator = context().actor_instance.creator
        assert creator is not None
        return creator.actor_id


def test_creator_of_a_mesh_the_main_code_spawned_is_the_root(spawn_procs: SpawnProcs) -> None:
    named = spawn_procs({"f": 2}).spawn("the_name", Named)
    assert named.slice(f=0).report.call_one().get(T) == ("root", None, "<root>", True)
    assert context().actor_instance.creator is None  # the root client has none


def test_creator_of_a_mesh_an_actor_spawned_is_that_actor(spawn_procs: SpawnProcs) -> None:
    parent = spawn_procs({"f": 1}).spawn("parent", Named)
    name, class_name, text, above, same_id = parent.spawn_child.call_one().get(T)
    assert same_id
    assert name == "parent"
    assert class_name == f"{Named.__module__}.Named"
    assert text == f"<{Named.__module__}.Named parent{{'f': 0/1}}>"
    assert above == "<root>"  # the parent's own creator


# --- 3. the per-user secret file -------------------------------------------------------------


@pytest.fixture
def home(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh HOME without REGENCY_SECRET (both restored after the test)."""
    path = str(tmp_path)
    monkeypatch.setenv("HOME", path)
    monkeypatch.delenv("REGENCY_SECRET", raising=False)
    yield path


def test_the_user_secret_is_made_once_private_and_then_shared(home: str) -> None:
    path = os.path.join(home, ".regency", "secret")
    assert user_secret_path() == path
    assert user_secret(create=False) is None
    text = secret_text()  # the first to need it makes it
    assert len(text.strip()) >= 16
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert secret_text() == text == user_secret(create=False)  # later ones read it
    assert os.listdir(os.path.dirname(path)) == ["secret"]  # no temporary left behind
    # With no REGENCY_SECRET, a controller's job secret is that file's.
    assert _controller.job_secret() == _controller.derive_secret(text)


def test_regency_secret_still_wins(home: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGENCY_SECRET", "a-secret-from-the-environment")
    assert secret_text() == "a-secret-from-the-environment"
    assert not os.path.exists(user_secret_path())  # not even made
    assert _controller.job_secret() == _controller.derive_secret("a-secret-from-the-environment")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_secret_file_others_can_read_is_refused(home: str, mode: int) -> None:
    secret_text()
    os.chmod(user_secret_path(), mode)
    with pytest.raises(PermissionError) as info:
        secret_text()
    message = str(info.value)
    assert user_secret_path() in message and f"mode {mode:04o}" in message
    assert "chmod 600" in message
    # A controller that does not attach is not stopped by it: it takes a fresh secret.
    assert len(_controller.job_secret()) == 32


def test_a_too_short_secret_file_is_refused(home: str) -> None:
    os.makedirs(os.path.join(home, ".regency"), mode=0o700)
    fd = os.open(user_secret_path(), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"short\n")
    os.close(fd)
    with pytest.raises(ValueError, match="at least 16 characters"):
        secret_text()


@pytest.mark.slow
def test_a_controller_without_regency_secret_attaches_with_the_user_secret(
    tmp_path: object,
) -> None:
    """The controller's side: no REGENCY_SECRET, its first attach makes the per-user file,
    and a worker holding that secret takes the attachment and runs procs for it."""
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["HOME"] = str(tmp_path)
    out = _run(
        """
        import os, socket, stat
        from regency.actor import _start_worker, attach_to_workers
        from regency.core._hosts import secret_text, user_secret_path
        from tests.jobs.actors import Probe

        assert "REGENCY_SECRET" not in os.environ
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        text = secret_text()  # as a worker of this user would, made here first
        lifetime, _ = _start_worker(
            f"tcp://127.0.0.1:{port}", env={**os.environ, "REGENCY_SECRET": text}
        )
        hosts = attach_to_workers([f"tcp://127.0.0.1:{port}"])
        print("MODE", oct(stat.S_IMODE(os.stat(user_secret_path()).st_mode)))
        probe = hosts.spawn_procs(per_host={"gpus": 1}).spawn("p", Probe)
        print("PIDS", probe.where.call_one().get(30)[0] > 0)
        hosts.shutdown().get(30)
        lifetime.get(30)
        """,
        env=env,
        timeout=120,
    )
    assert "MODE 0o600" in out and "PIDS True" in out, out


@pytest.mark.slow
def test_attaching_to_own_workers_needs_no_regency_secret(tmp_path: object) -> None:
    """A worker and a controller started by one user without REGENCY_SECRET share the
    per-user file, whichever comes first."""
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["HOME"] = str(tmp_path)
    out = _run(
        """
        import os, socket, stat
        from regency.actor import attach_to_workers, start_worker_loop_forever
        from regency.core._hosts import user_secret_path

        assert "REGENCY_SECRET" not in os.environ
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        lifetime = start_worker_loop_forever(
            address=f"tcp://127.0.0.1:{port}", ca="trust_all_connections"
        )
        hosts = attach_to_workers([f"tcp://127.0.0.1:{port}"])
        print("MODE", oct(stat.S_IMODE(os.stat(user_secret_path()).st_mode)))
        from tests.jobs.actors import Probe
        probe = hosts.spawn_procs(per_host={"gpus": 1}).spawn("p", Probe)
        print("PIDS", probe.where.call_one().get(30)[0] > 0)
        hosts.shutdown().get(30)
        lifetime.get(30)
        """,
        env=env,
        timeout=120,
    )
    assert "MODE 0o600" in out and "PIDS True" in out, out


def test_the_missing_secret_message_names_the_file(home: str) -> None:
    from regency.core._hosts import missing_secret_message

    assert user_secret_path() in missing_secret_message("attach_to_workers")
