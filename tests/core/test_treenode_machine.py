"""The casting-tree node machine (regency.core._treenode), driven by Hypothesis: one cast (or
gathered call) from a sender down a tree of simulated procs, random size and fan-out, every
message delivered in any order, procs that crash and links that are cut at any time (what
was in flight on them lost or not, each end learning of it later), batches that cannot be
unpickled. Each simulated proc runs what the shell runs (``Casting.on_cast``'s dedup, the
``TreeNode``'s port and its decisions); every step is checked against the machine's table.

Whatever happens: no rank gets the call twice; no proc acknowledges a sender twice, and a
proc reached again acknowledges what it did the first time; a forwarder's batch answers each
rank of its range once; every reply reaches the caller at most once; no fence drops before
its proc has the message (or is lost); and no node decides anything once it finished. Once everything in flight has
arrived and every loss is known: the sender finished; every fence dropped exactly once; no
live proc still waits; every rank a live, reachable proc holds got a cast exactly once; every
rank of a call was answered or is known to be unreachable by the caller."""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from regency.core import _treenode as T
from regency.core._messages import DEAD, OK
from regency.core._tree import subtree

ROOT = "root"
ROOT_PORT = 0
NODE_PORT = 1  # one cast: one node, one port per proc
MAX_LOSSES = 3
UNREADABLE = object()  # a batch's payload that did not unpickle

Port = tuple[str, int]


@attrs.define(eq=False)
class Msg:
    kind: str  # "cast", "ack", "reply", "batch"
    src: str
    dst: str
    port: int = -1  # (ack, reply, batch) the destination port
    # cast: (lo, hi, up, offset, reply_port); ack: (offset, unreached); reply: (rank, status,
    # value); batch: (offset, entries)
    body: tuple[Any, ...] = ()


@attrs.define(eq=False)
class Node:
    """A ``TreeNode`` of one simulated proc (or the sender's)."""

    address: str
    machine: T.TreeMachine
    base: int  # where its dests start in the cast's list
    reply_port: Port | None  # the cast's port (where a batch goes)
    port_open: bool = False
    done: bool = False
    #: The unreached ranges of its acknowledgement (a proc reached again names the same).
    acked_with: tuple[tuple[int, int], ...] | None = None


@attrs.define(eq=False)
class Proc:
    address: str
    position: int
    ranks: tuple[int, ...]
    alive: bool = True
    #: Procs this one knows are lost (its sends to them raise).
    noticed: set[str] = attrs.field(factory=set)
    #: ``Casting._seen`` for the cast: its node, or once done the ranges it did not reach.
    seen: Node | tuple[tuple[int, int], ...] | None = None


