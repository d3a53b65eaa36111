"""One proc's part in one tree cast, as a pure state machine: events in, decisions out.

A cast down a casting tree (:mod:`regency.core._tree` gives its shape) has, on each proc that
forwards it and on its sender, a :class:`TreeMachine`. The proc's shell
(:class:`regency.core._casting.TreeNode`, a reply-port handler) feeds it what happens and
performs what it decides; this module has no trio, no sockets, no runtime. Positions are
indices into the node's own ``dests`` (a forwarder's: its range of the cast's procs, its own
proc first; the sender's: every proc of the cast); ranges are ``[lo, hi)`` of positions.

Roles and modes. The *sender* (``root``) sends to the first proc of each of its ranges; a
*forwarder* delivers to its own ranks and sends to the first proc of each of its child
ranges. Without ``gather`` (``broadcast``, ``stream``, ``send``) every proc acknowledges its
range (TREE_ACK) once its ranks have the message and its children acknowledged theirs, naming
the ranges it could not reach, and the sender sends those itself (or, when it cannot reach a
range's first proc either, that proc's child ranges: a *take-over*). With ``gather``
(``call``) nothing is acknowledged: a forwarder collects its range's replies and sends them up
as one BATCH, answering ``DEAD`` for the ranks behind a child it lost; the sender hands each
reply to the caller.

States (:data:`STATES`): ``new``; after :meth:`TreeMachine.start`, one of ``root_acking``,
``root_gathering``, ``acking``, ``gathering`` (by role and mode); ``finished`` once everything
is accounted for (acknowledged, batched); ``stopped`` when the runtime stopped (or the port
handler failed) before that.

Events (:data:`EVENTS`), each a method: ``start`` (the cast arrived here, or, at the sender,
the cast leaves), ``tree_ack`` (a child's TREE_ACK with the sub-ranges it could not reach),
``reply`` (one rank's reply: a local rank's, a leaf child's, or, at the sender, a one-proc
range's), ``batch`` (a child range's replies, gathered), ``unreadable`` (a BATCH that could not
be unpickled), ``lost`` (the runtime lost a child's proc), ``send_failed`` (sending the cast to
a child raised: the same as lost), ``duplicate`` (the cast reached this proc again, after a
take-over) and ``stop``. There is no timer: a silent child is the delivery layer's to notice
(its timeout), which then reports it ``lost``.

Decisions (an event returns a list, performed in its order): :data:`OPEN_PORT`,
:class:`Forward`, :class:`TakeOver`, :class:`Deliver`, :class:`Acknowledge`,
:class:`SendBatch`, :class:`Answer`, :class:`Unfence`, :class:`Finish`, :data:`CLOSE`. The
shell reports each send of a :class:`Forward` or :class:`TakeOver` that raised with
:meth:`TreeMachine.send_failed` once it has performed the whole list (the decisions that
follow a forward never depend on whether its sends went: its ranges are pending until
answered).

:data:`TRANSITIONS` is the whole behaviour as data: ``(state, event) -> (handler, states it
may lead to)``, total over :data:`VISIBLE` (the events each state can see; an event a state
cannot see raises :class:`UnexpectedEvent`: a bug in the shell, or a peer breaking the
protocol). :func:`check_table` checks it (at import); ``tests/core/test_treenode_machine.py``
drives whole trees of machines with Hypothesis and checks every step against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ._errors import RemoteFailure
from ._messages import DEAD
from ._tree import Range, child_ranges, root_ranges

Port = Any  # where a TREE_ACK or a BATCH goes (the shell's port reference), opaque here
Entry = tuple[int, int, Any]  # one reply: (rank, status, value)
Dests = Sequence[tuple[str, Sequence[int]]]  # (address, local ranks) per position


class UnexpectedEvent(RuntimeError):
    """An event the machine's state cannot see (see :data:`VISIBLE`)."""


# -- decisions --------------------------------------------------------------------------------


@attrs.frozen
class OpenPort:
    """Open this node's reply port (a forwarder with children: they answer to it)."""


OPEN_PORT = OpenPort()


@attrs.frozen
class Forward:
    """Send the cast to the first proc of each range (its up port: this node's; at
    ``offset`` = the range's ``lo``); report each send that raises with
    :meth:`TreeMachine.send_failed` once the decisions are performed."""

    ranges: tuple[Range, ...]


