"""The zygote started at ``import regency`` (regency/_prestart.py): adopted by the first
spawn, with the controller's environment and directory as they are at the spawn; never left
behind, whether the controller spawns or not, exits or is killed."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote is Linux-only"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = 30.0


@contextmanager
def _controller(script: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    environ = {**os.environ, "PYTHONPATH": ROOT, **env}
    environ.pop("REGENCY_ZYGOTE", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
        cwd=ROOT,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=T)


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        raise AssertionError(f"controller exited early: {proc.wait(T)}\n{proc.stderr.read()}")
    return line.strip()


def _wait_gone(pidfd: int) -> bool:
    ready, _, _ = select.select([pidfd], [], [], T)
    return bool(ready)


_IDLE = """
    import sys
    import regency.actor
    from regency import _prestart
    print(_prestart._zygote.popen.pid if _prestart._zygote else 0, flush=True)
    sys.stdin.readline()
"""


@pytest.mark.parametrize("how", ["exits", "is killed"])
def test_a_controller_that_never_spawns_leaves_no_zygote(how: str) -> None:
    with _controller(_IDLE) as proc:
        zygote = int(_line(proc))
        assert zygote > 0, "import regency.actor started no zygote"
        pidfd = os.pidfd_open(zygote)
        try:
            if how == "exits":
                assert proc.stdin is not None
                proc.stdin.write("\n")
                proc.stdin.flush()
                assert proc.wait(T) == 0
            else:
                proc.send_signal(signal.SIGKILL)
                proc.wait(T)
            assert _wait_gone(pidfd), f"zygote {zygote} outlived a controller that {how}"
        finally:
            os.close(pidfd)


def test_the_first_spawn_adopts_it_with_the_environment_and_directory_of_now() -> None:
    script = """
        import os
        os.environ["REGENCY_TEST_EARLY"] = "at import"
        os.environ["REGENCY_TEST_GONE"] = "set at import, removed later"
        import regency.actor
        from regency import _prestart
        from regency.actor import Actor, endpoint, this_host
        zygote = _prestart._zygote.popen.pid
        os.environ["REGENCY_TEST_EARLY"] = "changed later"
        os.environ["REGENCY_TEST_LATE"] = "set later"
        del os.environ["REGENCY_TEST_GONE"]
        os.chdir("/")

        class Probe(Actor):
            @endpoint
            def seen(self) -> tuple:
                children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read()
                return (
                    os.getppid(),
                    os.environ.get("REGENCY_TEST_EARLY"),
                    os.environ.get("REGENCY_TEST_LATE"),
                    os.environ.get("REGENCY_TEST_GONE"),
                    os.getcwd(),
                    children.split(),
                )

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        print(repr((zygote, pm.spawn("p", Probe).seen.call_one().get(30))), flush=True)
        pm.stop().get(30)
    """
    with _controller(script) as proc:
        zygote, (parent, early, late, gone, cwd, children) = eval(_line(proc))
    assert parent == zygote  # forked by the zygote started at import
    assert (early, late, gone) == ("changed later", "set later", None)
    assert cwd == "/"
    assert children == []  # a proc imports regency too, but starts no zygote of its own


def test_a_zygote_whose_stdout_is_stale_is_not_adopted(tmp_path: object) -> None:
    # Procs inherit fds 1 and 2 from the zygote: one started before the controller pointed
    # them elsewhere would send the procs' output to the old place.
    script = """
        import os, sys
        import regency.actor
        from regency import _prestart
        from regency.actor import Actor, endpoint, this_host
        early = _prestart._zygote.popen.pid
        out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        saved = os.dup(1)
        os.dup2(out, 1)
        from regency.core import current_runtime
        current_runtime()
        os.dup2(saved, 1)

        class Printer(Actor):
            @endpoint
            def say(self) -> int:
                print("from the proc", flush=True)
                return os.getppid()

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        parent = pm.spawn("p", Printer).say.call_one().get(30)
        pm.stop().get(30)
        print(repr((early, parent)), flush=True)
    """
    target = os.path.join(str(tmp_path), "host-out")
    environ = {**os.environ, "PYTHONPATH": ROOT}
    environ.pop("REGENCY_ZYGOTE", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), target],
        capture_output=True,
        text=True,
        env=environ,
        timeout=T,
    )
    assert done.returncode == 0, done.stderr
    early, parent = eval(done.stdout.strip().splitlines()[-1])
    assert parent != early
    assert "from the proc" not in done.stdout
    with open(target) as f:
        assert "from the proc" in f.read()


def test_a_simulated_controller_lets_it_go() -> None:
    script = """
        import sys
        import regency
        from regency import _prestart
        zygote = _prestart._zygote.popen.pid
        print(zygote, flush=True)
        regency.configure(runtime="sim")
        from regency.core import current_runtime
        current_runtime()
        print(_prestart._zygote is None, flush=True)
        sys.stdin.readline()
    """
    with _controller(script) as proc:
        zygote = int(_line(proc))
        pidfd = os.pidfd_open(zygote)
        try:
            assert _line(proc) == "True"
            assert _wait_gone(pidfd), "the zygote outlived the switch to the simulator"
        finally:
            os.close(pidfd)


def test_a_forked_child_leaves_its_parents_zygote_alone() -> None:
    script = """
        import os
        import regency.actor
        from regency import _prestart
        child = os.fork()
        if child == 0:
            os._exit(0 if _prestart.take() is None else 3)
        _, status = os.waitpid(child, 0)
        print(os.waitstatus_to_exitcode(status), _prestart.take() is not None, flush=True)
    """
    with _controller(script) as proc:
        assert _line(proc) == "0 True"