class TreeCastMachine(RuleBasedStateMachine):
    # -- the world ---------------------------------------------------------------------------

    @initialize(data=st.data())
    def cast(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, 14), label="procs")
        self.fanout = data.draw(st.sampled_from([2, 1, 3, 4]), label="fanout")
        self.gather = data.draw(st.booleans(), label="gather")
        counts = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n), label="ranks")
        self.procs: dict[str, Proc] = {}
        rank = 0
        for position, count in enumerate(counts):
            address = f"p{position}"
            self.procs[address] = Proc(address, position, tuple(range(rank, rank + count)))
            rank += count
        self.ranks = rank
        self.order = [p.address for p in self.procs.values()]
        self.dests = tuple((p.address, p.ranks) for p in self.procs.values())
        self.root_noticed: set[str] = set()
        self.cut: set[frozenset[str]] = set()
        self.in_flight: list[Msg] = []
        self.notices: list[tuple[str, str]] = []
        self.losses = 0
        self.unreadable = 0
        self.sender_stopped = False
        # One run in ten, the sender's runtime may stop (a run that stops it has little else
        # to check).
        self.sender_may_stop = data.draw(st.integers(0, 9), label="sender may stop") == 0
        self.delivered: Counter[int] = Counter()
        self.answers: dict[int, list[int]] = {}
        self.unreachable: set[int] = set()  # the caller's Replies: ranks behind a lost proc
        self.unfenced: Counter[str] = Counter()
        self.acks: Counter[tuple[str, Port, int]] = Counter()
        self.ports: dict[Port, Node] = {}
        root = T.TreeMachine(self.dests, self.fanout, gather=self.gather, root=True)
        self.root = Node(ROOT, root, 0, None, port_open=True)
        self.ports[(ROOT, ROOT_PORT)] = self.root
        self.fire(self.root, T.START)

    # -- what a shell does -------------------------------------------------------------------

    def fire(self, node: Node, event: str, *args: Any) -> None:
        """Feed ``event`` to ``node``'s machine, check the step against the table, and
        perform the decisions."""
        machine = node.machine
        before = machine.state
        assert event in T.VISIBLE[before], f"{node.address} in {before} sees {event}"
        decisions = getattr(machine, event)(*args)
        leads_to = T.TRANSITIONS[before, event][1]
        assert machine.state in leads_to, f"{before} --{event}--> {machine.state}"
        if node.done:
            assert not decisions, f"{node.address} decided {decisions} after it finished"
        assert machine.waiting_on == frozenset(machine.dests[lo][0] for lo in machine.pending)
        self.perform(node, decisions)

    def perform(self, node: Node, decisions: T.Decisions) -> None:
        failed: list[tuple[str, BaseException]] = []
        here = node.address
        for decision in decisions:
            assert not node.done, f"{here} decided {decision} after it finished"
            if isinstance(decision, T.OpenPort):
                node.port_open = True
                self.ports[(here, NODE_PORT)] = node
            elif isinstance(decision, T.Forward | T.TakeOver):
                if isinstance(decision, T.TakeOver):
                    assert node is self.root and decision.address in self.root_noticed
                self.forward(node, decision.ranges, failed)
            elif isinstance(decision, T.Deliver):
                self.deliver_here(node, decision)
            elif isinstance(decision, T.Acknowledge):
                assert node.acked_with in (None, decision.unreached)
                node.acked_with = decision.unreached
                for up, offset in decision.ups:
                    self.acknowledge(here, up, offset, decision.unreached)
            elif isinstance(decision, T.SendBatch):
                # Each rank of its range, once (answered, or DEAD).
                ranks = [rank for rank, _, _ in decision.replies]
                assert sorted(ranks) == [r for _, rs in node.machine.dests for r in rs], ranks
                assert node.reply_port is not None
                self.send(
                    Msg("batch", here, node.reply_port[0], node.reply_port[1],
                        (decision.offset, list(decision.replies)))
                )
            elif isinstance(decision, T.Answer):
                assert node is self.root and self.gather
                for rank, status, _ in decision.entries:
                    self.answers.setdefault(rank, []).append(status)
                    assert len(self.answers[rank]) == 1, f"rank {rank} answered twice"
                    assert status != OK or self.delivered[rank] == 1, "answered, never called"
            elif isinstance(decision, T.Unfence):
                assert node is self.root
                for address in decision.addresses:
                    self.unfenced[address] += 1
                    assert self.unfenced[address] == 1, f"the fence of {address} dropped twice"
                    proc = self.procs[address]
                    if not self.gather and not self.sender_stopped:
                        # Rule 1: dropped once the cast is in the mailboxes.
                        assert address in self.root_noticed or all(
                            self.delivered[r] for r in proc.ranks
                        ), f"the fence of {address} dropped before it had the cast"
            elif isinstance(decision, T.Finish):
                self.close(node)
                if node is self.root:
                    self.root_finished()
                else:
                    assert node.acked_with in (None, decision.unreached)
                    self.procs[here].seen = decision.unreached
            elif isinstance(decision, T.Close):
                self.close(node)
            else:
                raise AssertionError(f"unknown decision {decision!r}")
        for address, cause in failed:
            self.fire(node, T.SEND_FAILED, address, cause)

    def close(self, node: Node) -> None:
        node.done = True
        node.port_open = False
        self.ports.pop((node.address, ROOT_PORT if node is self.root else NODE_PORT), None)

    def noticed(self, address: str) -> set[str]:
        return self.root_noticed if address == ROOT else self.procs[address].noticed

    def send(self, msg: Msg) -> bool:
        """False when the sender knows the destination is lost (the send raises); a send on
        a link cut but not known to be yet is lost on the way."""
        if msg.dst in self.noticed(msg.src):
            return False
        dead = msg.dst != ROOT and not self.procs[msg.dst].alive
        if msg.src == msg.dst or not (dead or frozenset((msg.src, msg.dst)) in self.cut):
            self.in_flight.append(msg)
        return True

    def forward(
        self, node: Node, ranges: tuple[tuple[int, int], ...], failed: list[tuple[str, BaseException]]
    ) -> None:
        mine = (node.address, ROOT_PORT if node is self.root else NODE_PORT)
        assert node.port_open
        for lo, hi in ranges:
            first = self.order[node.base + lo]
            reply_port = mine if self.gather else None
            body = (node.base + lo, node.base + hi, mine, lo, reply_port)
            if not self.send(Msg("cast", node.address, first, body=body)):
                failed.append((first, ConnectionError(f"{node.address} lost {first}")))

    def deliver_here(self, node: Node, decision: T.Deliver) -> None:
        proc = self.procs[node.address]
        assert decision.ranks == proc.ranks
        for rank in decision.ranks:
            self.delivered[rank] += 1
            assert self.delivered[rank] == 1, f"rank {rank} got the cast twice"
            if self.gather:
                port = (node.address, NODE_PORT) if decision.collect else node.reply_port
                assert port is not None
                self.send(Msg("reply", node.address, port[0], port[1], (rank, OK, rank * 10)))

    def acknowledge(
        self, here: str, up: Port, offset: int, unreached: tuple[tuple[int, int], ...]
    ) -> None:
        assert not self.gather, "a gathered call is never acknowledged"
        self.acks[(here, up, offset)] += 1
        assert self.acks[(here, up, offset)] == 1, f"{here} acknowledged {up} twice"
        self.send(Msg("ack", here, up[0], up[1], (offset, unreached)))

    def on_cast(self, proc: Proc, msg: Msg) -> None:
        """``Casting.on_cast``: a cast reached twice is acknowledged, not delivered again."""
        lo, hi, up, offset, reply_port = msg.body
        if isinstance(proc.seen, tuple):
            self.acknowledge(proc.address, up, offset, proc.seen)
        elif isinstance(proc.seen, Node):
            self.fire(proc.seen, T.DUPLICATE, up, offset)
        else:
            assert lo == proc.position
            machine = T.TreeMachine(self.dests[lo:hi], self.fanout, gather=self.gather, root=False)
            node = proc.seen = Node(proc.address, machine, lo, reply_port)
            self.fire(node, T.START, up, offset)

    def arrive(self, msg: Msg) -> None:
        if msg.dst != ROOT and not self.procs[msg.dst].alive:
            return
        if msg.kind == "cast":
            self.on_cast(self.procs[msg.dst], msg)
            return
        node = self.ports.get((msg.dst, msg.port))
        if node is None:
            return  # a late reply to a port that finished: dropped, as the runtime does
        if msg.kind == "ack":
            self.fire(node, T.TREE_ACK, *msg.body)
        elif msg.kind == "reply":
            self.fire(node, T.REPLY, *msg.body)
        elif msg.body[1] is UNREADABLE:
            self.fire(node, T.UNREADABLE, msg.body[0], ValueError("truncated pickle"))
        else:
            self.fire(node, T.BATCH, *msg.body)

    def notice(self, here: str, lost: str) -> None:
        """``Runtime._lose``: ``here`` learns that ``lost`` is gone."""
        if here != ROOT and not self.procs[here].alive:
            return
        self.noticed(here).add(lost)
        node = self.root if here == ROOT else self.procs[here].seen
        if here == ROOT and self.gather:
            # The caller's Replies waits on every proc of the call: it names the ranks
            # behind the lost one (its _Behind), and the call fails.
            lo, hi = subtree(len(self.dests), self.fanout, self.procs[lost].position)
            self.unreachable.update(r for _, ranks in self.dests[lo:hi] for r in ranks)
        if isinstance(node, Node) and node.port_open and lost in node.machine.waiting_on:
            self.fire(node, T.LOST, lost, ConnectionError(f"{here} lost {lost}"))

    def lose_link(self, a: str, b: str, keep: bool) -> None:
        """What was on the link arrives anyway (``keep``: it had reached the other end) or
        not; each end learns of the loss later."""
        self.cut.add(frozenset((a, b)))
        self.in_flight = [m for m in self.in_flight if keep or {m.src, m.dst} != {a, b}]
        self.notices += [(a, b), (b, a)]

    def crash(self, address: str, keep: bool) -> None:
        """What it sent may still arrive (``keep``); what was on its way to it is lost."""
        self.losses += 1
        self.procs[address].alive = False
        self.in_flight = [
            m for m in self.in_flight if m.dst != address and (keep or m.src != address)
        ]
        for other in [ROOT, *self.alive()]:
            self.cut.add(frozenset((address, other)))
            self.notices.append((other, address))

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), count=st.integers(1, 8))
    def messages_arrive(self, data: st.DataObject, count: int) -> None:
        """A few messages arrive, any of those in flight each time."""
        for _ in range(count):
            if not self.in_flight:
                return
            index = data.draw(st.integers(0, len(self.in_flight) - 1), label="message")
            self.arrive(self.in_flight.pop(index))

    @precondition(lambda self: bool(self.notices))
    @rule(data=st.data())
    def a_loss_is_noticed(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.notices) - 1), label="notice")
        self.notice(*self.notices.pop(index))

    def alive(self) -> list[str]:
        return [p.address for p in self.procs.values() if p.alive]

    def targets(self, which: str) -> list[str]:
        """Live procs: any (``any``), or those whose node still waits on others (forwarders
        in the middle of it: ``busy``), or those of them the sender waits on (``top``: a
        loss the sender takes over for); any when there are none."""
        busy = [
            p.address
            for p in self.procs.values()
            if p.alive and isinstance(p.seen, Node) and not p.seen.done
        ]
        if which == "top":
            busy = [a for a in busy if a in self.root.machine.waiting_on]
        return (which != "any" and busy) or self.alive()

    @precondition(lambda self: self.losses < MAX_LOSSES and bool(self.alive()))
    @rule(
        data=st.data(),
        how=st.sampled_from(["crash", "stop", "cut"]),
        which=st.sampled_from(["any", "busy", "top"]),
        keep=st.booleans(),
        noticed=st.booleans(),
    )
    def a_loss(
        self, data: st.DataObject, how: str, which: str, keep: bool, noticed: bool
    ) -> None:
        """A proc crashes, or its runtime stops (its node gives up first: ``stop``), or a
        link between two live procs (or a proc and the sender) is cut: both live on.
        ``which`` proc (see :meth:`targets`; a link cut from a busy one is one to a child it
        waits on); ``keep``: what was in flight still arrives; ``noticed``: every end
        learns of it at once (before the subtree settles)."""
        candidates = self.targets(which)
        if how == "cut":
            a = data.draw(st.sampled_from([*candidates, ROOT]), label="cut a")
            others = [
                x for x in [ROOT, *self.alive()] if x != a and frozenset((a, x)) not in self.cut
            ]
            node = self.root if a == ROOT else self.procs[a].seen
            if which != "any" and isinstance(node, Node):  # a forwarder and a child it waits on
                others = [x for x in others if x in node.machine.waiting_on] or others
            if not others:
                return
            self.losses += 1
            self.lose_link(a, data.draw(st.sampled_from(others), label="cut b"), keep)
        else:
            address = data.draw(st.sampled_from(candidates), label=how)
            node = self.procs[address].seen
            if how == "stop" and isinstance(node, Node) and not node.done:
                self.fire(node, T.STOP)
            self.crash(address, keep)
        while noticed and self.notices:
            self.notice(*self.notices.pop(0))

    @precondition(lambda self: any(m.kind == "batch" for m in self.in_flight))
    @rule(data=st.data())
    def a_batch_cannot_be_read(self, data: st.DataObject) -> None:
        batches = [m for m in self.in_flight if m.kind == "batch"]
        msg = data.draw(st.sampled_from(batches), label="unreadable")
        msg.body = (msg.body[0], UNREADABLE)
        self.unreadable += 1

    def everything_arrives(self) -> None:
        """Everything in flight arrives, every loss is noticed (in order, taking turns):
        then it is over."""
        for step in range(100_000):
            if self.notices and (step % 2 or not self.in_flight):
                self.notice(*self.notices.pop(0))
            elif self.in_flight:
                self.arrive(self.in_flight.pop(0))
            else:
                break
        else:
            raise AssertionError("the cast never settles")
        self.check_settled()

    @precondition(lambda self: self.sender_may_stop and not self.root.done)
    @rule()
    def the_sender_stops(self) -> None:
        """The sender's runtime stops (or its port handler failed): every fence it holds
        drops (nothing would drop them later), and nothing more is expected of the cast."""
        self.sender_stopped = True
        self.fire(self.root, T.STOP)
        assert all(self.unfenced[a] == 1 for a in self.order), "a fence outlives its cast"

    @precondition(lambda self: not self.in_flight and not self.notices)
    @rule()
    def nothing_is_left_in_flight(self) -> None:
        self.check_settled()

    def teardown(self) -> None:
        if hasattr(self, "root"):
            self.everything_arrives()

    # -- invariants --------------------------------------------------------------------------

    def accounted(self, rank: int, address: str) -> bool:
        if self.gather:
            return rank in self.answers or rank in self.unreachable
        return self.delivered[rank] == 1 or address in self.root_noticed

    def root_finished(self) -> None:
        """The sender finishes exactly when every rank is accounted for."""
        for proc in self.procs.values():
            for rank in proc.ranks:
                assert self.accounted(rank, proc.address), (
                    f"the sender finished with rank {rank} ({proc.address}) unaccounted for"
                )
        assert set(self.unfenced) == set(self.order), "the sender finished with fences up"

    def check_settled(self) -> None:
        assert all(self.unfenced[a] == 1 for a in self.order), "a fence outlives its cast"
        if self.sender_stopped:
            return
        assert self.root.machine.state is T.FINISHED, "the sender never finished"
        for proc in self.procs.values():
            if proc.alive:
                assert not isinstance(proc.seen, Node), (
                    f"{proc.address} still waits on {proc.seen.machine.waiting_on} "
                    f"({proc.seen.machine.state})"
                )
            reachable = proc.alive and frozenset((ROOT, proc.address)) not in self.cut
            for rank in proc.ranks:
                if not self.gather and reachable:
                    assert self.delivered[rank] == 1, f"rank {rank} never got the cast"
                assert self.accounted(rank, proc.address)
                if not self.losses:
                    assert self.delivered[rank] == 1
                    if self.gather and not self.unreadable:
                        assert self.answers[rank] == [OK]

    @invariant()
    def at_most_once(self) -> None:
        assert all(count == 1 for count in self.delivered.values())
        assert all(len(statuses) == 1 for statuses in self.answers.values())
        assert all(s in (OK, DEAD) for statuses in self.answers.values() for s in statuses)


