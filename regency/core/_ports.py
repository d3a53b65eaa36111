"""Reply ports: the :class:`PortHandler` interface and the runtime's table of open ports
(:class:`PortTable`, a component of :class:`Runtime`)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .. import transports
from . import _codec
from ._errors import DecodeError
from ._messages import BATCH, Reply, Undecodable

log = logging.getLogger("regency.runtime")


class PortHandler(Protocol):
    """Receives what arrives on one reply port. Called on the runtime's trio thread, unless
    the handler's class sets ``on_any_thread = True``: then ``deliver`` may also run on a
    thread that read the reply itself (core/_leader.py), always under the runtime's
    ``dispatch_lock`` (the loop holds it too while it handles a frame). Handlers subclass
    :class:`PortBase`, which gives the optional parts their defaults."""

    #: Addresses of the procs this port waits on; a lost link to one fails the port.
    dests: frozenset[str]
    @property
    def on_any_thread(self) -> bool:
        """Whether ``deliver`` may run on a thread that read the reply (under the dispatch
        lock)."""
        ...

    @property
    def keep_port_on_loss(self) -> bool:
        """Whether a lost link to a destination leaves the port open (the handler decides
        when it is finished; its ``fail`` is still called)."""
        ...

    @property
    def endpoint(self) -> str | None:
        """The endpoint whose replies come here, named when one cannot be unpickled; None:
        a reply that cannot be unpickled fails the port."""
        ...

    def deliver(self, index: int, status: int, value: Any) -> bool:
        """Handle one reply (``status`` from :mod:`._messages`: ``OK`` with the value, else a
        RemoteFailure); return True when the port is finished and can be closed."""

    def deliver_batch(self, offset: int, entries: list[tuple[int, int, Any]]) -> bool:
        """Replies a forwarding proc of a casting tree gathered, as (rank, status, value);
        True when the port is finished."""

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        """The port can no longer complete (``address``, a destination, is unreachable)."""


class PortBase:
    """The base of port handlers: the defaults of :class:`PortHandler`'s optional parts."""

    __slots__ = ()
    on_any_thread = False
    keep_port_on_loss = False
    endpoint: str | None = None

    #: (Each handler defines it: see :class:`PortHandler`.)
    deliver: Callable[[int, int, Any], bool]

    def deliver_batch(self, offset: int, entries: list[tuple[int, int, Any]]) -> bool:
        """By default each entry as if it had come alone, until the port is finished."""
        return any(self.deliver(rank, status, value) for rank, status, value in entries)


class PortOwner(Protocol):
    """What a :class:`PortTable` needs of the runtime it belongs to."""

    @property
    def address(self) -> str:
        """The runtime's address: a port is named ``(address, port id)``."""
        ...

    @property
    def died(self) -> Exception | None:
        """Set when the runtime's loop died: new ports fail with it at once."""
        ...

    def send(self, address: str, frame: transports.Frame) -> None: ...


class PortTable:
    """A runtime's open reply ports (its component, ``rt.port_table``; the runtime offers
    :meth:`open`, :meth:`close`, :meth:`send_to` and :meth:`deliver` under its own names,
    ``open_port``, ``close_port``, ``send_port`` and ``deliver_reply``)."""

    def __init__(self, owner: PortOwner) -> None:
        self._owner = owner
        #: Open ports by id (read by the runtime's readers and supervision; only this table
        #: and the runtime's shutdown change it).
        self.ports: dict[int, PortHandler] = {}
        self._ids = itertools.count(1)

    def open(self, handler: PortHandler) -> tuple[str, int]:
        owner = self._owner
        if owner.died is not None:  # the runtime's loop is gone: this call could never finish
            raise owner.died
        port_id = next(self._ids)
        self.ports[port_id] = handler
        return (owner.address, port_id)

    def close(self, port_id: int) -> None:
        self.ports.pop(port_id, None)

    def send_to(self, port: tuple[str, int], index: int, status: int, value: Any) -> None:
        """Send ``value`` to a reply port. Raises if the value cannot be pickled."""
        address, port_id = port
        self._owner.send(address, _codec.encode_reply(port_id, index, status, value))

    def deliver_record(self, reply: Reply) -> None:
        self.deliver(reply.port_id, reply.index, reply.status, reply.payload)

    def deliver(
        self,
        port_id: int,
        index: int,
        status: int,
        value: Any,
        handler: PortHandler | None = None,
    ) -> None:
        """A reply's fields to its port's handler (``_codec.decode_reply`` gives them for a
        compact reply frame without building the :class:`Reply`). ``handler``: the port's,
        looked up already by the caller under the dispatch lock (a thread that read it)."""
        if handler is None:
            handler = self.ports.get(port_id)
            if handler is None:
                return  # a late reply to a port that finished or timed out
        try:
            if type(value) is Undecodable:
                endpoint = handler.endpoint
                if endpoint is None:
                    raise value.error
                # A reply that cannot be unpickled fails that call, naming it.
                error = value.error
                detail = (
                    str(error)
                    if isinstance(error, DecodeError)
                    else f"unpickling raised {type(error).__name__}: {error}"
                )
                value = Undecodable(
                    DecodeError(
                        f"cannot unpickle the reply of {endpoint} from rank {index}: "
                        f"{detail}"
                    )
                )
            if status == BATCH and type(value) is list:
                # Replies gathered by a forwarding proc of a casting tree: the tree's own
                # handler takes them whole; any other gets each as if it had come alone.
                finished = handler.deliver_batch(index, value)
            else:
                finished = handler.deliver(index, status, value)
        except (KeyboardInterrupt, trio.Cancelled):
            raise
        except BaseException as exc:  # a handler's unpickling may raise anything
            log.exception("reply port %s failed", port_id)
            handler.fail(exc)
            finished = True
        if finished:
            self.ports.pop(port_id, None)
