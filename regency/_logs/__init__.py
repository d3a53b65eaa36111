"""Remote logs at the controller: every proc's stdout and stderr, teed and forwarded.

``regency.configure(enable_log_forwarding=True)`` (or ``REGENCY_ENABLE_LOG_FORWARDING=1``)
before spawning procs; then ``await proc_mesh.logging_option(...)``. See docs/logging.md.

* :mod:`._tee`: in each proc, the fd-level tee and the control port.
* :mod:`._sink`: in the controller, the sink port that prints (and groups) lines.
* :mod:`._aggregate`: the pure grouping of similar lines.
* :mod:`._leftovers`: what a proc killed by a signal left unread in its pipes.
* :mod:`._capture`: each proc's output in files on its host (``enable_file_capture``).
* ``regency.core._output_tail``: each proc's last lines, for the report of its death
  (``tail_log_lines``; in core, because the spawner that reads them is core).
* :mod:`._sim`: the simulator's side.
* :mod:`._records`: the messages between them.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..core._future import Future, resolved
from ..core._ports import PortBase
from ..core._singletons import root_address
from ._records import CONTROL_PORT, SINK_PORT, Flush, Init, Mode, PrintWindows, SetMode
from ._sink import LogSink, ensure_sink, sink_of

if TYPE_CHECKING:
    from ..core._children import Child
    from ..core._proc_mesh import ProcMesh
    from ..core._runtime import Runtime

__all__ = [
    "LogSink",
    "Mode",
    "flush",
    "flush_procs",
    "install_level_control",
    "install_proc",
    "logging_option",
    "procs_planned",
    "root_address",
    "sink_of",
]

log = logging.getLogger("regency.logs")


def install_proc(rt: Runtime) -> None:
    """In a new proc (bootstrap), when forwarding, file capture or an output tail is on:
    start the tee."""
    from ._tee import install_tee

    install_tee(rt)


class LevelControl(PortBase):
    """A proc's control port when forwarding is off: ``logging_option(level=...)`` still sets
    the proc's root logger level (Monarch's does, forwarding or not); nothing to stream."""

    dests: frozenset[str] = frozenset()

    def __init__(self, rt: Runtime, apply_level: bool = True) -> None:
        self.rt = rt
        #: False in the simulator, where the level is process-wide and left alone.
        self.apply_level = apply_level

    def deliver(self, index: int, status: int, value: Any) -> bool:
        from ..core import _messages as M

        if isinstance(value, Init):
            return False  # the simulator's procs have no tee to capture or keep a tail
        if not isinstance(value, SetMode):
            raise TypeError(f"log control port without forwarding takes SetMode (got {value!r})")
        if self.apply_level:
            logging.getLogger().setLevel(value.mode.level)
        try:
            self.rt.send_port(value.reply, 0, M.OK, None)
        except Exception as exc:
            log.debug("could not acknowledge a log level change: %s", exc)
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        pass


def install_level_control(rt: Runtime, apply_level: bool = True) -> None:
    """In a new proc when forwarding is off: serve ``logging_option``'s level changes."""
    if apply_level:
        # The level set is the user's: Regency's own loggers keep REGENCY_LOG_LEVEL.
        import os

        logging.getLogger("regency").setLevel(os.environ.get("REGENCY_LOG_LEVEL", "WARNING"))
    rt.ports[CONTROL_PORT] = LevelControl(rt, apply_level)


#: Per runtime: the procs it spawned with forwarding on (only they have a control port to
#: answer a mode change or a flush).
_forwarding: weakref.WeakKeyDictionary[Runtime, set[str]] = weakref.WeakKeyDictionary()


def _teed(rt: Runtime, addresses: Sequence[str]) -> list[str]:
    known = _forwarding.get(rt, set())
    return [a for a in addresses if a in known]


#: Per root runtime: the job's name (the directory of its capture files).
_jobs: weakref.WeakKeyDictionary[Runtime, str] = weakref.WeakKeyDictionary()


def _job(rt: Runtime) -> str:
    """This job's name: the controller's, made at its first spawn; a proc passes on the
    one its own spawner gave it."""
    if rt.parent_address is not None:
        from ._tee import installed

        tee = installed()
        if tee is not None and tee.job:
            return tee.job
    name = _jobs.get(rt)
    if name is None:
        from ._capture import job_name

        name = _jobs[rt] = job_name(rt.proc_id)
    return name


def procs_planned(rt: Runtime, children: Sequence[Child]) -> None:
    """The spawner planned ``children`` (in rank order) with their output teed. Their first
    message is their rank, the job's name and, with forwarding on, the default mode
    (stream, 3 s window, INFO as in Monarch); without it they forward nothing and keep
    their logging level."""
    config = rt.config
    if not config.tees_output:
        return
    job = _job(rt) if config.enable_file_capture else ""
    sink: str | None = None
    mode = Mode(stream=False)
    if config.enable_log_forwarding:
        _forwarding.setdefault(rt, set()).update(child.address for child in children)
        sink, mode = root_address(rt), Mode()
        if rt.parent_address is None:
            rt.call_soon(lambda: ensure_sink(rt))
    from ..core import _messages as M

    for rank, child in enumerate(children):
        rt.send_port((child.address, CONTROL_PORT), rank, M.OK, Init(rank, sink, mode, job))