# No deadline: pure code, but on a loaded 2-core machine one example's steps can take longer
# than Hypothesis's default 200 ms.
TreeCastMachine.TestCase.settings = settings(
    max_examples=500, stateful_step_count=30, deadline=None
)
test_tree_casts = TreeCastMachine.TestCase


# -- single cases ------------------------------------------------------------------------------


def test_the_table_is_total_over_what_each_state_sees() -> None:
    T.check_table()
    assert set(T.VISIBLE) == set(T.STATES)
    broken = dict(T.TRANSITIONS)
    del broken[T.ACKING, T.LOST]
    original = T.TRANSITIONS
    try:
        T.TRANSITIONS = broken
        with pytest.raises(AssertionError, match=r"\(acking, lost\): visible, no transition"):
            T.check_table()
    finally:
        T.TRANSITIONS = original


def test_an_event_a_state_cannot_see_raises() -> None:
    machine = T.TreeMachine((("a", (0,)), ("b", (1,))), 2, gather=False, root=True)
    with pytest.raises(T.UnexpectedEvent, match="'new' got 'tree_ack'"):
        machine.tree_ack(0, None)
    machine.start()
    with pytest.raises(T.UnexpectedEvent, match="'root_acking' got 'reply'"):
        machine.reply(0, OK, None)


