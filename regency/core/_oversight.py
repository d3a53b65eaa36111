"""The runtime side of supervision: feeds a process's :class:`~regency.supervision.Supervisor`
and carries out what it decides.

Everything here runs on the runtime's trio thread (callers hop with ``Runtime.call_soon``).
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from .. import supervision as S
from ..supervision import FailureCause
from . import _messages as M
from . import _notebook
from ._future import Future

if TYPE_CHECKING:
    from ._runtime import Runtime

log = logging.getLogger("regency.supervision")

#: Seconds the default fault hook gives the program to unwind before it exits hard.
EXIT_GRACE = 3.0


class UnhandledFault(BaseException):
    """Raised in the controller's main thread when an actor failure reached the root unhandled.

    A ``BaseException`` so that ``except Exception`` in user code does not swallow it: the
    program stops like a local script with an uncaught exception, exit status 1.
    """


#: Appended to the default report (the simulator says how to replay the run).
report_suffix = ""


def default_unhandled_fault_hook(failure: S.MeshFailure) -> None:
    """Print the report and stop the program (Monarch's default, without waiting for the
    main thread to wake: a sleeping or blocked main thread is interrupted).

    Inside a Jupyter kernel the report goes to the running (or next) cell and the kernel
    stays up (``core/_notebook.py``)."""
    if _notebook.active():
        _notebook.report_fault(failure)
        return
    print(failure.report() + report_suffix, file=sys.stderr, flush=True)
    stop_program(failure)


_interrupt_installed = False


def install_interrupt_handler() -> None:
    """Let the runtime raise :class:`UnhandledFault` in the main thread through SIGUSR2.

    Only from the main thread, and only when nobody else handles SIGUSR2. Inside a Jupyter
    kernel, faults are routed to cells instead (``core/_notebook.py``).
    """
    global _interrupt_installed
    if _notebook.install():
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None):
        return
    signal.signal(signal.SIGUSR2, _raise_unhandled)
    _interrupt_installed = True


_pending_fault: list[S.MeshFailure] = []


def _raise_unhandled(signum: int, frame: Any) -> None:
    failure = _pending_fault[-1] if _pending_fault else None
    raise UnhandledFault(f"an actor failure reached the root unhandled: {failure}")


def stop_program(failure: S.MeshFailure, grace: float = EXIT_GRACE) -> None:
    """Interrupt the main thread (a real signal wakes ``time.sleep`` and ``Future.get``), and
    exit hard after ``grace`` seconds if the program has not stopped by then."""
    _pending_fault.append(failure)
    # Aim the signal at the main thread itself: a signal taken by another thread would not
    # interrupt the main thread's wait (a lock in Future.get(), a sleep).
    main = threading.main_thread().ident
    if _interrupt_installed and main is not None:
        signal.pthread_kill(main, signal.SIGUSR2)
    elif signal.getsignal(signal.SIGINT) is signal.default_int_handler and main is not None:
        signal.pthread_kill(main, signal.SIGINT)
    else:
        _thread.interrupt_main()

    def hard_exit() -> None:
        time.sleep(grace)
        from ._current import current_runtime_or_none

        rt = current_runtime_or_none()
        if rt is not None:
            for child in list(rt.children.values()):
                if child.handle is not None and child.returncode is None:
                    child.handle.kill()
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=hard_exit, name="regency-fault-exit", daemon=True).start()


def _current_hook() -> Callable[[S.MeshFailure], Any]:
    actor = sys.modules.get("regency.actor")
    hook = getattr(actor, "unhandled_fault_hook", None) if actor is not None else None
    return hook if callable(hook) else default_unhandled_fault_hook


class Oversight:
    """Glue between one runtime and its supervision state machine."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._machine = S.Supervisor()
        #: Why each failed rank failed, by (mesh key, rank): the machine's own table, empty
        #: while no rank of any mesh has failed (what a sender checks once per call). Read
        #: it; only events change it.
        self.failures: Mapping[tuple[str, int], FailureCause] = self._machine.causes
        #: Rank addresses of meshes owned here, to stop them when their owner goes.
        self.routes: dict[str, tuple[str, ...]] = {}
        #: Addresses of procs spawned by each owner here.
        self.owned_procs: dict[str, list[str]] = {}

    # -- events ------------------------------------------------------------------------

    def feed(self, event: S.Event, *, defer_root: bool = False) -> list[S.Action]:
        """Hand ``event`` to the machine and perform what it decides; with ``defer_root``,
        all but running the root's hook, which is returned for :meth:`perform` later."""
        actions = self._machine.handle(event)
        if self._machine.broken is not None:
            log.error("supervision state machine failed: %s", self._machine.broken)
        deferred: list[S.Action] = []
        for action in actions:
            if defer_root and isinstance(action, S.RunRootHook):
                deferred.append(action)
            else:
                self._perform(action)
        return deferred

    def perform(self, actions: list[S.Action]) -> None:
        """Perform actions :meth:`feed` deferred."""
        for action in actions:
            self._perform(action)

    # -- queries -----------------------------------------------------------------------

    def failure_of(self, key: str, rank: int) -> tuple[str, FailureCause | None] | None:
        """None while rank ``rank`` of mesh ``key`` has not failed; else the actor as
        Monarch prints it, and why it failed when that is known."""
        if not self._machine.failed(key, rank):
            return None
        return self._machine.actor_of(key, rank), self._machine.cause_of(key, rank)

    def meshes(self) -> Mapping[str, S.MeshState]:
        """The actor meshes supervised here, by key (a read-only view)."""
        return self._machine.meshes()

    @property
    def broken(self) -> str | None:
        """Why the supervision machine stopped taking events, if it did (a bug)."""
        return self._machine.broken

    def mesh_spawned(
        self,
        key: str,
        name: str,
        owner: str,
        owner_name: str,
        addresses: tuple[str, ...],
        actor_class: str = "",
        labels: tuple[str, ...] = (),
        sizes: tuple[int, ...] = (),
    ) -> None:
        self.routes[key] = addresses
        self.feed(
            S.MeshSpawned(key, name, owner, owner_name, addresses, actor_class, labels, sizes)
        )

    def procs_spawned(self, owner: str, addresses: list[str]) -> None:
        self.owned_procs.setdefault(owner, []).extend(addresses)

    # -- actions -----------------------------------------------------------------------

    def _perform(self, action: S.Action) -> None:
        probe = self.rt.probe
        if probe is not None and isinstance(action, S.Notify | S.RunRootHook):
            probe.owner_told(
                self.rt, action.owner if isinstance(action, S.Notify) else None, action.failure
            )
        if isinstance(action, S.Notify):
            cell = self.rt.actors.get(action.owner)
            if cell is not None:
                cell.enqueue(M.Supervise(action.failure))
            else:
                log.warning("owner %s is gone; dropping: %s", action.owner, action.failure)
        elif isinstance(action, S.Escalate):
            cell = self.rt.actors.get(action.owner)
            if cell is not None:
                cell.fail_unhandled(action.cause)
        elif isinstance(action, S.RunRootHook):
            self.root_fault(action.failure)
        elif isinstance(action, S.StopMeshes):
            for key in action.keys:
                self._stop_mesh(key, None)

    def root_fault(self, failure: S.MeshFailure) -> None:
        hook = _current_hook()
        try:
            hook(failure)
        except BaseException:
            log.exception("unhandled_fault_hook raised")

    def _stop_mesh(self, key: str, port: tuple[str, int] | None) -> int:
        """Send STOP_ACTOR to every rank of an owned mesh; returns how many were sent."""
        sent = 0
        for address in self.routes.get(key, ()):
            try:
                self.rt.post(address, M.StopActor(key, port))
                sent += 1
            except Exception:
                pass  # already unreachable: nothing to stop
        self._machine.handle(S.MeshStopped(key))
        return sent

    def stop_owned(self, owner: str) -> Future[None]:
        """Stop every mesh and proc ``owner`` owns (children first). The future resolves when
        they have acknowledged or ``stop_timeout`` passed."""
        from ._replies import _Acks

        done: Future[None] = Future()
        keys = self._machine.owned_by(owner)
        procs = self.owned_procs.pop(owner, [])
        self._machine.handle(S.OwnerGone(owner))
        if not keys and not procs:
            done.set_result(None)
            return done
        rt = self.rt
        dests = frozenset(a for k in keys for a in self.routes.get(k, ()))
        acks: Future[None] = Future()
        n = sum(len(self.routes.get(k, ())) for k in keys)
        if n:
            handler = _Acks(acks, n, f"stopping what {owner} owns", dests)
            port = rt.open_port(handler)
            sent = sum(self._stop_mesh(k, port) for k in keys)
            if handler.skip(n - sent):
                rt.close_port(port[1])
        else:
            acks.set_result(None)

        async def finish() -> None:
            from ._children import _stop_procs

            with trio.move_on_after(rt.config.stop_timeout):
                while not acks.done():
                    await _wait(acks)
            if procs:
                stopped: Future[None] = Future()
                await _stop_procs(rt, procs, stopped)
            done.set_result(None)

        rt.nursery.start_soon(finish)
        return done


async def _wait(fut: Future[Any]) -> None:
    try:
        await fut
    except Exception:
        pass
