"""Casting trees, the runtime side: sending a cast down a tree of procs, forwarding it,
gathering replies back up, and keeping one sender's messages to one actor in order.

The shape of a tree is :mod:`regency.core._tree`'s business (pure). Here:

* :class:`Casting` (one per runtime) decides, per cast, between the direct path (one frame
  per rank) and a tree; holds the sender's *fences* (below); and runs the forwarders'
  :class:`TreeNode` for each :class:`~regency.core._messages.Cast` that arrives.
* :class:`TreeNode` is one forwarding proc's part in one cast (and the sender's), a
  reply-port handler that runs a :class:`~regency.core._treenode.TreeMachine` (the logic,
  pure, with its transitions as a table) and performs its decisions: the node counts the
  TREE_ACKs of the subtrees it forwarded to and acknowledges its own subtree to its sender
  once its ranks have the message in their mailboxes and every child acknowledged; in
  *gather* mode (a ``call()``) it collects its subtree's replies into one BATCH for its
  sender instead, which acknowledges the subtree too. A proc with no one to forward to
  delivers and acknowledges without a node (what a one-proc machine decides).
  A child lost before it acknowledged is handed up: a forwarder names its range in its own
  TREE_ACK, and the sender of the cast sends that range the cast itself, or, if it cannot
  reach that proc either, its children (a proc reached twice delivers once: casts are
  numbered). In gather mode, whose replies died with the lost child, the ranks behind it
  are answered ``DEAD`` naming it.

Ordering (docs/concepts.md): messages from one sender to one actor are handled in the order
sent. A tree cast takes longer paths than a direct message, so the sender keeps, per
destination (proc address, actor), a *fence* while a tree cast's subtree is not acknowledged
(answered, for a gathered call). Until then:

* a direct message for that actor (``call_one``, ``stop``, a small cast) to that proc waits
  in the sender, in order, and goes once the fence drops;
* a tree cast for that actor over a different list of procs whose reach includes the proc
  waits too (its tree differs, so its path there may be shorter); a cast over the same list
  goes at once: it takes the same path as the casts in flight, link by link in order;
* a proc that had a direct actor message from this sender not yet acknowledged by its
  receiver gets the next tree cast directly (the same connection, so in order), not through
  the tree.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _codec
from . import _messages as M
from ._config import current_config
from ._errors import RemoteFailure, UndeliverableError
from ._ports import PortBase
from ._tree import root_ranges, subtree
from ._treenode import (
    FINISHED,
    Acknowledge,
    Answer,
    Decisions,
    Deliver,
    Finish,
    Forward,
    OpenPort,
    SendBatch,
    TakeOver,
    TreeMachine,
    UnexpectedEvent,
    Unfence,
)

if TYPE_CHECKING:
    from ._replies import _Route
    from ._runtime import Runtime

log = logging.getLogger("regency.runtime")

Dests = tuple[tuple[str, tuple[int, ...]], ...]  # (address, local ranks), in tree order
#: (actor, tree id, fanout): the actor a tree cast is for and the paths it takes (the tree
#: id stands for the list of addresses: hashing a 4,096-tuple per fence would be quadratic).
TreeKey = tuple[str, int, int]
#: (address, actor): what a fence holds messages for (order is per sender and actor).
Target = tuple[str, str]

#: A send waiting for fences: (what it reaches, a try that says whether it went).
_Held = tuple[tuple[Target, ...], Callable[[], bool]]

#: How many cast ids a proc remembers, to deliver a cast that reaches it twice only once.
_SEEN = 4096


class Casting:
    """One runtime's casting: the sender's fences and the forwarders' tree nodes."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._lock = threading.RLock()
        self._ids = itertools.count()
        #: (address, actor) -> {tree key: tree casts to that actor there in flight}.
        self._fenced: dict[Target, dict[TreeKey, int]] = {}
        #: Sends waiting for fences to drop, in send order.
        self._held: deque[_Held] = deque()
        self._held_reach: Counter[Target] = Counter()
        #: Cast ids seen here: the node still running, or, once it is done, the ranges it
        #: could not reach (empty: none).
        self._seen: OrderedDict[tuple[str, int], TreeNode | tuple[tuple[int, int], ...]] = (
            OrderedDict()
        )
        self._groups: dict[int, tuple[Any, Dests]] = {}
        #: The id of each list of addresses a tree cast went over (ids are never reused; a
        #: forgotten list gets a new id, which only makes a cast wait where it need not).
        self._trees: dict[tuple[str, ...], int] = {}
        self._tree_ids = itertools.count()
        #: Tree casts this runtime started, and forwarding nodes it ran (tests, benchmarks).
        self.tree_casts = 0
        self.forwarded = 0

    # -- sending (any thread) ----------------------------------------------------------

    def post_actor(self, address: str, actor: str, frame: Any) -> None:
        """Send a message for ``actor`` (CALL, STOP_ACTOR) straight to ``address``, in order
        with this runtime's tree casts (it waits while a tree cast to that actor there is
        not acknowledged). Raises what the outbox raises when sent at once."""
        if self._fenced or self._held:
            with self._lock:
                target = (address, actor)
                if target in self._fenced or target in self._held_reach:
                    self._hold((target,), lambda: self._direct_if_clear(target, frame))
                    return
                self._direct_now(address, frame)
                return
        self._direct_now(address, frame)

    def _direct_if_clear(self, target: Target, frame: Any) -> bool:
        if target in self._fenced:
            return False
        self._direct_now(target[0], frame)
        return True

    def _direct_now(self, address: str, frame: Any) -> None:
        rt = self._rt
        (rt.outboxes.get(address) or rt.outbox(address)).send(frame, True)  # (made on first use)

    def send(
        self,
        route: _Route,
        local_ranks: Sequence[int],
        actor: str,
        method: str,
        port: M.PortRef | None,
        payload: Sequence[Any],
        *,
        gather: bool = False,
        replies: Any = None,
    ) -> None:
        """Send ``method`` to ``local_ranks`` of ``route``: directly, or down a tree when the
        ranks live on at least ``cast_tree_min`` procs. ``gather``: replies come back up the
        tree in batches (``port`` is the caller's); ``replies`` (the caller's ``Replies``)
        learns which ranks are behind each forwarder, to name them if one is lost."""
        config = current_config()  # read per cast: configure() takes effect at once
        if len(local_ranks) < config.cast_tree_min:
            self._send_direct(route, local_ranks, actor, method, port, payload)
            return
        dests = self._group(route, local_ranks)
        if len(dests) < config.cast_tree_min:
            self._send_direct(route, local_ranks, actor, method, port, payload)
            return
        fanout = config.cast_fanout
        args = (dests, actor, method, port, route, payload, gather, replies, fanout)
        with self._lock:
            reach = tuple((a, actor) for a, _ in dests)
            held = self._held_reach
            if (held and any(held[t] for t in reach)) or not self._cast_now(*args):
                self._hold(reach, lambda: self._cast_now(*args))

    def send_one(
        self,
        route: _Route,
        local: int,
        actor: str,
        method: str,
        port: M.PortRef | None,
        payload: Sequence[Any],
    ) -> None:
        """:meth:`send` to one rank (``call_one``, ``choose``), without its layers."""
        if current_config().cast_tree_min <= 1:  # every cast goes down a tree
            self.send(route, (local,), actor, method, port, payload)
            return
        frame = _codec.encode_call(
            actor, method, port, local, route.labels, route.sizes, payload
        )
        address = route.addresses[local]
        if self._fenced or self._held:  # a tree cast of ours in flight: it may have to wait
            self.post_actor(address, actor, frame)
            return
        # What post_actor and _direct_now do without a fence, written out (two calls less
        # per call_one).
        rt = self._rt
        (rt.outboxes.get(address) or rt.outbox(address)).send(frame, True)

    def _send_direct(
        self,
        route: _Route,
        local_ranks: Sequence[int],
        actor: str,
        method: str,
        port: M.PortRef | None,
        payload: Sequence[Any],
    ) -> None:
        addresses, labels, sizes = route.addresses, route.labels, route.sizes
        if len(local_ranks) == 1:
            local = local_ranks[0]
            frame = _codec.encode_call(actor, method, port, local, labels, sizes, payload)
            self.post_actor(addresses[local], actor, frame)
            return
        # Every frame is encoded before the first is sent: the sends then follow each other
        # closely, and the first ranks' replies less often arrive before the caller waits
        # for them (where the loop, not the waiting thread, would read them).
        frames = _codec.encode_calls(actor, method, port, local_ranks, labels, sizes, payload)
        if self._fenced or self._held:  # a tree cast of ours in flight: check each target
            for local, frame in zip(local_ranks, frames, strict=True):
                self.post_actor(addresses[local], actor, frame)
            return
        # No fence (a cast this thread sent earlier would have left one): what post_actor
        # would do for each rank, that is _direct_now, written out here (a call less per
        # rank).
        rt = self._rt
        outboxes = rt.outboxes
        for local, frame in zip(local_ranks, frames, strict=True):
            address = addresses[local]
            (outboxes.get(address) or rt.outbox(address)).send(frame, True)

    def _group(self, route: _Route, local_ranks: Sequence[int]) -> Dests:
        """The destination procs of a cast, each with its local ranks, in rank order (cached
        per route for a whole-mesh cast)."""
        whole = isinstance(local_ranks, range) and len(local_ranks) == len(route.addresses)
        if whole:
            cached = self._groups.get(id(route))
            if cached is not None and cached[0] is route:
                return cached[1]
        by_address: dict[str, list[int]] = {}
        addresses = route.addresses
        for local in local_ranks:
            by_address.setdefault(addresses[local], []).append(local)
        dests = tuple((a, tuple(r)) for a, r in by_address.items())
        if whole:
            if len(self._groups) > 64:
                self._groups.clear()
            self._groups[id(route)] = (route, dests)
        return dests

    def _split(self, dests: Dests) -> tuple[Dests, Dests]:
        """(procs to send to directly, procs to reach through the tree): a proc that has a
        direct actor message from here not yet acknowledged gets the cast directly too.

        The mark is the outbox's (``Outbox.direct_mark``, stored by direct sends under the
        outbox's lock, not this one): nothing here deletes it (a delete after a newer
        store would lose that mark, and the next cast to the proc could overtake its
        message down the tree), it goes with its outbox, and an outbox that replaces one at
        the same address starts at 0."""
        direct: list[tuple[str, tuple[int, ...]]] = []
        tree: list[tuple[str, tuple[int, ...]]] = []
        outboxes = self._rt.outboxes
        for entry in dests:
            box = outboxes.get(entry[0])
            if box is not None and box.direct_unacked():
                direct.append(entry)
            else:
                tree.append(entry)
        return tuple(direct), tuple(tree)

    def _cast_now(
        self,
        dests: Dests,
        actor: str,
        method: str,
        port: M.PortRef | None,
        route: _Route,
        payload: Sequence[Any],
        gather: bool,
        replies: Any,
        fanout: int,
    ) -> bool:
        """Send a cast if the fences allow it now; False (nothing sent) if not. The lock is
        held. The split between direct and tree is decided here, at the moment of sending:
        the tree a cast takes is what the fences are checked against."""
        rt = self._rt
        direct, tree = self._split(dests)
        key: TreeKey = (actor, self._tree_id(tuple(a for a, _ in tree)), fanout)
        fenced = self._fenced
        if fenced:
            for address, _ in direct:  # a direct send would overtake any cast in flight
                if (address, actor) in fenced:
                    return False
            for address, _ in tree:  # a cast on another tree could overtake one in flight
                keys = fenced.get((address, actor))
                if keys and any(k != key for k in keys):
                    return False
        labels, sizes = route.labels, route.sizes
        for address, ranks in direct:
            for local in ranks:
                self._direct_now(
                    address, _codec.encode_call(actor, method, port, local, labels, sizes, payload)
                )
        if not tree:
            return True
        if replies is not None and gather:
            replies.behind = _Behind(tree, fanout)
        self.tree_casts += 1
        node = TreeNode(
            self,
            cast_id=(rt.address, next(self._ids)),
            actor=actor,
            method=method,
            port=port,
            gather=gather,
            labels=labels,
            sizes=sizes,
            dests=tree,
            fanout=fanout,
            parts=payload,
            key=key,
            inner=replies if gather else None,
        )
        for lo, hi in root_ranges(len(tree), fanout):
            for address, _ in tree[lo:hi]:
                keys = self._fenced.setdefault((address, actor), {})
                keys[key] = keys.get(key, 0) + 1
        # The node runs on the loop like every port handler; the fences above already hold
        # back what this thread sends next to those procs.
        node.port_id = rt.open_port(node)[1]
        trace = rt.trace
        if trace is not None:
            trace.cast(node.cast_id, port)
        rt.call_soon(node.start_root)
        return True

    def _tree_id(self, addresses: tuple[str, ...]) -> int:
        tree_id = self._trees.get(addresses)
        if tree_id is None:
            if len(self._trees) >= 256:
                self._trees.clear()
            tree_id = self._trees[addresses] = next(self._tree_ids)
        return tree_id

    def _hold(self, reach: tuple[Target, ...], attempt: Callable[[], bool]) -> None:
        """Queue a send: ``attempt()`` sends it when the fences allow (True) or not."""
        self._held.append((reach, attempt))
        self._held_reach.update(reach)

    def unfence(self, key: TreeKey, addresses: Sequence[str]) -> None:
        """A root's subtree acknowledged (or was given up): its fences drop, and what waited
        on them goes, in order."""
        with self._lock:
            fenced, actor = self._fenced, key[0]
            for address in addresses:
                target = (address, actor)
                keys = fenced.get(target)
                if keys is None or key not in keys:
                    continue
                keys[key] -= 1
                if keys[key] <= 0:
                    del keys[key]
                    if not keys:
                        del fenced[target]
            self._drain()

    def _drain(self) -> None:
        if not self._held:
            return
        waiting: deque[_Held] = deque()
        blocked: set[Target] = set()
        held = self._held
        self._held = deque()
        self._held_reach = Counter()
        for item in held:
            reach, attempt = item
            if blocked.intersection(reach):
                sent = False
            else:
                try:
                    sent = attempt()
                except Exception:
                    log.exception("a message held behind a tree cast could not be sent")
                    sent = True
            if not sent:
                waiting.append(item)
                blocked.update(reach)
        for item in waiting:
            self._held.append(item)
            self._held_reach.update(item[0])

    # -- receiving (the trio thread) ---------------------------------------------------

    def on_cast(self, msg: M.Cast) -> None:
        """A cast for this proc and the subtree behind it."""
        seen = self._seen
        if msg.cast_id in seen:
            node = seen[msg.cast_id]
            if isinstance(node, tuple):  # delivered and acknowledged: tell this sender too
                self._ack(msg.up, msg.offset, node)
            else:
                node.ack_also(msg.up, msg.offset)
            return
        assert isinstance(msg.payload, M.Unpickled)
        if len(msg.dests) == 1:  # a leaf (most procs of a tree): no node, no port
            self._leaf(msg)
            return
        node = TreeNode(
            self,
            cast_id=msg.cast_id,
            actor=msg.actor,
            method=msg.method,
            port=msg.port,
            gather=msg.gather,
            labels=msg.labels,
            sizes=msg.sizes,
            dests=msg.dests,  # type: ignore[arg-type]  # tuples: pickle keeps them
            fanout=msg.fanout,
            parts=msg.payload.parts,
            key=None,
        )
        seen[msg.cast_id] = node
        if len(seen) > _SEEN:
            seen.popitem(last=False)
        self.forwarded += 1
        node.start_forwarder(msg.up, msg.offset)

    def _leaf(self, msg: M.Cast) -> None:
        """Deliver a cast that ends here; acknowledge it (its replies, if gathered, go to
        the forwarder's port and say it all)."""
        seen = self._seen
        seen[msg.cast_id] = ()
        if len(seen) > _SEEN:
            seen.popitem(last=False)
        rt, actor, method = self._rt, msg.actor, msg.method
        payload = msg.payload
        assert isinstance(payload, M.Unpickled)
        traced = rt.trace is not None
        for rank in msg.dests[0][1]:
            args = _codec.load_pickled(payload)  # one copy per rank, as the direct path has
            call = M.Call(actor, method, msg.port, rank, msg.labels, msg.sizes, args)
            if traced:
                call.cast = msg.cast_id  # (its trace's arrow: core/_trace.py)
            rt.to_actor(actor, call)
        if not msg.gather:
            self._ack(msg.up, msg.offset, ())

    def _ack(self, up: M.PortRef, offset: int, unreached: Sequence[tuple[int, int]]) -> None:
        try:
            self._rt.send_port(up, offset, M.TREE_ACK, list(unreached) or None)
        except Exception as exc:  # the sender is gone: its loss is reported elsewhere
            log.info("could not acknowledge a tree cast to %s: %s", up[0], exc)

    def node_done(self, cast_id: tuple[str, int], unreached: tuple[tuple[int, int], ...]) -> None:
        """A forwarding node is done: a proc reached again for its cast acknowledges at
        once, naming ``unreached``."""
        if cast_id in self._seen:
            self._seen[cast_id] = unreached