@pytest.mark.parametrize("gather", [False, True])
def test_a_leaf_decides_what_casting_leaf_does(gather: bool) -> None:
    """``Casting._leaf`` delivers a cast that ends at its proc without a node: the machine
    with one proc decides the same (deliver; acknowledge with nothing unreached unless it is
    a gathered call; done, nothing unreached)."""
    machine = T.TreeMachine((("a", (3, 4)),), 16, gather=gather, root=False)
    decisions = list(machine.start(("up", 7), 5))
    expected: list[Any] = [T.Deliver((3, 4), False)]
    if not gather:
        expected.append(T.Acknowledge(((("up", 7), 5),), ()))
    assert decisions == [*expected, T.Finish(())]
    assert machine.state is T.FINISHED and not machine.waiting_on


def test_a_stopped_sender_drops_every_fence_it_holds() -> None:
    dests = tuple((f"p{i}", (i,)) for i in range(5))
    machine = T.TreeMachine(dests, 2, gather=False, root=True)
    (forward,) = machine.start()
    assert forward == T.Forward(((0, 3), (3, 5)))
    assert list(machine.tree_ack(3, None)) == [T.Unfence(("p3", "p4"))]
    assert list(machine.stop()) == [T.Unfence(("p0", "p1", "p2")), T.CLOSE]
    assert machine.state is T.STOPPED and not machine.waiting_on
    assert list(machine.start()) == []  # a start scheduled before the stop sends nothing