@attrs.frozen
class TakeOver:
    """(The sender) ``address``, first proc of a range, is lost (``cause``): send the cast
    to the ranges it would have forwarded to (as :class:`Forward`), and say so."""

    address: str
    cause: BaseException
    ranges: tuple[Range, ...]


@attrs.frozen
class Deliver:
    """Deliver the call to this proc's ``ranks``; their replies go to this node's port
    (``collect``: a forwarder of a gathered call) or to the cast's port."""

    ranks: tuple[int, ...]
    collect: bool


@attrs.frozen
class Acknowledge:
    """Send TREE_ACK to each ``(port, offset)`` of ``ups``, naming ``unreached`` (ranges, in
    this node's positions, that it could not reach)."""

    ups: tuple[tuple[Port, int], ...]
    unreached: tuple[Range, ...]


@attrs.frozen(eq=False)
class SendBatch:
    """Send the range's ``replies`` up, as one BATCH at ``offset``, to the cast's port."""

    offset: int
    replies: list[Entry]


@attrs.frozen(eq=False)
class Answer:
    """(The sender of a gathered call) hand these replies to the caller's port handler."""

    entries: list[Entry]


@attrs.frozen
class Unfence:
    """(The sender) these procs have the message, or are given up: their fences drop."""

    addresses: tuple[str, ...]


@attrs.frozen
class Finish:
    """Done: close the port; a proc reached again acknowledges with ``unreached``."""

    unreached: tuple[Range, ...]


@attrs.frozen
class Close:
    """Stopped before done: close the port."""


CLOSE = Close()

Decision = (
    OpenPort | Forward | TakeOver | Deliver | Acknowledge | SendBatch | Answer | Unfence | Finish
    | Close
)
#: What an event returns: the decisions to perform, in order (an empty tuple when none).
Decisions = Sequence[Decision]
_NONE: tuple[Decision, ...] = ()

# -- states and events ------------------------------------------------------------------------

NEW = "new"
ROOT_ACKING = "root_acking"  # the sender of a cast: waits for its ranges' TREE_ACKs
ROOT_GATHERING = "root_gathering"  # the sender of a call: waits for its ranges' replies
ACKING = "acking"  # a forwarder of a cast: waits for its children's TREE_ACKs
GATHERING = "gathering"  # a forwarder of a call: collects its range's replies
FINISHED = "finished"
STOPPED = "stopped"
STATES = (NEW, ROOT_ACKING, ROOT_GATHERING, ACKING, GATHERING, FINISHED, STOPPED)

START = "start"
TREE_ACK = "tree_ack"
REPLY = "reply"
BATCH = "batch"
UNREADABLE = "unreadable"
LOST = "lost"
SEND_FAILED = "send_failed"
DUPLICATE = "duplicate"
STOP = "stop"
EVENTS = (START, TREE_ACK, REPLY, BATCH, UNREADABLE, LOST, SEND_FAILED, DUPLICATE, STOP)

_WAITING_FOR_ACKS = frozenset({TREE_ACK, LOST, SEND_FAILED, STOP})
_WAITING_FOR_REPLIES = frozenset({REPLY, BATCH, UNREADABLE, LOST, SEND_FAILED, STOP})

#: The events each state can see. The roots are never reached twice (they are no proc of
#: their cast); a port that is closed (``new`` has none open yet at a forwarder and nothing
#: sent at the sender; ``finished``, ``stopped``) gets no replies and no losses; a
#: forwarder's cast carries its port only as ``up`` (TREE_ACKs) without ``gather``, and
#: nothing is acknowledged with it.
VISIBLE: dict[str, frozenset[str]] = {
    NEW: frozenset({START, STOP}),
    ROOT_ACKING: _WAITING_FOR_ACKS,
    ROOT_GATHERING: _WAITING_FOR_REPLIES,
    ACKING: _WAITING_FOR_ACKS | {DUPLICATE},
    GATHERING: _WAITING_FOR_REPLIES | {DUPLICATE},
    FINISHED: frozenset({DUPLICATE, STOP}),
    # The runtime stopped between opening the sender's port and its start (scheduled).
    STOPPED: frozenset({START, DUPLICATE, STOP}),
}


def _t(handler: str, *leads_to: str) -> tuple[str, frozenset[str]]:
    return handler, frozenset(leads_to)


