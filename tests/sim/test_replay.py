"""Replay across processes: the same program and seed give the same trace hash in a fresh
interpreter, in its first run and in later ones, whatever ``PYTHONHASHSEED`` is, with actors
defined in ``__main__`` (sent by value through cloudpickle) and in importable modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from regency.core import _codec

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    '''
    import hashlib, json, sys
    from regency.actor import Actor, endpoint
    from regency.core import _codec
    import regency.sim as sim
    from tests.sim.actors import Counter

    class Echo(Actor):
        """Lives in __main__: travels by value."""
        def __init__(self, bias: int) -> None:
            self.bias = bias

        @endpoint
        async def hello(self, x: int) -> int:
            return x + self.bias

        @endpoint
        def twice(self, x: int) -> int:
            return 2 * x

    def program(hosts):
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        echo = procs.spawn("echo", Echo, 3)
        counter = procs.spawn("counter", Counter)
        a = echo.hello.call(1).get().values()
        b = echo.twice.call(4).get().values()
        c = counter.incr.call(2).get().values()
        return [*a, *b, *c]

    def pickled() -> str:
        return hashlib.sha256(b"".join(bytes(p) for p in _codec.dumps((Echo, program)))).hexdigest()

    out = {"pickle_before": pickled(), "runs": []}
    for _ in range(3):
        r = sim.simulate(program, seed=11, hosts=2)
        out["runs"].append([r.trace_hash, len(r.events), r.value])
    out["pickle_after"] = pickled()
    print(json.dumps(out))
    '''
)


def run_fresh(tmp_path: Path, hash_seed: str) -> dict[str, Any]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_same_trace_in_fresh_interpreters_first_run_and_later(tmp_path: Path) -> None:
    first = run_fresh(tmp_path, "0")
    second = run_fresh(tmp_path, "4242")
    for out in (first, second):
        # The first run in a fresh interpreter matches its later runs.
        assert len({tuple(map(str, run)) for run in out["runs"]}) == 1, out["runs"]
        assert out["runs"][0][2] == [4, 4, 4, 4, 8, 8, 8, 8, 2, 2, 2, 2]
        # Simulated procs unpickled __main__'s class in this process without changing it.
        assert out["pickle_before"] == out["pickle_after"]
    # And the same in another interpreter with another hash seed, byte for byte.
    assert first["runs"] == second["runs"]
    assert first["pickle_before"] == second["pickle_before"]


def _local_class() -> type:
    class Local:
        name = "local"

        def method(self, x: int) -> int:
            return x + 1

    return Local


def test_by_value_classes_pickle_identically_and_unpickle_as_a_copy() -> None:
    cls = _local_class()
    first = _codec.dumps(cls)[0]
    copy = _codec.loads([first])
    # A receiver in the same process (a simulated proc) gets its own class, as another
    # process would, and the sender's class is left alone.
    assert copy is not cls and copy.__name__ == cls.__name__
    assert copy().method(1) == 2
    assert _codec.dumps(cls)[0] == first
    # Another class object with the same content gets the same id: the id is content.
    assert _codec.class_id(_local_class()) == _codec.class_id(cls)
    # Two unpickles of one class give one class (the id tracks it), so instances agree.
    assert _codec.loads([_codec.dumps(cls)[0]]) is copy


def test_class_ids_differ_when_the_content_differs() -> None:
    def make(value: int) -> type:
        class Local:
            v = value

        return Local

    assert _codec.class_id(make(1)) != _codec.class_id(make(2))


def test_canonical_spells_out_shared_strings() -> None:
    import pickle

    word = "".join(["sha", "red"])  # not interned
    other = "".join(["sha", "red"])
    assert word is not other
    shared = pickle.dumps([word, word], protocol=5)
    separate = pickle.dumps([word, other], protocol=5)
    assert shared != separate
    assert _codec.canonical(shared) == _codec.canonical(separate)
    assert pickle.loads(_codec.canonical(shared)) == ["shared", "shared"]