def test_the_sender_takes_over_a_lost_forwarder() -> None:
    dests = tuple((f"p{i}", (i,)) for i in range(7))
    machine = T.TreeMachine(dests, 2, gather=False, root=True)
    machine.start()  # ranges (0, 4), (4, 7)
    assert machine.waiting_on == {"p0", "p4"}
    cause = ConnectionError("gone")
    assert list(machine.lost("p0", cause)) == [
        T.Unfence(("p0",)),
        T.TakeOver("p0", cause, ((1, 3), (3, 4))),
    ]
    assert machine.waiting_on == {"p1", "p3", "p4"}
    # p1 could not reach p2 (its position 1): the sender sends it itself.
    assert list(machine.tree_ack(1, [(1, 2)])) == [T.Unfence(("p1",)), T.Forward(((2, 3),))]
    for index in (2, 3, 4):
        machine.tree_ack(index, None)
    assert machine.state is T.FINISHED


def test_a_proc_reached_again_acknowledges_each_sender_once_done() -> None:
    """(``Casting`` answers a duplicate of a finished node from its ``_seen``; the machine
    decides the same.)"""
    dests = tuple((f"p{i}", (i,)) for i in range(3))
    machine = T.TreeMachine(dests, 2, gather=False, root=False)
    assert list(machine.start(("f", 1), 4)) == [
        T.OPEN_PORT, T.Forward(((1, 2), (2, 3))), T.Deliver((0,), False),
    ]
    assert list(machine.duplicate(("root", 1), 4)) == []  # not done: acknowledged later
    assert list(machine.lost("p1", ConnectionError("cut"))) == []  # handed up
    assert list(machine.tree_ack(2, None)) == [
        T.Acknowledge(((("f", 1), 4), (("root", 1), 4)), ((1, 2),)),
        T.Finish(((1, 2),)),
    ]
    assert list(machine.duplicate(("other", 2), 4)) == [
        T.Acknowledge(((("other", 2), 4),), ((1, 2),))
    ]