#: ``(state, event) -> (handler, the states it may lead to)``: the machine's behaviour.
TRANSITIONS: dict[tuple[str, str], tuple[str, frozenset[str]]] = {
    (NEW, START): _t("_start", ROOT_ACKING, ROOT_GATHERING, ACKING, GATHERING, FINISHED),
    (NEW, STOP): _t("_stop", STOPPED),
    # The sender of a cast: a range acknowledged drops its fences and its unreached
    # sub-ranges are sent again; a lost range's first proc is taken over.
    (ROOT_ACKING, TREE_ACK): _t("_root_acked", ROOT_ACKING, FINISHED),
    (ROOT_ACKING, LOST): _t("_lost", ROOT_ACKING, FINISHED),
    (ROOT_ACKING, SEND_FAILED): _t("_lost", ROOT_ACKING, FINISHED),
    (ROOT_ACKING, STOP): _t("_stop", STOPPED),
    # The sender of a call: replies go to the caller; a range fully answered, or lost (the
    # caller's port names its ranks), is done.
    (ROOT_GATHERING, REPLY): _t("_root_reply", ROOT_GATHERING, FINISHED),
    (ROOT_GATHERING, BATCH): _t("_root_batch", ROOT_GATHERING, FINISHED),
    (ROOT_GATHERING, UNREADABLE): _t("_unreadable", ROOT_GATHERING, FINISHED),
    (ROOT_GATHERING, LOST): _t("_lost", ROOT_GATHERING, FINISHED),
    (ROOT_GATHERING, SEND_FAILED): _t("_lost", ROOT_GATHERING, FINISHED),
    (ROOT_GATHERING, STOP): _t("_stop", STOPPED),
    # A forwarder of a cast: acknowledges once every child did; a lost child's range is
    # handed up in the acknowledgement.
    (ACKING, TREE_ACK): _t("_acked", ACKING, FINISHED),
    (ACKING, LOST): _t("_lost", ACKING, FINISHED),
    (ACKING, SEND_FAILED): _t("_lost", ACKING, FINISHED),
    (ACKING, DUPLICATE): _t("_duplicate", ACKING),
    (ACKING, STOP): _t("_stop", STOPPED),
    # A forwarder of a call: batches once every rank of its range is answered; a lost
    # child's ranks are answered DEAD.
    (GATHERING, REPLY): _t("_reply", GATHERING, FINISHED),
    (GATHERING, BATCH): _t("_batch", GATHERING, FINISHED),
    (GATHERING, UNREADABLE): _t("_unreadable", GATHERING, FINISHED),
    (GATHERING, LOST): _t("_lost", GATHERING, FINISHED),
    (GATHERING, SEND_FAILED): _t("_lost", GATHERING, FINISHED),
    (GATHERING, DUPLICATE): _t("_duplicate", GATHERING),
    (GATHERING, STOP): _t("_stop", STOPPED),
    # Done: a proc reached again acknowledges at once (gathered calls are never sent twice).
    (FINISHED, DUPLICATE): _t("_duplicate", FINISHED),
    (FINISHED, STOP): _t("_ignore", FINISHED),
    (STOPPED, START): _t("_ignore", STOPPED),  # nothing leaves a stopped runtime
    (STOPPED, DUPLICATE): _t("_duplicate", STOPPED),
    (STOPPED, STOP): _t("_ignore", STOPPED),
}


# -- the machine ------------------------------------------------------------------------------


