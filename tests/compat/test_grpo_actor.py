"""Monarch's ``grpo_actor.py`` example (examples/monarch/, unchanged but for its imports), with
``"cpu"`` for ``"cuda"``, run as a user runs it: ``python grpo_actor.py`` in a fresh
interpreter, without ``REGENCY_SECRET``, with a fresh home directory.

It deadlocks, on Regency as on Monarch 0.7 (whose actors, like Regency's, handle one message at
a time, async endpoints included): ``Generator.generate`` awaits a condition that only
``Generator.update`` sets, and that update waits in the same mailbox behind it;
``TrajectoryQueue.get`` awaits an empty queue while the ``put`` that would fill it waits behind
it; ``Scorer.run`` loops until ``Scorer.stop``, which waits behind it. The stall watch names
all three, with their frames, and Ctrl-C ends the program as it ends a local one. With those
three endpoints ``@concurrent_endpoint`` (what Monarch did to its own Kubernetes copy of this
example) it runs to the end, on both runtimes. docs/porting.md, "Monarch's examples"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "monarch" / "grpo_actor.py"
#: Generous: four processes importing torch on two loaded cores.
TIMEOUT = 240
#: The endpoints that wait for a later message to the same actor.
WAITING = (
    ("Generator 'generator'", "generate"),
    ("TrajectoryQueue 'traj'", "get"),
    ("Scorer 'scorer'", "run"),
)


def _cpu_copy(tmp_path: Path, *, concurrent: bool = False) -> Path:
    source = EXAMPLE.read_text()
    assert source.count('"cuda"') == 8
    source = source.replace('"cuda"', '"cpu"')
    if concurrent:
        imports = "from regency.actor import Actor, endpoint, this_host"
        assert source.count(imports) == 1
        source = source.replace(
            imports, "from regency.actor import Actor, concurrent_endpoint, endpoint, this_host"
        )
        for _, name in WAITING:
            plain = f"    @endpoint\n    async def {name}(self"
            assert source.count(plain) == 1, name
            source = source.replace(plain, f"    @concurrent_endpoint\n    async def {name}(self")
    copy = tmp_path / "grpo_actor.py"
    copy.write_text(source)
    return copy


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except FileNotFoundError:
        return True


def test_the_example_is_monarchs_with_only_its_imports_changed() -> None:
    source = EXAMPLE.read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import", "from"))]
    assert not any("monarch" in line for line in imports)
    assert "from regency.actor import Actor, endpoint, this_host" in imports
    assert "from regency.rdma import RDMABuffer" in imports
    assert "concurrent_endpoint" not in source
    for _, name in WAITING:
        assert source.count(f"    @endpoint\n    async def {name}(self") == 1


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_on_cpu_it_deadlocks_as_on_monarch_and_the_stall_watch_says_where(
    tmp_path: Path,
) -> None:
    script = _cpu_copy(tmp_path)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        run = subprocess.Popen(
            [sys.executable, str(script)], cwd=tmp_path, stdout=stdout, stderr=stderr,
            env=_env(tmp_path, REGENCY_STALL_WARNING_S="2"),
            # As in a terminal, whatever this test's own SIGINT disposition is.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
    # Where each waits: the generators await their update (Condition.wait_for) or their put
    # (a call, behind get); get awaits the empty queue (Queue.get); the scorer, its own call
    # of get (asyncio.wait_for). A stall warning repeats (2, 4, 8 s, ...) with fresh frames.
    stalls = [
        (
            re.compile(
                re.escape(actor) + rf" rank \d+ \(proc [^)]*\): endpoint {name} has run for "
                r"[\d.]+ s; innermost frames:\n((?:  .*\n)+)"
            ),
            frames,
        )
        for (actor, name), frames in zip(
            WAITING, (("locks.py", "_future.py"), ("queues.py",), ("tasks.py",)), strict=True
        )
    ]

    def missing(text: str) -> list[str]:
        return [
            pattern.pattern
            for pattern, frames in stalls
            if not any(f in w for w in pattern.findall(text) for f in frames)
        ]

    try:
        deadline = time.monotonic() + TIMEOUT
        while run.poll() is None and time.monotonic() < deadline:
            if not missing(err.read_text()):
                break
            time.sleep(0.5)
        assert run.poll() is None, f"exited {run.returncode}:\n{err.read_text()[-4000:]}"
        text = err.read_text()
        assert not missing(text), f"{missing(text)}\n{text[-4000:]}"
        assert "Training complete" not in out.read_text()
        pids = {int(p) for p in re.findall(r"\(proc [^)]*, pid (\d+)\)", text)}
        assert len(pids) >= 2  # the learner's proc and a generator's (or both generators')
        run.send_signal(signal.SIGINT)  # Ctrl-C
        assert run.wait(60) != 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = err.read_text()
    assert "KeyboardInterrupt" in text
    assert "runtime thread died" not in text and "Event loop is closed" not in text, text[-4000:]
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_gone(p) for p in pids), "procs outlived their controller"


@pytest.mark.slow
def test_with_its_three_waiting_endpoints_concurrent_it_runs_to_the_end(
    tmp_path: Path,
) -> None:
    script = _cpu_copy(tmp_path, concurrent=True)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
        text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, f"exited {done.returncode}:\n{done.stderr[-4000:]}"
    for step in range(5):
        assert f"[Step {step:02d}] loss=" in done.stdout
    assert done.stdout.rstrip().endswith("🛑 Stopping scorer...\n✅ Training complete")
