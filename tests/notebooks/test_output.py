"""Procs' prints in a real Jupyter kernel: whole lines, never two ranks' lines fused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .kernel import Kernel, run_async

pytestmark = pytest.mark.slow

LINES, WIDTH = 300, 300
#: One printed line, maybe behind a prefix (log forwarding adds one); nothing after it.
LINE = re.compile(rf"^(?:(?!rank\d line).)*(rank[01]) line(\d{{4}}) x{{{WIDTH}}}$")


def test_lines_of_concurrent_ranks_never_fuse(tmp_path: Path) -> None:
    async def scenario() -> str:
        async with Kernel(tmp_path) as k:
            shout = await k.run(
                "from regency.actor import Actor, endpoint, proc_mesh, current_rank\n"
                "class Shouter(Actor):\n"
                "    @endpoint\n"
                "    def shout(self, lines: int, width: int) -> None:\n"
                "        rank = current_rank().rank\n"
                "        for i in range(lines):\n"
                "            print(f'rank{rank} line{i:04d} ' + 'x' * width)\n"
                "pm = await proc_mesh(gpus=2)\n"
                "shouters = await pm.spawn('shouters', Shouter)\n"
                f"await shouters.shout.call({LINES}, {WIDTH})\n"
            )
            assert shout.error is None, shout
            settle = await k.run("None")  # a line can land in the next cell
            return shout.stdout + settle.stdout

    text = run_async(scenario())
    seen: dict[str, list[int]] = {"rank0": [], "rank1": []}
    for line in text.splitlines():
        match = LINE.match(line)
        assert match is not None, f"a fused or broken line: {line!r}"
        seen[match.group(1)].append(int(match.group(2)))
    # Every line arrived, each rank's in order.
    assert seen == {"rank0": list(range(LINES)), "rank1": list(range(LINES))}
