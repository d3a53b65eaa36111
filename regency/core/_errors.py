"""Errors that cross process boundaries travel as data (type name, message, traceback text),
so they unpickle anywhere, even where the remote exception's class cannot be imported."""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import attrs


@attrs.frozen
class RemoteFailure:
    """An exception raised in another actor, as plain data."""

    type_name: str
    message: str
    traceback: str
    #: The exception itself, pickled, when it could be; restored lazily at the receiver.
    pickled: bytes | None = None

    @classmethod
    def capture(cls, exc: BaseException) -> RemoteFailure:
        tb = "".join(traceback.format_exception(exc))
        try:
            pickled: bytes | None = pickle.dumps(exc, protocol=5)
        except Exception:
            pickled = None
        return cls(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), tb, pickled)

    def exception(self) -> BaseException:
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
                if isinstance(exc, BaseException):
                    return exc
            except Exception:
                pass
        return RemoteException(self.type_name, self.message)


class RemoteException(Exception):
    """Stands in for a remote exception whose class could not be restored here."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


class ActorError(Exception):
    """An endpoint raised while the caller waited for its reply.

    ``exception`` is the remote exception (or a :class:`RemoteException` stand-in), and the
    message carries the remote traceback. The actor that raised keeps serving.
    """

    def __init__(self, endpoint: str, failure: RemoteFailure, rank: int | None = None) -> None:
        where = f" on rank {rank}" if rank is not None else ""
        what = "An exception was" if endpoint == "sent to a channel" else f"Actor call {endpoint}"
        verb = endpoint if endpoint == "sent to a channel" else "failed"
        super().__init__(
            f"{what} {verb}{where}: {failure.type_name}: {failure.message}\n"
            f"Remote traceback:\n{failure.traceback}"
        )
        self.endpoint = endpoint
        self.failure = failure
        self.rank = rank
        self.exception = failure.exception()
        self.message = failure.message

    def __reduce__(self) -> Any:
        return (ActorError, (self.endpoint, self.failure, self.rank))


class SupervisionError(RuntimeError):
    """A call cannot complete because the actor, its proc or the link to it failed."""


class BootstrapError(ActorError, SupervisionError):
    """A proc's bootstrap callable (``spawn_procs(bootstrap=...)``) raised, and the proc
    exited before it started: its mesh's ``initialized`` and spawns fail with this.

    ``failure`` is what the callable raised (type name, message, traceback text);
    ``exception`` a :class:`RemoteException` standing in for it; ``tail``: the proc's last
    lines of output, as a proc's exit describes them (``tail_log_lines``). An :class:`ActorError`,
    as Monarch raises there, and a :class:`SupervisionError`, as for any proc that did not
    start."""

    def __init__(self, proc_id: str, failure: RemoteFailure, tail: str = "") -> None:
        Exception.__init__(
            self,
            f"proc {proc_id}'s bootstrap function raised {failure.type_name}: "
            f"{failure.message}\nRemote traceback:\n{failure.traceback}{tail}",
        )
        self.proc_id = proc_id
        self.tail = tail
        self.endpoint = "bootstrap"
        self.failure = failure
        self.rank = None
        self.exception = failure.exception()
        self.message = failure.message

    def __reduce__(self) -> Any:
        return (BootstrapError, (self.proc_id, self.failure, self.tail))


class UndeliverableError(SupervisionError):
    """The message could not reach its destination."""


class CallTimeoutError(TimeoutError):
    """A call's ``get(timeout=...)`` ran out: the message names the ranks that did not
    answer and, for each (alike ones grouped), the endpoint it is in, for how long and its
    innermost user frame. ``stacks``: the :class:`~regency.core._stacks.JobStacks` of
    those ranks' procs that the message was made from (None when they could not be had);
    ``ranks``: the mesh ranks that did not answer. The call goes on: ``get`` may be called
    again."""

    def __init__(self, message: str, stacks: Any = None, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.stacks = stacks
        self.ranks = ranks


class ArgumentPickleError(TypeError, RuntimeError):
    """An endpoint's arguments cannot be pickled (raised at the call site, naming the
    argument). A ``TypeError``, and a ``RuntimeError`` as Monarch raises there, so either
    ``except`` catches it."""


class DecodeError(ValueError):
    """A message arrived but could not be unpickled (its ``__reduce__``/``__setstate__``
    raised, even ``SystemExit``). Fails the one call it belongs to; nothing else."""
