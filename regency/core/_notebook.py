"""Regency inside a Jupyter kernel (ipykernel): failures reach cells, never the kernel.

In a script an actor failure that reaches the root unhandled stops the program: the default
fault hook raises :class:`~regency.core._oversight.UnhandledFault` in the main thread,
wherever it is. In a kernel the main thread is mostly the kernel's own code (its event loop,
its message handlers), and an exception raised there kills the kernel with all the user's
state. So when the controller starts inside an ipykernel, the default hook does this instead:

* the report is printed (stderr) in the cell that is running when the failure arrives, or at
  the top of the next cell to run if the kernel is idle;
* that cell gets :class:`UnhandledFault` from a Regency wait: at once if it is waiting
  (``await fut``, ``await mesh``, ``fut.get()``), else from its next wait; a cell that ends
  without waiting again has seen the report and is left alone;
* the kernel and every mesh that did not fail go on.

Delivery never raises outside the cell's own waits: an ``await`` ends by failing the asyncio
future that the cell awaits (on the kernel's loop), a blocking ``get()`` by a SIGUSR2 whose
handler raises only when the main thread is inside ``Future.get``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import _waiting

if TYPE_CHECKING:
    import asyncio

    from ..supervision import MeshFailure


def kernel_shell() -> Any | None:
    """The IPython shell of the Jupyter kernel this process runs, or None (a script, a
    terminal IPython)."""
    if "ipykernel" not in sys.modules:
        return None
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    return shell


class _Cells:
    """Which cell runs, and the unhandled faults it still has to see."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._lock = threading.Lock()
        #: True between a cell's pre_run_cell and post_run_cell events.
        self.running = False
        #: Faults the running cell still has to raise (cleared when it ends).
        self.pending: list[MeshFailure] = []
        #: Faults that arrived while the kernel was idle: reported by the next cell.
        self.unreported: list[MeshFailure] = []
        #: asyncio futures the main thread awaits in Regency waits, with their loop.
        self._waiters: dict[asyncio.Future[None], asyncio.AbstractEventLoop] = {}
        self._main = threading.main_thread().ident
        #: The SIGINT handler in force before the main thread's asyncio waits began.
        self._saved_sigint: Any = signal.SIG_IGN

    # -- the cell's life (IPython events, main thread) -------------------------------------

    def pre_run_cell(self, info: Any = None) -> None:
        with self._lock:
            self.running = True
            late, self.unreported = self.unreported, []
            self.pending.extend(late)
        for failure in late:
            print(_report(failure), file=sys.stderr, flush=True)

    def post_run_cell(self, result: Any = None) -> None:
        _drain_captured_output()
        with self._lock:
            self.running = False
            self.pending.clear()

    # -- a fault arrives (the runtime's thread) ------------------------------------------

    def fault(self, failure: MeshFailure) -> None:
        with self._lock:
            running = self.running
            (self.pending if running else self.unreported).append(failure)
            loops = set(self._waiters.values())
        if not running:
            return
        # The running cell's output (ipykernel routes other threads' writes to it).
        print(_report(failure), file=sys.stderr, flush=True)
        for loop in loops:
            try:
                loop.call_soon_threadsafe(self._fail_waiters)
            except RuntimeError:
                pass  # that loop has closed
        if self._main is not None and signal.getsignal(signal.SIGUSR2) == self._on_signal:
            signal.pthread_kill(self._main, signal.SIGUSR2)

    # -- delivery: only inside the cell's Regency waits -----------------------------------

    def _take(self) -> BaseException | None:
        with self._lock:
            if not self.pending:
                return None
            first, self.pending = self.pending[0], []
        return _unhandled(first)

    def before_wait(self) -> None:
        """At the start of a wait that would block: raise what the running cell has not
        raised yet (main thread only; other threads are not the cell's)."""
        if self.pending and threading.get_ident() == self._main:
            exc = self._take()
            if exc is not None:
                raise exc

    def is_main_thread(self) -> bool:
        return threading.get_ident() == self._main

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Around a blocking ``Future.get()`` on the main thread: SIGINT raises
        ``KeyboardInterrupt`` there. (In a cell that also awaits, ipykernel's handler only
        cancels the cell's task, which never runs while the thread blocks: the cell would
        not stop.)"""
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def watch(self, waiter: asyncio.Future[None]) -> Callable[[], None] | None:
        """Track an asyncio future the main thread is about to await; returns the function
        that forgets it.

        While the main thread awaits, SIGINT (Jupyter's Interrupt) ends these waits with
        ``KeyboardInterrupt`` at once. (ipykernel's own handler cancels the cell through
        another thread's loop and only takes effect once the kernel's loop wakes for some
        other reason: a cell waiting on a reply that never comes would not stop.)"""
        if threading.get_ident() != self._main:
            return None
        with self._lock:
            first = not self._waiters
            self._waiters[waiter] = waiter.get_loop()
        if first:
            self._saved_sigint = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._on_sigint)
        return lambda: self._forget(waiter)

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with self._lock:
            self._waiters.pop(waiter, None)
            last = not self._waiters
        if last and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self._saved_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        with self._lock:
            loops = set(self._waiters.values())
        for loop in loops:
            loop.call_soon_threadsafe(self._interrupt_waiters)
        previous = self._saved_sigint
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # ipykernel's: it cancels the cell as well

    def _interrupt_waiters(self) -> None:  # on the kernel's loop
        with self._lock:
            waiting = [w for w in self._waiters if not w.done()]
        for waiter in waiting:
            waiter.set_exception(KeyboardInterrupt())

    def _fail_waiters(self) -> None:  # on the kernel's loop
        with self._lock:
            waiting = [w for w in self._waiters if not w.done()]
        if not waiting:
            return  # raised at the cell's next wait, if any
        exc = self._take()
        if exc is None:
            return
        for waiter in waiting:
            waiter.set_exception(exc)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Python runs handlers in the main thread between bytecodes: ``frame`` is where it
        # stands. Raise only from a blocked Future.get, never in the kernel's own code.
        if frame is not None and frame.f_code in _waiting.blocked_in:
            exc = self._take()
            if exc is not None:
                raise exc


def _drain_captured_output(limit: float = 0.2) -> None:
    """Let ipykernel's output-capturing thread take in what procs wrote to the kernel's
    stdout/stderr pipes before the cell ends (the reply from a proc can overtake its own
    prints: they travel different ways), so that the lines land in this cell. Best effort,
    bounded by ``limit`` seconds."""
    fds = [fd for fd in (getattr(s, "_fid", None) for s in (sys.stdout, sys.stderr)) if fd]
    if not fds:
        return
    import fcntl
    import struct
    import termios
    import time

    deadline = time.monotonic() + limit
    buf = bytearray(4)
    for fd in fds:
        while time.monotonic() < deadline:
            try:
                fcntl.ioctl(fd, termios.FIONREAD, buf)
            except OSError:
                break
            if struct.unpack("i", buf)[0] == 0:
                break
            time.sleep(0.001)
    time.sleep(0.01)  # the reader has read: let it hand the text on (it needs the GIL)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _report(failure: MeshFailure) -> str:
    from . import _oversight

    return failure.report() + _oversight.report_suffix


def _unhandled(failure: MeshFailure) -> BaseException:
    from ._oversight import UnhandledFault

    return UnhandledFault(f"an actor failure reached the root unhandled: {failure}")


_cells: _Cells | None = None


def install() -> bool:
    """In a Jupyter kernel: route unhandled faults to cells (idempotent) and return True;
    elsewhere return False. Called when the controller's runtime starts, from a cell."""
    global _cells
    shell = kernel_shell()
    if shell is None:
        return False
    if _cells is None:
        cells = _Cells(shell)
        cells.running = True  # called from inside a cell, after its pre_run_cell
        shell.events.register("pre_run_cell", cells.pre_run_cell)
        shell.events.register("post_run_cell", cells.post_run_cell)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(
            signal.SIGUSR2
        ) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR2, cells._on_signal)
        _waiting.in_notebook(cells)
        _cells = cells
    return True


def active() -> bool:
    """True once :func:`install` found a kernel: the notebook fault policy is in force."""
    return _cells is not None


def report_fault(failure: MeshFailure) -> None:
    """The default unhandled-fault hook's notebook branch (runs on the runtime's thread)."""
    assert _cells is not None
    _cells.fault(failure)
