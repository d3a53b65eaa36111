"""What every backend shares: the buffer handle's data, one transfer, the backend interface,
and which backend the configuration asks for.

A backend moves the bytes of one :class:`Transfer`. It runs as a task on the runtime's trio
thread; the caller wraps it in the transfer's deadline (cancellation means timeout), so a
backend must stay cancellable while it waits and must not block the trio thread for long
(bulk copies go to worker threads).
"""

from __future__ import annotations

import abc
import os
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import trio

from ..core import ActorError, SupervisionError
from ._errors import RDMAError, owner_lost
from ._host import host_identity
from ._memory import Region

if TYPE_CHECKING:
    from ..core import ActorMesh

#: Values of ``REGENCY_RDMA_BACKEND`` / :func:`set_backend`.
BACKEND_CHOICES = ("auto", "same_host", "tcp", "ibverbs")
ENV_VAR = "REGENCY_RDMA_BACKEND"


@attrs.frozen
class BufferRef:
    """Everything a peer needs to reach a registered buffer; what an RDMABuffer pickles to."""

    #: The buffer's id in its owner's registry.
    buf_id: int
    size: int
    #: Start address in the owner's address space (used by the same-host backend only).
    addr: int
    readonly: bool
    pid: int
    #: :func:`~regency.rdma._host.host_identity` of the owner.
    host: str
    proc_id: str
    #: The owner process's RDMA manager actor (one rank).
    manager: ActorMesh[Any]
    #: Where the memory is: ``"cpu"`` or ``"cuda:N"`` (the owner's device numbering).
    device: str = "cpu"

    def describe(self) -> str:
        return f"RDMABuffer #{self.buf_id} ({self.size} bytes) of proc {self.proc_id}"


@attrs.frozen(eq=False)
class Transfer:
    """One ``read_into`` (buffer -> ``local``) or ``write_from`` (``local`` -> buffer).

    Both start at offset 0 of the buffer and of ``local``; a read moves ``ref.size`` bytes (the
    leading bytes of a larger destination), a write ``local.nbytes`` (at most ``ref.size``).
    """

    ref: BufferRef
    local: Region
    write: bool
    #: Seconds the owner keeps a lease taken for this transfer (its timeout plus a margin).
    ttl: float

    @property
    def nbytes(self) -> int:
        return self.local.nbytes if self.write else self.ref.size

    def describe(self) -> str:
        verb = "write_from into" if self.write else "read_into from"
        return f"{verb} {self.ref.describe()}"


class Backend(abc.ABC):
    """Moves the bytes of transfers one way (same-host copy, TCP, verbs, simulator)."""

    #: The name :func:`~regency.rdma.get_rdma_backend` and the configuration use.
    name: ClassVar[str]

    @abc.abstractmethod
    async def run(self, transfer: Transfer) -> None:
        """Move ``transfer.nbytes`` bytes, validating with the owner first so that a dropped
        or unknown buffer fails cleanly. Raises :class:`RDMAError` subclasses (or ``ValueError``
        / ``TypeError`` for requests the owner refuses)."""


class FallBack(RDMAError):
    """A backend cannot serve this transfer here (for example the kernel refused a same-host
    copy); in ``auto`` mode the next backend is tried."""


# -- configuration --------------------------------------------------------------------------

_forced: str | None = None


def _check_choice(value: str, source: str) -> str:
    if value not in BACKEND_CHOICES:
        raise ValueError(f"{source} must be one of {BACKEND_CHOICES} (got {value!r})")
    return value


def set_backend(name: str | None) -> None:
    """Force the backend of every later transfer started by this process: ``"same_host"``,
    ``"tcp"``, ``"ibverbs"``, or ``"auto"`` (per transfer, the best that reaches the owner).
    ``None`` returns to the configuration (``REGENCY_RDMA_BACKEND``, default ``"auto"``).

    The reader or writer chooses, not the owner; procs spawned later read
    ``REGENCY_RDMA_BACKEND`` from their environment (``spawn_procs(env=...)``).
    """
    global _forced
    _forced = None if name is None else _check_choice(name, "backend")


def backend_choice() -> str:
    """The configured choice: :func:`set_backend` > ``regency.configure(rdma_backend=...)``
    (when the configuration has that key) > ``REGENCY_RDMA_BACKEND`` > ``"auto"``."""
    if _forced is not None:
        return _forced
    from ..core import _config

    configured = _config._overrides.get("rdma_backend")  # regency.configure(rdma_backend=...)
    if isinstance(configured, str):
        return _check_choice(configured, "rdma_backend")
    # Read each time (not from the cached configuration): tests and launchers change it.
    return _check_choice(os.environ.get(ENV_VAR, "auto") or "auto", ENV_VAR)


# -- talking to the owner's manager ---------------------------------------------------------


async def call_manager(ref: BufferRef, endpoint: str, *args: Any) -> Any:
    """Call the owner's RDMA manager; translate what can go wrong into this package's errors.

    The owner's refusal (dropped buffer, bad size) arrives as the exception it raised; a lost
    owner as :class:`RDMAOwnerLostError`. An owner on this host is watched through a pidfd
    while the call waits: the runtime keeps dialling a proc it did not spawn for a while (it
    may still be starting), but an owner that exited will never answer.
    """
    pidfd = _open_pidfd(ref) if ref.host == host_identity() else None
    if pidfd is None:
        return await _call(ref, endpoint, args)
    outcome: list[Any] = []
    failure: list[BaseException] = []

    async def call(cancel: trio.CancelScope) -> None:
        try:
            outcome.append(await _call(ref, endpoint, args))
        except Exception as exc:
            failure.append(exc)
        cancel.cancel()

    async def watch(cancel: trio.CancelScope) -> None:
        await trio.lowlevel.wait_readable(pidfd)
        if not outcome and not failure:
            failure.append(owner_lost(ref.describe(), f"its process (pid {ref.pid}) has exited"))
        cancel.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, nursery.cancel_scope)
            nursery.start_soon(watch, nursery.cancel_scope)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)
    if failure:
        raise failure[0]
    return outcome[0]


def _open_pidfd(ref: BufferRef) -> int | None:
    try:
        return os.pidfd_open(ref.pid)
    except ProcessLookupError:
        raise owner_lost(ref.describe(), f"its process (pid {ref.pid}) has exited") from None
    except (OSError, AttributeError):
        return None  # no pidfds here: rely on the runtime noticing the lost link


async def _call(ref: BufferRef, endpoint: str, args: tuple[Any, ...]) -> Any:
    try:
        return await ref.manager.endpoint(endpoint).call_one(*args)
    except ActorError as exc:
        inner = exc.exception
        if isinstance(inner, (RDMAError, ValueError, TypeError)):
            raise inner from None
        raise RDMAError(f"the owner of {ref.describe()} failed: {exc.message}") from exc
    except SupervisionError as exc:
        raise owner_lost(ref.describe(), str(exc)) from None
