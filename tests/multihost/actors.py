"""Actors for the multi-host tests."""

from __future__ import annotations

import os

from regency.actor import Actor, ActorMesh, context, current_rank, endpoint


class Where(Actor):
    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def where(self) -> str:
        address: str = context().actor_instance._proc_address
        return address

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def bump(self) -> int:
        self.count += 1
        return self.count

    @endpoint
    def total(self) -> int:
        return self.count


class Relay(Actor):
    """Calls its peer on the other host directly."""

    def __init__(self, peers: ActorMesh[Where]) -> None:
        self.peers = peers

    @endpoint
    def ask_other_host(self) -> str:
        me = current_rank()
        other = self.peers.slice(hosts=1 - me["hosts"], gpus=me["gpus"])
        answer: str = other.where.call_one().get(timeout=20)
        return answer
