"""examples/ddp_notebook.ipynb, executed top to bottom in a real kernel: the seeds' DDP
walk-through in the notebook's ``await`` style (``await proc_mesh``, ``await spawn``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from .kernel import REPO, CellRun, kernel_env, nbclient, nbformat, run_async

pytest.importorskip("torch", reason="the DDP notebook needs torch")

pytestmark = pytest.mark.slow


def test_ddp_notebook_runs_top_to_bottom(tmp_path: Path) -> None:
    nb = nbformat.read(REPO / "examples" / "ddp_notebook.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    run_async(client.async_execute(env=kernel_env()))  # raises if any cell fails
    code = [CellRun(c.outputs) for c in nb.cells if c.cell_type == "code"]
    imports, spawn, demo, info, train, cleanup = code

    assert imports.stdout == "" and spawn.stdout == ""
    # Procs print to the kernel's captured stdout, which reaches the cells on its own
    # thread: on a loaded machine a line can land in the next cell.
    assert sorted(line for line in (demo.stdout + info.stdout).splitlines() if "DDP" in line) == [
        "self.rank=0 Finished running basic DDP example",
        "self.rank=0 Running basic DDP example",
        "self.rank=1 Finished running basic DDP example",
        "self.rank=1 Running basic DDP example",
    ]
    assert "Found 2 ranks in the mesh" in info.stdout
    assert re.findall(r"Rank (\d): PID=\d+, Device=cpu, Backend=gloo", info.stdout) == ["0", "1"]

    # Each rank trained on its own batch (losses differ); DDP averaged the gradients (the
    # norms agree): the ranks really talked over gloo.
    losses = [ast.literal_eval(m) for m in re.findall(r"Losses across ranks: (.*)", train.stdout)]
    norms = [ast.literal_eval(m) for m in re.findall(r"Gradient norms: (.*)", train.stdout)]
    assert len(losses) == len(norms) == 3
    for step_losses, step_norms in zip(losses, norms, strict=True):
        assert len(step_losses) == 2 and step_losses[0] != step_losses[1]
        assert len(step_norms) == 2 and step_norms[0] == step_norms[1]
    for rank in (0, 1):
        steps = re.findall(rf"\[Rank {rank}\] Step \d: Loss=", train.stdout + cleanup.stdout)
        assert len(steps) == 3, train.stdout
    assert "[Rank 0] Cleaned up" in cleanup.stdout and "[Rank 1] Cleaned up" in cleanup.stdout
