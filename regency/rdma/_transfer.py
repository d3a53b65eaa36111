"""Running transfers: pick a backend per transfer, apply the deadline, resolve the Future.

Every transfer runs as a task in this process's runtime nursery, whatever thread asked for it,
so a blocking ``.get()`` on the user's thread, ``await`` in trio or asyncio code, and a
fire-and-forget caller all see the same behaviour.
"""

from __future__ import annotations

import logging

import trio

from ..core import Future, Runtime, current_runtime
from . import _ibverbs
from ._backend import Backend, BufferRef, FallBack, Transfer, backend_choice
from ._errors import RDMAError
from ._ibverbs import IbverbsBackend
from ._same_host import SameHostBackend
from ._state import current_state
from ._tcp import TcpBackend

log = logging.getLogger("regency.rdma")

SAME_HOST = SameHostBackend()
TCP = TcpBackend()
IBVERBS = IbverbsBackend()
_BY_NAME: dict[str, Backend] = {b.name: b for b in (SAME_HOST, TCP, IBVERBS)}

#: Transfers up to this size go on the data connection even on the same host (see plan()).
SMALL_BYTES = 256 << 10

#: Set when the kernel refused a same-host copy: auto mode stops trying it in this process.
_same_host_refused = False


def same_host_refused() -> bool:
    return _same_host_refused


def is_local(ref: BufferRef) -> bool:
    """Whether ``ref`` was registered by the proc this code runs in."""
    state = current_state()
    return (
        ref.host == state.host
        and ref.pid == state.pid
        and ref.proc_id == current_runtime().proc_id
    )


def plan(ref: BufferRef, choice: str, nbytes: int) -> list[Backend]:
    """Backends to try, in order, for ``nbytes`` on ``ref``.

    ``auto``: within one proc, a plain copy; to another process reachable by pid, a
    same-host copy (CUDA IPC for GPU memory), except for small CPU transfers (at most
    :data:`SMALL_BYTES`), which go on the owner's data connection: one round trip with the
    bytes inline beats a lease round trip plus a copy there; to another host, verbs where
    this process has a usable RDMA device, then TCP. In a simulated cluster: a plain copy
    within one simulated proc, else the data connection, which runs over the simulated
    network (every simulated proc shares one OS process: pids name nothing there).
    """
    if choice != "auto":
        return [_BY_NAME[choice]]
    if is_local(ref):
        return [SAME_HOST]
    if current_state().simulated:
        return [TCP]
    if not _same_host_refused and SameHostBackend.reaches(ref):
        if nbytes <= SMALL_BYTES and ref.device == "cpu":
            return [TCP]
        return [SAME_HOST, TCP]
    if _ibverbs.usable(ref):
        return [IBVERBS, TCP]
    return [TCP]


async def run_one(transfer: Transfer, choice: str) -> None:
    global _same_host_refused
    backends = plan(transfer.ref, choice, transfer.nbytes)
    for i, backend in enumerate(backends):
        try:
            await backend.run(transfer)
            return
        except FallBack as exc:
            if i + 1 == len(backends):
                raise RDMAError(str(exc)) from None
            if backend is SAME_HOST:
                _same_host_refused = True
            log.warning("%s: %s; falling back to %s", transfer.describe(), exc,
                        backends[i + 1].name)


def start(transfers: list[Transfer], timeout: float) -> Future[None]:
    """Run ``transfers`` concurrently under one deadline; the Future resolves when all have
    finished, with the first error if any failed. Thread-safe; returns at once."""
    rt = current_runtime()
    choice = backend_choice()  # read on the caller's thread, when the caller asked
    fut: Future[None] = Future()
    rt.start_soon(_run_all, rt, transfers, choice, timeout, fut)  # runs with rt current
    return fut


async def _run_all(
    rt: Runtime, transfers: list[Transfer], choice: str, timeout: float, fut: Future[None]
) -> None:
    errors: list[Exception] = []

    async def guarded(transfer: Transfer) -> None:
        try:
            await run_one(transfer, choice)
        except Exception as exc:
            errors.append(exc)

    try:
        with trio.move_on_after(timeout) as scope:
            if len(transfers) == 1:
                await guarded(transfers[0])
            else:
                async with trio.open_nursery() as nursery:
                    for transfer in transfers:
                        nursery.start_soon(guarded, transfer)
    except trio.Cancelled:
        fut.set_exception(RDMAError("the runtime stopped before the transfer finished"))
        raise
    if scope.cancelled_caught:
        what = transfers[0].describe() if len(transfers) == 1 else (
            f"RDMAAction of {len(transfers)} transfers"
        )
        fut.set_exception(TimeoutError(f"{what} did not finish within {timeout} s"))
    elif errors:
        fut.set_exception(errors[0])
    else:
        fut.set_result(None)
