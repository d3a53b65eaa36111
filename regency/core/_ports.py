"""Reply ports: the :class:`PortHandler` interface and the runtime's table of open ports
(:class:`PortTable`, a part of :class:`Runtime`)."""

from __future__ import annotations

import itertools
import logging
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
    ``dispatch_lock`` (the loop holds it too while it handles a frame)."""

    #: Addresses of the procs this port waits on; a lost link to one fails the port.
    dests: frozenset[str]

    def deliver(self, index: int, status: int, value: Any) -> bool:
        """Handle one reply (``status`` from :mod:`._messages`: ``OK`` with the value, else a
        RemoteFailure); return True when the port is finished and can be closed."""

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        """The port can no longer complete (``address``, a destination, is unreachable)."""


class PortTable:
    """This runtime's open reply ports (a part of :class:`Runtime`)."""

    address: str
    ports: dict[int, PortHandler]
    _port_ids: itertools.count[int]
    #: Set when the runtime's loop died: new calls fail with it at once.
    died: Exception | None

    def send(self, address: str, frame: transports.Frame) -> None:  # provided by Runtime
        raise NotImplementedError

    def open_port(self, handler: PortHandler) -> tuple[str, int]:
        if self.died is not None:  # the runtime's loop is gone: this call could never finish
            raise self.died
        port_id = next(self._port_ids)
        self.ports[port_id] = handler
        return (self.address, port_id)

    def close_port(self, port_id: int) -> None:
        self.ports.pop(port_id, None)

    def send_port(self, port: tuple[str, int], index: int, status: int, value: Any) -> None:
        """Send ``value`` to a reply port. Raises if the value cannot be pickled."""
        address, port_id = port
        self.send(address, _codec.encode_reply(port_id, index, status, value))

    def _to_port(self, reply: Reply) -> None:
        self._reply(reply.port_id, reply.index, reply.status, reply.payload)

    def _reply(
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
                endpoint = getattr(handler, "endpoint", None)
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
                batch = getattr(handler, "deliver_batch", None)
                if batch is not None:
                    finished = batch(index, value)
                else:
                    finished = False
                    for rank, rank_status, item in value:
                        if handler.deliver(rank, rank_status, item):
                            finished = True
                            break
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