class _Countdown(PortBase):
    """Resolves ``fut`` after ``n`` acknowledgements; a lost proc fails it."""

    def __init__(self, fut: Future[None], n: int, dests: frozenset[str], what: str) -> None:
        self.fut, self.missing, self.dests, self.what = fut, n, dests, what

    def deliver(self, index: int, status: int, value: Any) -> bool:
        self.missing -= 1
        if self.missing <= 0:
            self.fut.set_result(None)
            return True
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.fut.set_exception(RuntimeError(f"{self.what} failed: {exc}"))


def _addresses(mesh: ProcMesh) -> list[str]:
    procs, shape = mesh._procs, mesh._shape
    return [procs[r][1] for r in shape.ranks]


def logging_option(
    mesh: ProcMesh,
    stream_to_client: bool = True,
    aggregate_window_sec: float | None = 3,
    level: int = logging.INFO,
) -> Future[None]:
    """See :meth:`regency.actor.ProcMesh.logging_option`."""
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 255:
        raise ValueError(f"Invalid logging level: {level!r} (expected an int from 0 to 255)")
    if aggregate_window_sec is not None and not stream_to_client:
        raise RuntimeError("cannot set aggregate window without streaming to client")
    mode = Mode(bool(stream_to_client), aggregate_window_sec, level)
    from ..core._controller import current_runtime

    rt = current_runtime()
    # This process's own proc (``this_proc()`` in the controller) is the program's: its
    # logging is left as the program set it up.
    addresses = [a for a in _addresses(mesh) if a != rt.address]
    if stream_to_client and not _teed(rt, addresses):
        warnings.warn(
            "logging_option(stream_to_client=True) streams nothing: log forwarding was off "
            "when these procs were spawned (or they were not spawned from here); call "
            "regency.configure(enable_log_forwarding=True) (or set "
            "REGENCY_ENABLE_LOG_FORWARDING=1) before spawning them. The level still applies.",
            UserWarning,
            stacklevel=3,
        )
    if not addresses:
        return resolved(None)
    done: Future[None] = Future()
    port = rt.open_port(
        _Countdown(done, len(addresses), frozenset(addresses), "logging_option")
    )
    from ..core import _messages as M

    for address in addresses:
        rt.send_port((address, CONTROL_PORT), 0, M.OK, SetMode(mode, port))
    return done


def flush(mesh: ProcMesh) -> Future[None]:
    """Resolve once every line ``mesh``'s procs wrote before this call is printed at the
    controller (the barrier ``stop()`` runs first)."""
    from ..core._controller import current_runtime

    rt = current_runtime()
    done: Future[None] = Future()
    addresses = _addresses(mesh)

    async def run() -> None:
        try:
            await flush_procs(rt, addresses)
        except BaseException as exc:
            done.set_exception(exc)
            raise
        done.set_result(None)

    rt.start_soon(run)
    return done


class _Acked(PortBase):
    """Collects which procs' flushes the sink acknowledged (the value is the proc's address)."""

    dests: frozenset[str] = frozenset()  # a lost proc is noticed through its exit instead

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.windows_printed = False
        self.changed = trio.Event()

    def deliver(self, index: int, status: int, value: Any) -> bool:
        origin = value
        if origin is None:
            self.windows_printed = True
        else:
            self.acked.add(origin)
        self.changed.set()
        return False

    def fail(self, exc: BaseException, address: str | None = None) -> None:
        self.changed.set()


async def flush_procs(rt: Runtime, addresses: Sequence[str]) -> None:
    """A barrier: returns once every line the procs at ``addresses`` wrote before now has
    been printed at the controller. Each proc drains its pipes, sends the rest, then
    ``Flushed`` to the sink, which acknowledges; then the sink prints its open windows. A
    proc that exits meanwhile stops being waited for; none waits longer than
    ``stop_timeout``."""
    addresses = _teed(rt, addresses)
    if not addresses:
        return
    from ..core import _messages as M

    acks = _Acked()
    port = rt.open_port(acks)
    pending: set[str] = set()
    for address in addresses:
        child = rt.children.get(address)
        if child is not None and child.returncode is not None:
            continue
        try:
            rt.send_port((address, CONTROL_PORT), 0, M.OK, Flush(port))
        except Exception:
            continue  # unreachable: nothing to wait for
        pending.add(address)

    async def watch_exit(child: Child) -> None:
        await child.exited.wait()
        pending.discard(child.address)
        acks.changed.set()

    try:
        with trio.move_on_after(rt.config.stop_timeout):
            async with trio.open_nursery() as nursery:
                for address in pending:
                    child = rt.children.get(address)
                    if child is not None:
                        nursery.start_soon(watch_exit, child)
                while pending - acks.acked:
                    await acks.changed.wait()
                    acks.changed = trio.Event()
                nursery.cancel_scope.cancel()
            # Every proc's lines are in: print the open windows (lines of all ranks grouped).
            rt.send_port((root_address(rt), SINK_PORT), 0, M.OK, PrintWindows(port))
            while not acks.windows_printed:
                await acks.changed.wait()
                acks.changed = trio.Event()
    finally:
        rt.close_port(port[1])
