"""SPAWNs apply in the order they arrive, however long each takes to decode: a proc decodes
a SPAWN's class off its loop (its modules may take seconds to import), and one that decodes
faster must not overtake it. An actor that fails poisons its proc for the actors spawned
after it, so an overtaking SPAWN would refuse an actor spawned before the failure."""

from __future__ import annotations

import pytest

from regency.core import SupervisionError

from ..conftest import SpawnProcs
from .actors import Bad

T = 30


def test_a_spawn_that_decodes_fast_does_not_overtake_one_still_decoding(
    spawn_procs: SpawnProcs,
) -> None:
    from .slow_import_actors import SlowToImport  # the proc imports it on its own: 1 s

    pm = spawn_procs(per_host={"gpus": 1})
    slow = pm.spawn("slow_first", SlowToImport)  # decoded on a thread for about 1 s
    bad = pm.spawn("bad_second", Bad)  # decoded at once; its __init__ fails: proc poisoned
    with pytest.raises(SupervisionError):
        bad.initialized.get(T)
    # Spawned before the failure, so it lives: the proc refuses only later actors.
    assert slow.ping.call_one().get(T) == "pong"
    pm.stop().get(T)