class TreeMachine:
    """One proc's part in one tree cast (see the module docstring).

    Invariants: ``pending`` holds the ranges sent to and not yet acknowledged (answered, when
    gathering): ``lo -> (lo, hi)``; :attr:`waiting_on` is their first procs. Ranges this proc
    could not reach are in ``unreached`` (a forwarder of a cast: handed up). A forwarder of a
    call has answered ``answered`` of its ``expected`` ranks, in ``replies``. The sender of a
    call counts per range the ranks still unanswered (``remaining``) and knows the range of
    each rank of a one-proc range (``alone``: those reply to it directly).
    """

    __slots__ = (
        "acked", "alone", "answered", "dests", "expected", "fanout", "gather", "offset",
        "pending", "remaining", "replies", "root", "state", "unreached", "ups", "waiting_on",
    )

    def __init__(self, dests: Dests, fanout: int, *, gather: bool, root: bool) -> None:
        self.dests, self.fanout, self.gather, self.root = dests, fanout, gather, root
        self.state = NEW
        self.pending: dict[int, Range] = {}
        #: The procs whose loss this node must hear of: the first of each pending range
        #: (kept up to date by every event).
        self.waiting_on: frozenset[str] = frozenset()
        #: Where this range's TREE_ACK goes: (port, offset) per sender (two when a sender took
        #: over for a lost forwarder and reached this proc again).
        self.ups: list[tuple[Port, int]] = []
        self.offset = 0
        self.unreached: list[Range] = []
        #: Acknowledged upward already, or never will be (the sender; a gathered call).
        self.acked = gather or root
        self.expected = 0
        self.answered: set[int] = set()
        self.replies: list[Entry] = []
        self.remaining: dict[int, int] = {}
        self.alone: dict[int, int] = {}

    # -- events ------------------------------------------------------------------------------

    def start(self, up: Port = None, offset: int = 0) -> Decisions:
        """At the sender (its port open): the cast leaves. At a forwarder: the cast arrived
        from ``up``, where its range starts at ``offset``."""
        return self._on(START)(self, up, offset)

    def tree_ack(self, index: int, unreached: Sequence[Range] | None) -> Decisions:
        """The range at ``index`` acknowledged; ``unreached``: its sub-ranges it could not
        reach, in its positions."""
        return self._on(TREE_ACK)(self, index, unreached)

    def reply(self, index: int, status: int, value: Any) -> Decisions:
        """Rank ``index`` replied."""
        return self._on(REPLY)(self, index, status, value)

    def batch(self, offset: int, entries: list[Entry]) -> Decisions:
        """The replies of the range at ``offset``, gathered by its first proc."""
        return self._on(BATCH)(self, offset, entries)

    def unreadable(self, index: int, error: Any) -> Decisions:
        """The batch of the range at ``index`` could not be unpickled (``error``)."""
        return self._on(UNREADABLE)(self, index, error)

    def lost(self, address: str, cause: BaseException) -> Decisions:
        """The runtime lost the proc at ``address`` (one of :attr:`waiting_on`)."""
        return self._on(LOST)(self, address, cause)

    def send_failed(self, address: str, cause: BaseException) -> Decisions:
        """Sending the cast to ``address`` (a :class:`Forward`'s) raised ``cause``."""
        return self._on(SEND_FAILED)(self, address, cause)

    def duplicate(self, up: Port, offset: int) -> Decisions:
        """This proc was reached again for the same cast (a sender took over for a lost
        forwarder): acknowledge to that sender too, once done."""
        return self._on(DUPLICATE)(self, up, offset)

    def stop(self) -> Decisions:
        """The runtime stops, or the port handler failed: give up what is pending."""
        return self._on(STOP)(self)

    def _on(self, event: str) -> Callable[..., Decisions]:
        handler = _HANDLERS[self.state].get(event)
        if handler is None:
            raise UnexpectedEvent(f"a tree node in state {self.state!r} got {event!r}")
        return handler

    # -- handlers (see TRANSITIONS) ----------------------------------------------------------

    def _start(self, up: Port, offset: int) -> Decisions:
        if self.root:
            ranges = root_ranges(len(self.dests), self.fanout)
            if self.gather:
                dests = self.dests
                for lo, hi in ranges:
                    self.remaining[lo] = sum(len(r) for _, r in dests[lo:hi])
                    if hi - lo == 1:
                        for rank in dests[lo][1]:
                            self.alone[rank] = lo
            self.state = ROOT_GATHERING if self.gather else ROOT_ACKING
            out: list[Decision] = [self._forward(ranges)]
            self._progress(out)
            return out
        self.ups.append((up, offset))
        self.offset = offset
        children = child_ranges(0, len(self.dests), self.fanout)
        ranks = tuple(self.dests[0][1])
        if not children:
            # A leaf (the shell delivers these without a node: the same decisions).
            out = [Deliver(ranks, False)]
            if self.gather:  # its ranks answer its forwarder directly
                self.state = FINISHED
                out.append(Finish(()))
            else:
                self.state = ACKING
                self._progress(out)
            return out
        if self.gather:
            self.state = GATHERING
            self.expected = sum(len(r) for _, r in self.dests)
        else:
            self.state = ACKING
        out = [OPEN_PORT, self._forward(children), Deliver(ranks, self.gather)]
        self._progress(out)
        return out

    def _forward(self, ranges: Sequence[Range]) -> Forward:
        pending = self.pending
        for span in ranges:
            pending[span[0]] = span
        self._waiting_changed()
        return Forward(tuple(ranges))

    def _waiting_changed(self) -> None:
        dests = self.dests
        self.waiting_on = frozenset(dests[lo][0] for lo in self.pending)

    def _root_acked(self, index: int, value: Sequence[Range] | None) -> Decisions:
        span = self.pending.pop(index, None)
        if span is None:
            return _NONE  # a late acknowledgement of a range given up
        # Ranges the child could not reach, in its positions: ours are shifted.
        unreached = [
            (index + a, index + b) for a, b in value or () if index + a not in self.pending
        ]
        out: list[Decision] = [self._range_done(span, keep=unreached)]
        if unreached:
            out.append(self._forward(unreached))  # the sender tries them itself
        else:
            self._waiting_changed()
        self._progress(out)
        return out

    def _acked(self, index: int, value: Sequence[Range] | None) -> Decisions:
        span = self.pending.pop(index, None)
        if span is None:
            return _NONE
        pending = self.pending
        self.unreached.extend(
            (index + a, index + b) for a, b in value or () if index + a not in pending
        )
        self._waiting_changed()
        out: list[Decision] = []
        self._progress(out)
        return out

    def _root_reply(self, index: int, status: int, value: Any) -> Decisions:
        out: list[Decision] = []
        self._answered(out, self.alone.get(index), [(index, status, value)])
        self._progress(out)
        return out

    def _root_batch(self, offset: int, entries: list[Entry]) -> Decisions:
        out: list[Decision] = []
        self._answered(out, offset, entries)
        self._progress(out)
        return out

    def _reply(self, index: int, status: int, value: Any) -> Decisions:
        answered = self.answered
        if index not in answered:
            answered.add(index)
            self.replies.append((index, status, value))
            if len(answered) >= self.expected:
                out: list[Decision] = []
                self._progress(out)
                return out
        return _NONE

    def _batch(self, offset: int, entries: list[Entry]) -> Decisions:
        answered, replies = self.answered, self.replies
        for entry in entries:
            if entry[0] not in answered:
                answered.add(entry[0])
                replies.append(entry)
        out: list[Decision] = []
        self._progress(out)
        return out

    def _unreadable(self, index: int, error: Any) -> Decisions:
        out: list[Decision] = []
        self._lose_replies(out, index, self._span_at(index), f"its replies could not be read: {error}")
        self._progress(out)
        return out

    def _lost(self, address: str, cause: BaseException) -> Decisions:
        out: list[Decision] = []
        dests, pending = self.dests, self.pending
        for lo, span in list(pending.items()):
            if dests[lo][0] == address:
                del pending[lo]
                self._take_over(out, span, address, cause)
        self._waiting_changed()
        self._progress(out)
        return out

    def _duplicate(self, up: Port, offset: int) -> Decisions:
        if self.acked:
            return [Acknowledge(((up, offset),), tuple(self.unreached))]
        self.ups.append((up, offset))
        return _NONE

    def _stop(self) -> Decisions:
        # (The sender) the fences of what is pending drop: nothing will answer for it.
        out: list[Decision] = (
            [self._range_done(span) for span in self.pending.values()] if self.root else []
        )
        self.pending.clear()
        self.waiting_on = frozenset()
        self.state = STOPPED
        out.append(CLOSE)
        return out

    def _ignore(self, *_: Any) -> Decisions:
        return _NONE

    # -- the work ----------------------------------------------------------------------------

    def _take_over(
        self, out: list[Decision], span: Range, address: str, cause: BaseException
    ) -> None:
        """The first proc of ``span`` is lost before it acknowledged (answered)."""
        lo, hi = span
        state = self.state
        if state is GATHERING:
            # The replies of the range went to the lost proc: answer DEAD for what is not in.
            self._lose_replies(
                out, lo, span, f"lost the proc at {address}, which was to forward the call "
                f"and gather the replies of ranks {{ranks}} ({cause})",
            )
        elif state is ROOT_GATHERING:
            # The caller's port (it waits on every proc of the call) names the ranks itself.
            self.remaining.pop(lo, None)
            out.append(self._range_done(span))
        elif state is ACKING:
            # Handed up: the proc may be alive and only cut off from here (a partition), and
            # the sender of the cast may reach it.
            self.unreached.append(span)
        else:
            # The sender reaches the range another way: the lost proc's children directly. A
            # proc the lost one reached already delivers once (the cast's id) and acknowledges
            # again.
            out.append(Unfence((address,)))
            children = child_ranges(lo, hi, self.fanout)
            for child in children:
                self.pending[child[0]] = child
            out.append(TakeOver(address, cause, tuple(children)))

    def _span_at(self, lo: int) -> Range:
        """The range at ``lo`` (pending, or one of a forwarder's child ranges)."""
        return self.pending.get(lo) or next(
            ((a, b) for a, b in child_ranges(0, len(self.dests), self.fanout) if a == lo),
            (lo, lo + 1),
        )

    def _lose_replies(self, out: list[Decision], lo: int, span: Range, why: str) -> None:
        """Answer DEAD for the unanswered ranks of ``span`` (at ``lo``)."""
        ranks = [r for _, rs in self.dests[span[0]:span[1]] for r in rs]
        failure = RemoteFailure("regency.SupervisionError", why.replace("{ranks}", str(ranks)), "")
        if self.root:
            self._answered(out, lo, [(r, DEAD, failure) for r in ranks])
            return
        answered = self.answered
        for rank in ranks:
            if rank not in answered:
                answered.add(rank)
                self.replies.append((rank, DEAD, failure))

    def _answered(self, out: list[Decision], offset: int | None, entries: list[Entry]) -> None:
        """(The sender of a call) hand replies to the caller; a range fully answered has the
        message everywhere: its fences drop."""
        if self.gather:
            out.append(Answer(entries))
        if offset is None or offset not in self.remaining:
            return
        self.remaining[offset] -= len(entries)
        if self.remaining[offset] <= 0:
            del self.remaining[offset]
            span = self.pending.pop(offset, None)
            if span is not None:
                self._waiting_changed()
                out.append(self._range_done(span))

    def _range_done(self, span: Range, keep: Sequence[Range] = ()) -> Unfence:
        """(The sender) the range has the message, or is given up: its fences drop, but
        those of the ``keep`` ranges in it (sent again)."""
        lo, hi = span
        dests = self.dests
        if not keep:
            return Unfence(tuple(dests[i][0] for i in range(lo, hi)))
        kept = {i for a, b in keep for i in range(a, b)}
        return Unfence(tuple(dests[i][0] for i in range(lo, hi) if i not in kept))

    def _progress(self, out: list[Decision]) -> None:
        """Acknowledge, batch and finish what is due."""
        state = self.state
        if state is GATHERING:
            if len(self.answered) < self.expected:
                return
            self.pending.clear()
            self.waiting_on = frozenset()
            out.append(SendBatch(self.offset, self.replies))
        elif self.pending:
            return
        elif state is ACKING:
            self.acked = True
            out.append(Acknowledge(tuple(self.ups), tuple(self.unreached)))
        self.state = FINISHED
        out.append(Finish(tuple(self.unreached)))


def check_table() -> None:
    """:data:`TRANSITIONS` is total over :data:`VISIBLE`, names only handlers that exist,
    and leads only to states."""
    for state in STATES:
        for event in EVENTS:
            present = (state, event) in TRANSITIONS
            if present != (event in VISIBLE[state]):
                raise AssertionError(
                    f"({state}, {event}): "
                    + ("in TRANSITIONS but not visible" if present else "visible, no transition")
                )
    for (state, event), (handler, leads_to) in TRANSITIONS.items():
        if state not in STATES or event not in EVENTS or not leads_to <= set(STATES):
            raise AssertionError(f"({state}, {event}) -> {leads_to}: unknown state or event")
        if not callable(getattr(TreeMachine, handler, None)):
            raise AssertionError(f"({state}, {event}): no handler {handler}")


check_table()

#: state -> event -> handler: TRANSITIONS, resolved.
_HANDLERS: dict[str, dict[str, Callable[..., Decisions]]] = {
    state: {
        event: getattr(TreeMachine, TRANSITIONS[state, event][0])
        for event in EVENTS
        if (state, event) in TRANSITIONS
    }
    for state in STATES
}
