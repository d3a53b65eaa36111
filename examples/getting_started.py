"""The main job on one machine: a controller drives actors in four OS processes.

Run with ``make demo``. The same program runs on Monarch after changing ``regency`` to
``monarch`` in the imports.
"""

from __future__ import annotations

import os

from regency.actor import (
    Accumulator,
    Actor,
    ActorError,
    ActorMesh,
    Channel,
    Port,
    context,
    current_rank,
    endpoint,
    this_host,
    this_proc,
)


class Counter(Actor):
    def __init__(self, v: int) -> None:
        self.v = v

    @endpoint
    def incr(self) -> None:
        self.v += 1

    @endpoint
    async def value(self) -> int:
        return self.v


class Player(Actor):
    """Ping-pong between two meshes: each player talks to its peer at its own coordinates."""

    def __init__(self, peers: ActorMesh[Counter]) -> None:
        self.peer = peers.slice(**dict(current_rank()))

    @endpoint
    def play(self, rounds: int) -> str:
        for _ in range(rounds):
            self.peer.incr.call_one().get()
        return f"player {current_rank()['gpus']} (pid {os.getpid()}) hit {rounds} times"

    @endpoint
    def report(self, port: Port[str]) -> None:
        port.send(f"{context().actor_instance.name}[{current_rank().rank}] reporting")

    @endpoint
    def fail(self) -> None:
        raise ValueError("this endpoint always fails")


def main() -> None:
    local = this_proc().spawn("local", Counter, 100)
    print("actor in the controller's process:", local.value.call_one().get())

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 0)
    counters.slice(gpus=slice(0, 2)).incr.broadcast()
    for point, v in counters.value.call().get().items():
        print(f"  gpus={point['gpus']} value={v}")

    players = procs.spawn("players", Player, counters)
    for fut in players.play.stream(3):
        print(" ", fut.get())
    total = Accumulator(counters.value, 0, lambda a, b: a + b).accumulate().get()
    print("sum over the mesh after ping-pong:", total)

    port, receiver = Channel[str].open()
    players.report.broadcast(port)
    print("fan-in:", sorted(receiver.recv().get() for _ in range(4)))

    try:
        players.slice(gpus=0).fail.call_one().get()
    except ActorError as e:
        print("caught remote error:", type(e.exception).__name__, e.exception)
    print("the actor survived:", players.slice(gpus=0).play.call_one(1).get())

    procs.stop().get()
    print("done")


if __name__ == "__main__":
    main()
