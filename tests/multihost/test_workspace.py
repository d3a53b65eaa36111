"""HostMesh.sync_workspace between network-namespace hosts whose file systems differ.

Each worker runs in a network namespace of its own and in a mount namespace of its own with
an empty tmpfs over the test's base directory: the controller's workspace (under that
directory) does not exist on either host, and neither host sees the other's copy. The test
reads each host's files through ``/proc/<worker pid>/root`` (the worker's view), not
through Regency. Host 0 has no ``WORKSPACE_DIR`` (a directory goes to the same path as on
the controller); host 1 has one (``$WORKSPACE_DIR/<name>``, Monarch's rule).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from regency.actor import (
    Actor,
    HostMesh,
    SupervisionError,
    attach_to_workers,
    endpoint,
    this_host,
    this_proc,
)
from regency.core import current_runtime
from regency.core._proc_mesh import ProcMesh
from regency.testing import VirtualHost, virtual_hosts, virtual_hosts_available
from regency.tools.config.environment import CondaEnvironment
from regency.tools.config.workspace import Workspace, WorkspaceError, WorkspaceSync

from ..conftest import TEST_SECRET, TEST_WORKER_PREFIX, SpawnProcs, root_failures

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        virtual_hosts_available() is not None, reason=str(virtual_hosts_available())
    ),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare"),
]
T = 60
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = "import sys\nfrom regency.__main__ import main\nsys.exit(main(['worker', '--listen', sys.argv[1]]))"
#: Mount a tmpfs over $1 in a mount namespace of our own, then become the worker.
PRIVATE_BASE = 'mount -t tmpfs -o size=256m,mode=755 regency-ws "$1" && shift && exec "$@"'


class Host:
    """A worker in a virtual host with a file system of its own over the base directory."""

    def __init__(self, host: VirtualHost, port: int, base: str, env: dict[str, str]) -> None:
        self.address = f"tcp://{host.ip}:{port}"
        self.tmp = tempfile.mkdtemp(prefix=f"{TEST_WORKER_PREFIX}{os.getpid()}-")
        full_env = {
            **os.environ, "REGENCY_SECRET": TEST_SECRET, "PYTHONPATH": ROOT, "TMPDIR": self.tmp,
            **env,
        }
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", host.name, "unshare", "--mount", "--propagation", "private",
             "sh", "-c", PRIVATE_BASE, "sh", base, sys.executable, "-c", WORKER, self.address],
            stdout=subprocess.PIPE, env=full_env, text=True, cwd="/",
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening" in line, line

    def path(self, path: str) -> str:
        """``path`` as this host sees it (through its worker's root)."""
        return f"/proc/{self.proc.pid}/root{path}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + T
        while any(n.startswith("regency-") for n in os.listdir(self.tmp)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)  # the worker's zygote removes its job directory
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    made = tempfile.mkdtemp(prefix="rgws-")
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts(base: str) -> Iterator[list[Host]]:
    if os.environ.get("REGENCY_SECRET") != TEST_SECRET:
        pytest.skip("REGENCY_SECRET was overridden: the test workers would not match")
    made: list[Host] = []
    port = 7900 + 10 * (os.getpid() % 50)
    with virtual_hosts(2) as machines:
        try:
            made.append(Host(machines[0], port, base, {}))
            made.append(Host(machines[1], port, base, {"WORKSPACE_DIR": f"{base}/remote"}))
            yield made
        finally:
            for h in made:
                h.stop()


@pytest.fixture(scope="module")
def mesh(hosts: list[Host]) -> Iterator[HostMesh]:
    attached = attach_to_workers([h.address for h in hosts], lease=30.0)
    yield attached
    attached.shutdown().get(T)


@pytest.fixture
def project(base: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh workspace directory on the controller, named after the test."""
    path = os.path.join(base, request.node.name.replace("test_", "")[:40])
    os.makedirs(path)
    yield path
    sys.path[:] = [p for p in sys.path if p != path]


def _dest(hosts: list[Host], i: int, project: str) -> str:
    """Where host ``i`` keeps ``project``: host 0 at the same path, host 1 under its
    WORKSPACE_DIR."""
    if i == 0:
        return project
    return os.path.join(os.path.dirname(project), "remote", os.path.basename(project))


def _write(path: str, data: bytes | str, mode: int | None = None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)


def _tree(root: str) -> dict[str, tuple[str, int, bytes | str]]:
    """Every entry under ``root`` but bytecode caches: kind, mode, content or link target."""
    found: dict[str, tuple[str, int, bytes | str]] = {}
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
            else:
                with open(path, "rb") as f:
                    found[rel] = ("file", stat.S_IMODE(st.st_mode), f.read())
    return found


def test_files_arrive_identical_and_only_what_changed_travels(
    mesh: HostMesh, hosts: list[Host], project: str
) -> None:
    big = os.urandom(9 << 20)  # more than two calls' worth of contents
    _write(f"{project}/main.py", "print('main')\n")
    _write(f"{project}/run.sh", "#!/bin/sh\necho run\n", 0o755)
    _write(f"{project}/secret.txt", "only me\n", 0o600)
    _write(f"{project}/empty.txt", b"")
    _write(f"{project}/data/big.bin", big)
    _write(f"{project}/data/same_a.txt", "twice\n")
    _write(f"{project}/data/deeper/same_b.txt", "twice\n")
    _write(f"{project}/__pycache__/main.cpython-311.pyc", b"not synced")
    os.symlink("main.py", f"{project}/latest.py")
    os.chmod(f"{project}/data", 0o750)
    for i, h in enumerate(hosts):  # neither host has it, nor sees the controller's
        assert not os.path.exists(h.path(_dest(hosts, i, project)))

    first = mesh.sync_workspace(Workspace(dirs=[project])).get(T)

    assert isinstance(first, WorkspaceSync)
    expected = _tree(project)
    contents = {b"print('main')\n", b"#!/bin/sh\necho run\n", b"only me\n", b"", big, b"twice\n"}
    for i, (h, done) in enumerate(zip(hosts, first.hosts, strict=True)):
        dest = _dest(hosts, i, project)
        assert done.destinations == (dest,)
        assert _tree(h.path(dest)) == expected
        assert not os.path.exists(h.path(f"{dest}/__pycache__"))  # each host has its own
        assert done.files_sent == len(contents)  # the duplicate travelled once
        assert done.bytes_sent == sum(len(c) for c in contents)
        assert len(done.written) == 8 and done.deleted == () and done.shared == ()

    # One file changed: only it travels.
    _write(f"{project}/main.py", "print('main, changed')\n")
    second = mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    for i, (h, done) in enumerate(zip(hosts, second.hosts, strict=True)):
        dest = _dest(hosts, i, project)
        assert (done.files_sent, done.bytes_sent) == (1, len("print('main, changed')\n"))
        assert done.written == (f"{dest}/main.py",) and done.deleted == ()
        assert _tree(h.path(dest)) == _tree(project)

    # Deleted files and directories go; a moved file is copied on the host, not sent.
    os.unlink(f"{project}/secret.txt")
    shutil.rmtree(f"{project}/data/deeper")
    os.rename(f"{project}/data/big.bin", f"{project}/moved.bin")
    os.chmod(f"{project}/run.sh", 0o700)
    third = mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    for i, (h, done) in enumerate(zip(hosts, third.hosts, strict=True)):
        dest = _dest(hosts, i, project)
        assert (done.files_sent, done.bytes_sent) == (0, 0)
        assert sorted(done.deleted) == [
            f"{dest}/data/big.bin", f"{dest}/data/deeper/same_b.txt", f"{dest}/secret.txt"
        ]
        assert done.written == (f"{dest}/moved.bin",)
        assert _tree(h.path(dest)) == _tree(project)
        assert not os.path.exists(h.path(f"{dest}/data/deeper"))
    assert third.files_sent == 0


def test_a_proc_spawned_after_the_sync_imports_from_the_workspace(
    mesh: HostMesh, hosts: list[Host], project: str, spawn_procs: SpawnProcs
) -> None:
    _write(
        f"{project}/greeter_mod.py",
        textwrap.dedent(
            """
            from regency.actor import Actor, endpoint

            class Greeter(Actor):
                @endpoint
                def hello(self) -> str:
                    return "hello from " + __file__
            """
        ),
    )
    sys.path.insert(0, project)  # the controller imports it from its own directory
    from greeter_mod import Greeter  # type: ignore[import-not-found]

    mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    procs = spawn_procs(per_host={"gpus": 1}, on=mesh)
    answers = procs.spawn("greeters", Greeter).hello.call().get(T).values()
    assert answers == [
        f"hello from {_dest(hosts, i, project)}/greeter_mod.py" for i in range(2)
    ]


def test_auto_reload_makes_a_running_actor_see_changed_code(
    mesh: HostMesh, hosts: list[Host], project: str, spawn_procs: SpawnProcs
) -> None:
    _write(f"{project}/helper_mod.py", "def value():\n    return 1\n")
    _write(
        f"{project}/holder_mod.py",
        textwrap.dedent(
            """
            import helper_mod
            from regency.actor import Actor, endpoint

            class Holder(Actor):
                @endpoint
                def value(self) -> int:
                    return helper_mod.value()
            """
        ),
    )
    sys.path.insert(0, project)
    from holder_mod import Holder  # type: ignore[import-not-found]

    mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    procs = spawn_procs(per_host={"gpus": 2}, on=mesh)
    holders = procs.spawn("holders", Holder)
    assert holders.value.call().get(T).values() == [1, 1, 1, 1]

    # Without auto_reload the files change on the hosts, the running code does not.
    _write(f"{project}/helper_mod.py", "def value():\n    return 20\n")
    quiet = mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    assert [h.reloaded for h in quiet.hosts] == [{}, {}]
    assert holders.value.call().get(T).values() == [1, 1, 1, 1]

    _write(f"{project}/helper_mod.py", "def value():\n    return 300\n")
    loud = mesh.sync_workspace(Workspace(dirs=[project]), auto_reload=True).get(T)
    assert holders.value.call().get(T).values() == [300, 300, 300, 300]
    for done in loud.hosts:
        assert len(done.reloaded) == 2  # the host's two procs; not the sync's own
        assert all("helper_mod" in modules for modules in done.reloaded.values())


def test_conda_syncs_the_environment_to_the_same_path(
    mesh: HostMesh, hosts: list[Host], project: str
) -> None:
    env, code = f"{project}/env", f"{project}/code"
    _write(f"{env}/lib/python3/site-packages/thing/__init__.py", "X = 1\n")
    _write(f"{env}/bin/tool", "#!/bin/sh\n", 0o755)
    _write(f"{code}/main.py", "")
    name = os.path.basename(project)
    workspace = Workspace(dirs={code: f"{name}/code"}, env=CondaEnvironment(env))
    result = mesh.sync_workspace(workspace, conda=True).get(T)
    for i, (h, done) in enumerate(zip(hosts, result.hosts, strict=True)):
        # The environment goes to its own path everywhere (WORKSPACE_DIR or not).
        assert done.destinations == (f"{_dest(hosts, i, project)}/code", env)
        assert _tree(h.path(env)) == _tree(env)


def test_a_host_that_sees_the_controllers_directory_is_left_alone(
    project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This host, without WORKSPACE_DIR: the destination is the controller's own directory
    (as on a shared file system), found so by a probe file, and nothing is written or
    deleted there."""
    monkeypatch.delenv("WORKSPACE_DIR", raising=False)
    _write(f"{project}/a.py", "A = 1\n")
    result = this_host().sync_workspace(Workspace(dirs=[project])).get(T)
    (done,) = result.hosts
    assert done.destinations == done.shared == (project,)
    assert (done.files_sent, done.written, done.deleted) == (0, (), ())
    assert os.listdir(project) == ["a.py"]  # the probe is gone too


def test_bad_input_is_refused_naming_it(
    mesh: HostMesh, hosts: list[Host], project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = f"{project}/missing"
    with pytest.raises(FileNotFoundError, match=f"workspace directory {missing} does not exist"):
        mesh.sync_workspace(Workspace(dirs=[missing]))
    _write(f"{project}/a_file", "x")
    with pytest.raises(NotADirectoryError, match=f"{project}/a_file is not a directory"):
        mesh.sync_workspace(Workspace(dirs=[f"{project}/a_file"]))
    os.makedirs(f"{project}/src/inner")
    with pytest.raises(ValueError, match=r"must lie inside \$WORKSPACE_DIR.*'\.\./etc'"):
        mesh.sync_workspace(Workspace(dirs={f"{project}/src": "../etc"}))
    with pytest.raises(ValueError, match=r"must lie inside.*'/etc'"):
        mesh.sync_workspace(Workspace(dirs={f"{project}/src": "/etc"}))
    with pytest.raises(ValueError, match="would be synced into one another"):
        mesh.sync_workspace(Workspace(dirs=[f"{project}/src", f"{project}/src/inner"]))
    with pytest.raises(ValueError, match="whole file system"):
        mesh.sync_workspace(Workspace(dirs=["/"]))
    with pytest.raises(TypeError, match=r"needs a Workspace.*got str"):
        mesh.sync_workspace(project)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Workspace dirs must be a list or a dict"):
        Workspace(dirs=project)  # type: ignore[arg-type]
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    with pytest.raises(ValueError, match=r"no conda environment is active \(\$CONDA_PREFIX"):
        mesh.sync_workspace(Workspace(dirs=[f"{project}/src"]), conda=True)
    with pytest.raises(NotImplementedError, match=r"Use HostMesh\.sync_workspace"):
        this_proc().sync_workspace(Workspace(dirs=[f"{project}/src"]))  # as in Monarch
    # On a host, where a directory's destination is a file: the error names the host.
    name = os.path.basename(project)
    _write(hosts[1].path(f"{os.path.dirname(project)}/remote/{name}-dest"), "in the way")
    with pytest.raises(WorkspaceError, match=(
        rf"sync_workspace on \S+ \({hosts[1].address}\): NotADirectoryError: the workspace "
        rf"destination \S+/remote/{name}-dest exists and is not a directory"
    )):
        mesh.sync_workspace(Workspace(dirs={f"{project}/src": f"{name}-dest"})).get(T)
    # Host 0 took its part of the plan, and nothing of it stayed when host 1 refused.
    assert not os.path.exists(hosts[0].path(f"{project}/src"))


class _Exiter(Actor):
    @endpoint
    def exit_now(self) -> None:
        os._exit(7)


def _workspace_client() -> Any:
    from regency.core._workspace_sync import WorkspaceClient

    rt = current_runtime()
    (cell,) = [c for c in list(rt.actors.values()) if isinstance(c.obj, WorkspaceClient)]
    return cell.obj


def test_a_lost_host_proc_is_replaced_alone(
    mesh: HostMesh, hosts: list[Host], project: str
) -> None:
    """One host's sync proc dies: the next sync spawns a new one there only; the other
    host keeps its proc (none is left running unused)."""
    _write(f"{project}/a.py", "A = 1\n")
    mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    client = _workspace_client()
    keys = [h.address for h in hosts]
    assert set(keys) <= set(client._hosts)
    doomed = client._hosts[keys[1]][1]
    proc_id = next(c.proc_id for a, c in current_runtime().children.items() if a == doomed)
    with pytest.raises(SupervisionError, match="exited with status 7"):
        ProcMesh._single(proc_id, doomed).spawn("exiter", _Exiter).exit_now.call_one().get(T)
    root_failures.wait_for("exiter", T)
    deadline = time.monotonic() + T
    while keys[1] in client._hosts:  # the client's __supervise__ learns of it
        assert time.monotonic() < deadline, "the client never heard of the lost proc"
        time.sleep(0.01)
    kept = client._hosts.get(keys[0])
    assert kept is not None, "the healthy host's sync proc was forgotten"
    _write(f"{project}/a.py", "A = 2\n")
    again = mesh.sync_workspace(Workspace(dirs=[project])).get(T)
    assert [h.files_sent for h in again.hosts] == [1, 1]
    assert client._hosts[keys[0]][1] == kept[1]  # the same proc served host 0
    assert client._hosts[keys[1]][1] != doomed
