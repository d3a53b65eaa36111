"""Where the packages above core plug into it. Core imports none of them.

Core declares here what it calls of each, as a :class:`typing.Protocol`, and keeps a slot the
package fills when it is plugged in; :mod:`regency._boot` does the plugging, and
``import regency`` imports it, so in every process (controller, zygote, proc, worker) the
slots are filled before anything can call core:

* the remote debugger (:mod:`regency._debugger`): :class:`Debugger`, and the count of open
  sessions that the mailbox tests on every call (:data:`debug_sessions`);
* log forwarding (:mod:`regency._logs`): :class:`LogForwarding`, loaded on first use;
* the tensor engine (:mod:`regency._tensor_engine`): :class:`MeshTensors`, what
  ``ProcMesh.activate()`` and ``ProcMesh.rank_tensor()`` run, and what an endpoint's call
  with tensor-engine tensors among its arguments and ``Endpoint.rref()`` run; such a call's
  payload is a :class:`DeferredArguments`, which the receiving actor completes before the
  endpoint runs;
* the controller's boot (the first :func:`~regency.core._controller.current_runtime` of a
  script: production or the simulator);
* what a new proc installs when it starts (the debugger's ``breakpoint()`` hook, log
  forwarding's tee or level control).

A slot nobody filled raises :class:`NotPluggedIn` when core needs it (only a program that
imported pieces of core without ``regency`` itself could see that), except the debugger's,
whose default does nothing: without the debugger no session is ever open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ._adverbs import Endpoint
    from ._children import Child
    from ._endpoint import EndpointSpec
    from ._future import Future
    from ._proc_mesh import ProcMesh
    from ._runtime import Runtime

R = TypeVar("R")

__all__ = [
    "Debugger",
    "DeferredArguments",
    "LogForwarding",
    "MeshTensors",
    "NotPluggedIn",
    "boot_controller",
    "debug_sessions",
    "debugger",
    "install_in_proc",
    "log_forwarding",
    "mesh_tensors",
    "on_proc_start",
    "register_boot",
    "register_debugger",
    "register_log_forwarding",
    "register_mesh_tensors",
]


class NotPluggedIn(RuntimeError):
    """Core needed a package above it that was never plugged in."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} is not plugged into regency.core: import regency (regency/_boot.py "
            "plugs the packages above core in)"
        )


# -- the debugger ---------------------------------------------------------------------------------


class Debugger(Protocol):
    """What the mailbox calls of the remote debugger."""

    def call_ended(self, exc: BaseException | None) -> None:
        """An endpoint call ended (returned: ``exc`` is None, or raised ``exc``) while debug
        sessions were open: a post-mortem if it was at a breakpoint, then its session ends."""
        ...

    def drive(self, coro: Coroutine[Any, Any, R]) -> Awaitable[R]:
        """What an async endpoint's coroutine is awaited through (so that a ``breakpoint()``
        in it can wait for the person at the debugger without stopping the loop)."""
        ...


class _NoDebugger:
    """No debugger plugged in: no session ever opens; coroutines are awaited as they are."""

    def call_ended(self, exc: BaseException | None) -> None:
        pass

    def drive(self, coro: Coroutine[Any, Any, R]) -> Awaitable[R]:
        return coro


#: How many remote debug sessions are open in this process. The debugger keeps it; the
#: mailbox tests it after every call (a module attribute test, the whole cost of the debugger
#: on the hot path) and calls :attr:`debugger` only when it is not 0.
debug_sessions = 0
#: The remote debugger (:func:`register_debugger`).
debugger: Debugger = _NoDebugger()


def register_debugger(hooks: Debugger) -> None:
    global debugger
    debugger = hooks


# -- log forwarding ------------------------------------------------------------------------------


class LogForwarding(Protocol):
    """What core calls of log forwarding (docs/logging.md)."""

    def procs_planned(self, rt: Runtime, children: Sequence[Child]) -> None:
        """The spawner planned ``children`` (in rank order) with their output teed
        (``Config.tees_output``: forwarding, file capture or an output tail on)."""
        ...

    async def flush_procs(self, rt: Runtime, addresses: Sequence[str]) -> None:
        """A barrier before procs stop: every line they wrote is printed at the controller."""
        ...

    def logging_option(
        self,
        mesh: ProcMesh,
        stream_to_client: bool = ...,
        aggregate_window_sec: float | None = ...,
        level: int = ...,
    ) -> Future[None]:
        """``ProcMesh.logging_option``."""
        ...


