"""Monarch's own examples (examples/monarch/, imports changed to ``regency``), run as a user
runs them: ``python example.py``, in a fresh interpreter, without ``REGENCY_SECRET`` and with
a fresh home directory (so no per-user secret file either).

``grpo_yield.py`` has tests of its own. Monarch's other examples need CUDA, the network or a
person at a debugger prompt: docs/porting.md ("Monarch's examples") lists them with why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "monarch"
#: Generous: these start 2 to 22 processes, which on two loaded cores takes a while.
TIMEOUT = 240


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _run(script: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REGENCY_SECRET"}
    env["HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=home, env=env, capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, f"{script.name} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done


@pytest.mark.slow
def test_ping_pong(tmp_path: Path) -> None:
    out = _run(EXAMPLES / "ping_pong.py", tmp_path).stdout
    assert "Example completed successfully!" in out
    assert out.count("Pong!, Receiver") == 4
    for rank in range(4):
        assert f"Identity: {rank}, msg='hey there, from script!!'" in out


@pytest.mark.slow
def test_getting_started(tmp_path: Path) -> None:
    done = _run(EXAMPLES / "getting_started.py", tmp_path)
    out = done.stdout
    assert "Counter value: 0" in out
    # Monarch's ValueMesh print: every (point, value), which the tutorial's text relies on.
    assert "ValueMesh({gpus: 8}):\n  (({'gpus': 0/8}, 2),\n   ({'gpus': 1/8}, 2)," in out
    assert "({'gpus': 7/8}, 1))" in out
    assert "Extent({'hosts': 2})" in out  # hosts_from_config, after local procs started
    assert "Trainer {'hosts': 1/2, 'gpus': 3/4} taking a step." in out
    assert "Step with data <fake data 1> and input = None" in out
    assert "It didn't say hello" in out
    assert "one tensor(" in out and "two tensor(" in out and "dist tensor(" in out
    # dtrainers.step.call(dist_compute[0]): each trainer got its own proc's row 0 of
    # dist_compute (a regency.Tensor), as a plain tensor; rank (0, 0)'s is the one printed.
    inputs = re.findall(r"Step with data <fake data 2> and input = tensor\(\[([^\]]*)\]\)", out)
    assert len(inputs) == 8
    dist = re.search(r"^dist tensor\(\[\[([^\]]*)\]", out, re.MULTILINE)
    assert dist is not None and _floats(inputs[0]) == _floats(dist.group(1))
    assert len(set(inputs)) == 8  # t = torch.rand(3, 4) differs on every proc
    # o = torch.relu(linear.forward.rref(t)): a (3, 4) input times a (3, 3) weight raises in
    # every LinearActor (as in Monarch, where it runs the same way): o's values fail, the
    # actors go on, and nothing reaches the unhandled-fault hook.
    assert "Mesh failure was not handled" not in out
    assert "Actor rank: {'hosts': 1/2, 'gpus': 3/4}, message rank:" in out
    # send() of a @remote function: one reply per proc of the active mesh, 4 read.
    assert out.count("\npmem(rss=") == 4
    assert out.count("inferred with: 1") == 2
    # asyncio.run(procs.logging_option(...)) ran; Regency says why nothing streams.
    assert "logging_option(stream_to_client=True) streams nothing" in done.stderr


@pytest.mark.slow
def test_grpo_actor_te_on_cpu(tmp_path: Path) -> None:
    """Monarch's GRPO trainer with the tensor engine inside an actor: its ``__init__``
    activates the actor's proc mesh in an all-async actor, its steps fetch with
    ``regency.fetch.fetch_shard``. It asks for CUDA; the test runs a copy with ``"cuda"``
    replaced by ``"cpu"`` (a GPU machine runs the file as it is)."""
    source = (EXAMPLES / "grpo_actor_te.py").read_text()
    assert source.count('"cuda"') == 2
    copy = tmp_path / "grpo_actor_te.py"
    copy.write_text(source.replace('"cuda"', '"cpu"'))
    out = _run(copy, tmp_path).stdout
    assert out.count("] loss=") == 5 and "[Step 04] loss=" in out
    assert "Training complete!" in out
