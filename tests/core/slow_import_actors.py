"""An actor whose module takes a while to import in a proc (as one that brings torch does):
its SPAWN is decoded on a thread for that long."""

from __future__ import annotations

import time

from regency.actor import Actor, endpoint

time.sleep(1.0)


class SlowToImport(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"
