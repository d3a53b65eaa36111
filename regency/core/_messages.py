"""Every message the runtime sends or queues, as a record. Only :mod:`regency.core._codec`
knows how they look on the wire; everything else builds and matches these records
(``match msg: case Call(): ...``, with ``assert_never`` for the cases left).

Payloads (arguments, replies, spawn records, failure causes, launch requests) travel after
the fields, pickled. A ``payload`` field holds, on the way out, either the value (the codec
pickles it) or a :class:`Pickled` (pickled once, shared by every destination of a mesh call);
on the way in, the unpickled value, or an :class:`Undecodable` when unpickling failed (the
receiver answers with that error instead of dropping the connection).

``port`` fields are ``(address, port_id)`` or None when no reply is wanted. ``owner`` is
``(address, actor_key, name)`` of the actor that spawned the mesh (``actor_key`` is
``"client"`` for the controller's main code): FAILED reports go there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

PortRef = tuple[str, int]
Owner = tuple[str, str, str]

# Reply statuses.
OK = 0
#: The endpoint raised; the payload is a RemoteFailure. The actor goes on.
ERROR = 1
#: The actor cannot take calls (failed, stopped); the payload is a RemoteFailure.
DEAD = 2
#: (casting trees) the payload is a list of ``(index, status, value)`` replies, gathered by a
#: forwarding proc: the port handler gets each as if it had come alone.
BATCH = 3
#: (casting trees) the subtree whose range starts at ``index`` has every message of the cast
#: in its mailboxes; no payload.
TREE_ACK = 4


@attrs.frozen
class Pickled:
    """A payload pickled by :func:`regency.core._codec.dumps`: the pickle, then its
    out-of-band buffers."""

    parts: Sequence[bytes | memoryview]


@attrs.frozen
class Undecodable:
    """A received payload that could not be unpickled (a class the receiver cannot import,
    a corrupt pickle): ``error`` is what unpickling raised."""

    error: Exception


@attrs.frozen
class Unpickled:
    """A received payload not unpickled yet (``parts`` as :func:`~regency.core._codec.dumps`
    made them): the receiver unpickles it where it chooses. A SPAWN's payload carries the
    actor class, whose unpickling may import heavy modules (a notebook's class brings torch:
    seconds), so a proc does it off its event loop."""

    parts: tuple[bytes, ...]


# -- between runtimes -----------------------------------------------------------------------


# Call and Reply are most of the traffic: instance dicts make a frozen record cheaper to
# build than slots (attrs then fills ``__dict__`` directly; measured 0.38 against 0.6 us).


@attrs.define(slots=True, eq=True)
class Call:
    """Call ``method`` of actor ``actor`` (one rank of a mesh); payload ``(args, kwargs)``.
    ``rank``, ``labels`` and ``sizes`` place the receiver in the slice the call went to.

    Slotted and, unlike the other records, not frozen: a call is the record of the hot
    path, built field by field by the decoder (``_codec.decode_compact_call``) and read
    by the mailbox, the flight recorder and the handler about twenty times; slot stores
    and loads are the cheapest Python has (a frozen class's ``__setattr__`` refuses them,
    and a ``__dict__`` filled by hand defeats the interpreter's attribute caches). Nothing
    changes a call after it is built but the two stamps below."""

    actor: str
    method: str
    port: PortRef | None
    rank: int
    labels: Sequence[str]
    sizes: Sequence[int]
    payload: Any
    #: When the call was queued in its actor's mailbox, on that runtime's clock: stamped
    #: as it is queued (the flight recorder's, core/_mailbox.py); -inf until then. Neither
    #: sent, compared nor printed.
    queued_at: float = attrs.field(default=-math.inf, init=False, eq=False, repr=False)
    #: The casting tree's ``cast_id`` a call came down (stamped by the proc that delivers
    #: it while tracing is on, as ``queued_at`` is): its trace's arrow starts at the send.
    cast: tuple[str, int] | None = attrs.field(default=None, init=False, eq=False, repr=False)


@attrs.frozen(slots=False)
class Reply:
    """A value for reply port ``port_id`` from rank ``index``; payload: the value (``OK``)
    or a RemoteFailure (``ERROR``, ``DEAD``)."""

    port_id: int
    index: int
    status: int
    payload: Any


@attrs.frozen
class Cast:
    """A call cast down a tree (:mod:`regency.core._casting`): the receiver is
    ``dests[0]``'s proc; it delivers ``Call(actor, method, ...)`` to its own ranks and forwards
    the rest of ``dests`` in at most ``fanout`` ranges (:mod:`regency.core._tree`).

    ``dests``: ``(address, local ranks)`` of each proc of this subtree, in tree order.
    ``offset``: where ``dests`` starts in the sender's list (named in the TREE_ACK).
    ``up``: the sender's port for the TREE_ACK of this subtree (and, when ``gather``,
    ``port`` is where this subtree's replies go as one BATCH).
    ``cast_id``: ``(origin address, number)``, so a proc reached twice (a forwarder was lost
    and another took over) delivers once. Payload ``(args, kwargs)``: on the way in, an
    :class:`Unpickled` (forwarded as it came)."""

    cast_id: tuple[str, int]
    actor: str
    method: str
    port: PortRef | None
    up: PortRef
    offset: int
    gather: bool
    labels: Sequence[str]
    sizes: Sequence[int]
    dests: Sequence[tuple[str, Sequence[int]]]
    fanout: int
    payload: Any


@attrs.frozen
class Spawn:
    """Start rank ``rank`` of actor mesh ``actor``; payload ``(cls, args, kwargs)``. The
    spawn is acknowledged on ``port`` once ``__init__`` ran."""

    actor: str
    name: str
    rank: int
    labels: Sequence[str]
    sizes: Sequence[int]
    port: PortRef | None
    owner: Owner
    payload: Any


@attrs.frozen
class StopActor:
    """Stop actor ``actor`` once it has handled what is queued; acknowledged on ``port``."""

    actor: str
    port: PortRef | None


@attrs.frozen
class StopProc:
    """Stop the receiving proc (acknowledged on ``port`` first)."""

    port: PortRef | None


@attrs.frozen
class Hello:
    """A new proc is up and listens at ``address`` (to the runtime that started it); or,
    with ``error``, its bootstrap callable raised and it is about to exit: ``error`` is
    ``(type name, message, traceback text)`` of what it raised."""

    proc_id: str
    address: str
    error: tuple[str, str, str] | None = None


@attrs.frozen
class Failed:
    """Rank ``rank`` of mesh ``mesh`` failed (to the mesh's owner); payload: FailureCause."""

    mesh: str
    rank: int
    payload: Any


@attrs.frozen
class Heartbeat:
    """The proc at ``address`` is alive (to the runtime that started it)."""

    address: str


# -- delivery sessions (regency.core._outbox and _inbound) -------------------------------------


@attrs.frozen
class Session:
    """The frames that follow on this connection are frames ``first``, ``first + 1``, ... of
    delivery session ``session``."""

    session: str
    first: int


@attrs.frozen
class Ack:
    """The receiver handled every frame of the session below ``count``."""

    count: int


# -- controller <-> worker daemon (regency.core._hosts, _worker) ------------------------------


@attrs.frozen
class Attach:
    """Controller ``controller`` takes the worker, renewing a lease every ``lease`` seconds;
    the reply is ``(hostname, host_ip, ports)``."""

    controller: str
    lease: float
    port: PortRef


@attrs.frozen
class Reserve:
    """Reserve ``count`` TCP ports on the worker's host; the reply is the list."""

    controller: str
    count: int
    port: PortRef


@attrs.frozen
class Launch:
    """Start procs; payload: a list of ``(bootstrap record, env)``."""

    controller: str
    payload: Any


@attrs.frozen
class Exited:
    """(worker -> controller) the proc at ``address`` exited with ``code``; ``tail``: its
    last lines of output, as (stream, line) pairs (``tail_log_lines``)."""

    address: str
    code: int
    tail: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Kill:
    """Kill the controller's proc at ``address``."""

    controller: str
    address: str


@attrs.frozen
class Lease:
    """The controller is alive: renew its lease."""

    controller: str


@attrs.frozen
class Detach:
    """The controller is done with the worker: a clean exit, or (``shutdown``)
    ``HostMesh.shutdown()``, after which a ``run_worker_loop_forever`` worker exits."""

    controller: str
    shutdown: bool = False


@attrs.frozen
class Refused:
    """(worker -> controller) the proc at ``address`` was not launched, because ``reason``
    (its port was taken, the controller is not the one the worker serves)."""

    address: str
    reason: str


@attrs.frozen
class Lapsed:
    """(worker -> controller) the worker at ``worker`` dropped this controller: ``reason``."""

    worker: str
    reason: str


#: What a worker daemon and a controller say to each other (handled by runtime extensions).
HostMessage = Attach | Reserve | Launch | Exited | Kill | Lease | Detach | Refused | Lapsed
#: Every frame a runtime dispatches.
Message = Call | Reply | Cast | Spawn | StopActor | StopProc | Hello | Failed | Heartbeat | HostMessage
#: Every frame on the wire.
Wire = Message | Session | Ack


# -- within a proc: what an actor's mailbox holds besides Call and StopActor ------------------


@attrs.frozen
class Supervise:
    """A mesh this actor owns failed: run ``__supervise__`` (a MeshFailure)."""

    failure: Any


@attrs.frozen
class Escalate:
    """Something this actor owns failed and nobody handled it: die of ``cause``."""

    cause: Any


@attrs.frozen
class Abandon:
    """The runtime is going away: stop popping the mailbox."""


MailboxItem = Call | StopActor | Supervise | Escalate | Abandon