class _Behind:
    """Which local ranks of a gathered call are behind a proc of its tree (to name them when
    that proc is lost)."""

    def __init__(self, dests: Dests, fanout: int) -> None:
        self.dests, self.fanout = dests, fanout

    def __call__(self, address: str) -> list[int]:
        for position, (a, _) in enumerate(self.dests):
            if a == address:
                lo, hi = subtree(len(self.dests), self.fanout, position)
                return [r for _, ranks in self.dests[lo:hi] for r in ranks]
        return []


class TreeNode(PortBase):
    """One proc's part in one tree cast, a reply-port handler: the shell that feeds its
    :class:`~regency.core._treenode.TreeMachine` (states, events, decisions: see that module)
    what happens to the port and performs what it decides (sends, deliveries, fences).

    At the sender (``key`` set) the machine's fence decisions drop this runtime's fences,
    and, in gather mode, its replies go to the caller's ``Replies`` (``inner``)."""

    #: A lost child does not close this port: the node takes over for it.
    keep_port_on_loss = True

    def __init__(
        self,
        casting: Casting,
        *,
        cast_id: tuple[str, int],
        actor: str,
        method: str,
        port: M.PortRef | None,
        gather: bool,
        labels: Sequence[str],
        sizes: Sequence[int],
        dests: Dests,
        fanout: int,
        parts: Sequence[Any],
        key: TreeKey | None,
        inner: Any = None,
    ) -> None:
        self.casting, self.rt = casting, casting._rt
        self.cast_id, self.actor, self.method = cast_id, actor, method
        self.port, self.gather, self.labels, self.sizes = port, gather, labels, sizes
        self.cast_dests, self.fanout, self.parts, self.key = dests, fanout, parts, key
        self.inner = inner
        self.endpoint = f"{actor}.{method}"  # names an undecodable reply
        self.machine = TreeMachine(dests, fanout, gather=gather, root=key is not None)
        self.port_id: int | None = None
        #: The procs the port waits on (their loss is reported to :meth:`fail`): the
        #: machine's, as of its last event.
        self.dests: frozenset[str] = frozenset()

    # -- events ------------------------------------------------------------------------

    def start_root(self) -> None:
        """At the sender (on the loop; the port is open): send to the first proc of each
        range."""
        self._perform(self.machine.start())

    def start_forwarder(self, up: M.PortRef, offset: int) -> None:
        self._perform(self.machine.start(up, offset))
        # A forwarder never sends the cast again (a lost child's range goes up, to the
        # sender), so the payload is not kept while the subtree answers.
        self.parts = ()

    def deliver(self, index: int, status: int, value: Any) -> bool:
        machine = self.machine
        try:
            if status == M.TREE_ACK:
                decisions = machine.tree_ack(index, value)
            elif status == M.BATCH:  # a batch that could not be unpickled
                error = value.error if type(value) is M.Undecodable else value
                decisions = machine.unreadable(index, error)
            else:
                decisions = machine.reply(index, status, value)
        except UnexpectedEvent as exc:  # a peer that breaks the protocol: ignored
            log.warning("tree cast %s: %s (status %s, index %s)", self.cast_id, exc, status, index)
            return machine.state is FINISHED
        if decisions:
            self._perform(decisions)
        self.dests = machine.waiting_on
        return machine.state is FINISHED

    def deliver_batch(self, offset: int, entries: list[tuple[int, int, Any]]) -> bool:
        """The replies of the range at ``offset``, gathered by its first proc."""
        machine = self.machine
        try:
            decisions = machine.batch(offset, entries)
        except UnexpectedEvent as exc:
            log.warning("tree cast %s: %s (offset %s)", self.cast_id, exc, offset)
            return machine.state is FINISHED
        if decisions:
            self._perform(decisions)
        self.dests = machine.waiting_on
        return machine.state is FINISHED

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        """A child is lost (``address``) before it acknowledged, or the runtime stops."""
        machine = self.machine
        try:
            decisions = machine.stop() if address is None else machine.lost(address, exc)
        except UnexpectedEvent as unexpected:
            log.warning("tree cast %s: %s (%s)", self.cast_id, unexpected, address)
            return
        self._perform(decisions)

    def ack_also(self, up: M.PortRef, offset: int) -> None:
        """This proc was reached again for the same cast (a sender took over for a lost
        forwarder): acknowledge to that sender too, once done."""
        try:
            decisions = self.machine.duplicate(up, offset)
        except UnexpectedEvent as exc:  # a node whose start raised
            log.warning("tree cast %s: %s", self.cast_id, exc)
            return
        self._perform(decisions)

    # -- decisions ---------------------------------------------------------------------

    def _perform(self, decisions: Decisions) -> None:
        """Carry the machine's decisions out, in order; then report the sends that raised."""
        failed: list[tuple[str, BaseException]] = []
        casting = self.casting
        for decision in decisions:
            if isinstance(decision, Forward):
                self._send(decision.ranges, failed)
            elif isinstance(decision, Deliver):
                self._deliver_here(decision)
            elif isinstance(decision, Acknowledge):
                for up, offset in decision.ups:
                    casting._ack(up, offset, decision.unreached)
            elif isinstance(decision, Answer):
                self._answer(decision.entries)
            elif isinstance(decision, Unfence):
                assert self.key is not None
                casting.unfence(self.key, decision.addresses)
            elif isinstance(decision, SendBatch):
                self._send_batch(decision)
            elif isinstance(decision, TakeOver):
                log.info(
                    "took over a tree cast for the lost proc at %s (%s)",
                    decision.address, decision.cause,
                )
                self._send(decision.ranges, failed)
            elif isinstance(decision, Finish):
                casting.node_done(self.cast_id, decision.unreached)
                self._close()
            elif isinstance(decision, OpenPort):
                self.port_id = self.rt.open_port(self)[1]
            else:
                self._close()  # Close: stopped before done
        for address, cause in failed:
            self._perform(self.machine.send_failed(address, cause))
        self.dests = self.machine.waiting_on

    def _send(self, ranges: Sequence[tuple[int, int]], failed: list[tuple[str, BaseException]]) -> None:
        """Send the cast to the first proc of each range; note the sends that raise."""
        rt = self.rt
        mine = (rt.address, self.port_id) if self.port_id is not None else None
        payload = M.Pickled(self.parts)
        for lo, hi in ranges:
            address = self.cast_dests[lo][0]
            assert mine is not None
            msg = M.Cast(
                self.cast_id, self.actor, self.method,
                mine if self.gather else self.port, mine, lo, self.gather,
                self.labels, self.sizes, self.cast_dests[lo:hi], self.fanout, payload,
            )
            try:
                rt.outbox(address).send(_codec.encode(msg))
            except UndeliverableError as error:
                failed.append((address, error))

    def _deliver_here(self, decision: Deliver) -> None:
        """The call to this proc's ranks (their replies: to this node's port when it
        collects them, else to the cast's)."""
        rt = self.rt
        here = (rt.address, self.port_id) if decision.collect and self.port_id else self.port
        actor, method, labels, sizes = self.actor, self.method, self.labels, self.sizes
        payload = M.Unpickled(tuple(self.parts))
        traced = rt.trace is not None
        for rank in decision.ranks:
            args = _codec.load_pickled(payload)  # one copy per rank, as the direct path has
            call = M.Call(actor, method, here, rank, labels, sizes, args)
            if traced:
                call.cast = self.cast_id  # (its trace's arrow: core/_trace.py)
            rt.to_actor(actor, call)

    def _answer(self, entries: list[tuple[int, int, Any]]) -> None:
        """(At the sender, gather mode) hand replies to the caller's ``Replies``."""
        inner = self.inner
        if inner is not None and self.rt.ports.get(self.port[1] if self.port else -1) is not inner:
            inner = self.inner = None  # the call is over (failed, or answered directly)
        if inner is not None:
            for index, status, value in entries:
                if inner.deliver(index, status, value):
                    self.inner = None
                    assert self.port is not None
                    self.rt.close_port(self.port[1])
                    break

    def _send_batch(self, decision: SendBatch) -> None:
        assert self.port is not None
        try:
            self.rt.send_port(self.port, decision.offset, M.BATCH, decision.replies)
        except UndeliverableError as exc:  # the sender is gone: nobody waits any more
            log.info("could not send the replies of a tree cast up: %s", exc)
        except Exception:  # a reply that unpickled here but does not pickle again
            self._send_one_by_one(decision.offset, decision.replies)

    def _send_one_by_one(self, offset: int, replies: list[tuple[int, int, Any]]) -> None:
        """Send the gathered replies one per frame; one that cannot be pickled again goes as
        a DEAD answer saying so, so the caller never waits for it."""
        assert self.port is not None
        for index, status, value in replies:
            try:
                self.rt.send_port(self.port, offset, M.BATCH, [(index, status, value)])
            except UndeliverableError:
                return
            except Exception as exc:
                failure = RemoteFailure(
                    "regency.SupervisionError",
                    f"the reply of rank {index} could not be forwarded up the casting tree "
                    f"from {self.rt.address}: {type(exc).__name__}: {exc}",
                    "",
                )
                try:
                    self.rt.send_port(self.port, offset, M.BATCH, [(index, M.DEAD, failure)])
                except Exception as again:
                    log.info("could not send a reply up a casting tree: %s", again)

    def _close(self) -> None:
        if self.port_id is not None:
            self.rt.close_port(self.port_id)