_load_log_forwarding: Callable[[], LogForwarding] | None = None
_log_forwarding: LogForwarding | None = None


def register_log_forwarding(load: Callable[[], LogForwarding]) -> None:
    """``load()`` gives log forwarding; it is called when core first needs it (the package
    is not small, and a controller without forwarding may never need it)."""
    global _load_log_forwarding, _log_forwarding
    _load_log_forwarding, _log_forwarding = load, None


def log_forwarding() -> LogForwarding:
    global _log_forwarding
    if _log_forwarding is None:
        if _load_log_forwarding is None:
            raise NotPluggedIn("log forwarding")
        _log_forwarding = _load_log_forwarding()
    return _log_forwarding


# -- the tensor engine ---------------------------------------------------------------------------


class MeshTensors(Protocol):
    """What ``ProcMesh``'s tensor methods run (docs/tensors.md)."""

    def activate(self, mesh: ProcMesh) -> Any:
        """``with mesh.activate():`` torch ops run on every proc of ``mesh``."""
        ...

    def rank_tensor(self, mesh: ProcMesh, dims: tuple[str, ...]) -> Any:
        """A tensor whose value on each proc is its coordinate along ``dims`` (row-major)."""
        ...

    def carry(
        self,
        endpoint: Endpoint[..., Any],
        ranks: Sequence[int],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> list[Any] | None:
        """The pickled payload (a :class:`DeferredArguments`) of a call to ``endpoint``'s
        local ``ranks`` whose arguments core could not pickle, when tensor-engine tensors are
        what it could not pickle; None otherwise (core reports its own error)."""
        ...

    def rref(
        self,
        endpoint: Endpoint[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        send: Callable[[list[Any]], None],
    ) -> Any:
        """``endpoint.rref(*args, **kwargs)``: ``send`` (to every rank, no reply) the payload
        (a :class:`DeferredArguments`) it makes; what the endpoint returns on each rank
        becomes tensor-engine tensors, which it returns."""
        ...


class DeferredArguments:
    """The payload of a call whose arguments a package above core completes on the
    receiving proc, when the actor takes the call (in its mailbox's order), before the
    endpoint runs: the tensor engine's, whose tensor arguments are each rank's own tensors,
    handed over by that proc's tensor worker once its stream reaches the call."""

    __slots__ = ()

    async def resolve(self, rt: Runtime) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The endpoint's ``(args, kwargs)``, awaited on ``rt``'s loop. What it raises is
        what the endpoint would have raised (its caller gets it)."""
        raise NotImplementedError

    def abandoned(self, rt: Runtime, why: str) -> None:
        """The call will never run on ``rt``'s proc: its actor was gone when it came, or
        died or stopped before taking it (``why``, naming the actor). What was set aside for
        it is let go (the runtime's ``bounce`` calls this)."""

    def around(self, spec: EndpointSpec[..., Any] | None) -> EndpointSpec[..., Any] | None:
        """The endpoint to run in place of ``spec`` (None: a plain method called through
        ``as_endpoint``): itself, unless the package takes the endpoint's outcome."""
        return spec


_mesh_tensors: MeshTensors | None = None


def register_mesh_tensors(engine: MeshTensors) -> None:
    global _mesh_tensors
    _mesh_tensors = engine


def mesh_tensors() -> MeshTensors:
    if _mesh_tensors is None:
        raise NotPluggedIn("the tensor engine")
    return _mesh_tensors


# -- the controller's boot -----------------------------------------------------------------------


_boot: Callable[[], Runtime] | None = None


def register_boot(boot: Callable[[], Runtime]) -> None:
    """``boot()`` starts this process's controller runtime (called once, under the runtime
    lock, by the first ``current_runtime()`` of a process that has none)."""
    global _boot
    _boot = boot


def boot_controller() -> Runtime:
    if _boot is None:
        raise NotPluggedIn("the controller's boot (production or simulated)")
    return _boot()


# -- what a new proc installs --------------------------------------------------------------------


_proc_installers: dict[str, Callable[[Runtime], None]] = {}


def on_proc_start(name: str, install: Callable[[Runtime], None]) -> None:
    """A new proc (``regency.core._bootstrap``) calls ``install(rt)`` once its runtime
    exists, before it serves; in the order registered (registering a name again replaces
    its installer in place)."""
    _proc_installers[name] = install


def install_in_proc(rt: Runtime) -> None:
    for install in list(_proc_installers.values()):
        install(rt)
