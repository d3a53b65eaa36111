"""The controller's runtime: the first :func:`current_runtime` in a script starts it (through
the boot :mod:`regency._boot` plugs in, see :mod:`._extensions`: production, started here, or
the simulated cluster), and the job secret."""

from __future__ import annotations

import gc
import hashlib
import os
import secrets
import sys
import threading
from typing import TYPE_CHECKING

import trio

from . import _current
from ._config import Config
from ._current import _runtime_var
from ._jobdir import make_jobdir

if TYPE_CHECKING:
    from ._future import Future
    from ._runtime import Runtime

_runtime_lock = threading.Lock()


def derive_secret(text: str) -> bytes:
    """The job secret from a passphrase (``REGENCY_SECRET``, a secret file, an argument)."""
    text = text.strip()
    if len(text) < 16:
        raise ValueError(f"a job secret must be at least 16 characters (got {len(text)})")
    return hashlib.sha256(text.encode()).digest()


#: Set by ``attach_to_workers(secret=...)`` before the runtime starts.
secret_override: bytes | None = None
#: The passphrases of the job secrets this process derived, by secret: a job applied after
#: the runtime started (``SlurmJob(...).state()``) hands the runtime's to its workers.
known_passphrases: dict[bytes, str] = {}


def job_secret() -> bytes:
    """The secret given to ``attach_to_workers``, else ``REGENCY_SECRET`` (multi-host jobs
    share it), else the per-user secret file ``~/.regency/secret`` where it exists and is
    private (workers of this user on this machine share it), else a fresh random secret."""
    if secret_override is not None:
        return secret_override
    text = os.environ.get("REGENCY_SECRET")
    if not text:
        from ._hosts import user_secret

        try:
            text = user_secret(create=False)
        except (OSError, ValueError):
            text = None  # unusable here; attach_to_workers says why if it needs it
    if not text:
        text = secrets.token_hex(32)
    key = derive_secret(text)
    known_passphrases[key] = text
    return key


def current_runtime() -> Runtime:
    """This process's runtime; in a controller the first call starts it (through the boot
    plugged into :mod:`._extensions`: :mod:`regency._boot` chooses production or the
    simulator)."""
    rt = _runtime_var.get() or _current._runtime
    if rt is not None:
        return rt
    with _runtime_lock:
        if _current._runtime is None:
            from ._extensions import boot_controller

            _current._runtime = boot_controller()
        return _current._runtime


def start_production_controller(config: Config) -> Runtime:
    """Start a controller's runtime on its own thread (the ``regency-runtime`` daemon
    thread); at exit its procs are stopped and its job directory removed."""
    import atexit

    from ._environment import production
    from ._runtime import Runtime

    jobdir = make_jobdir()
    rt = Runtime(
        f"c{os.getpid()}",
        secret=job_secret(),
        jobdir=jobdir,
        config=config,
        env=production(),
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            trio.run(rt.serve)
        except BaseException as exc:  # surfaced to the thread that started us
            if rt.started.is_set():
                rt.runtime_died(exc)
            errors.append(exc)
            rt.started.set()

    thread = threading.Thread(target=run, name="regency-runtime", daemon=True)
    thread.start()
    rt.started.wait()
    if errors:
        raise RuntimeError(f"regency runtime failed to start: {errors[0]!r}") from errors[0]
    _freeze_heap()
    _booted[id(rt)] = (thread, jobdir)
    atexit.register(_shutdown_controller, rt, thread, jobdir)
    return rt


_heap_frozen = False


def _freeze_heap() -> None:
    """Once per process, when the first production controller has started: move every
    object alive now (the imported modules: Regency's, trio's, the script's) into the
    garbage collector's permanent generation, as each proc does after its imports.

    A full collection traverses every tracked object; 20,000 pipelined calls keep enough
    futures and reply ports alive to trigger several, and with the import-time heap
    (about 30,000 objects) in them they took about 3.5 us a call of the controller's CPU
    (docs/performance.md). Objects frozen here are still freed by reference counting;
    only a cycle among them would never be collected (``gc.unfreeze()`` undoes this)."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


def shutdown_context() -> Future[None]:
    """Stop every proc this controller spawned, detach from workers, and stop the runtime
    (Monarch's ``shutdown_context``). Idempotent; atexit does the same. A later Regency call
    starts a fresh runtime. Under the simulator the procs stop and the simulated cluster
    itself ends with the program."""
    from ._children import stop_owned_procs
    from ._future import resolved
    from ._hosts import detach_all

    rt = _current._runtime
    if rt is not None:
        booted = _booted.get(id(rt))
        if booted is not None:
            _shutdown_controller(rt, *booted)
        else:  # the simulated controller
            stop_owned_procs(rt, timeout=rt.config.stop_timeout + 1)
            rt.call_soon(lambda: detach_all(rt))
    return resolved(None)


#: The real controller's runtime thread and job directory, by runtime, until shut down.
_booted: dict[int, tuple[threading.Thread, str]] = {}


def _shutdown_controller(rt: Runtime, thread: threading.Thread, jobdir: str) -> None:
    from ._children import stop_owned_procs
    from ._hosts import detach_all

    if _booted.pop(id(rt), None) is None and _current._runtime is not rt:
        return  # already shut down (shutdown_context, then atexit)
    if rt.died is not None:  # its loop is gone (and its procs with its thread)
        if _current._runtime is rt:
            _current._runtime = None
        import shutil

        shutil.rmtree(jobdir, ignore_errors=True)
        return
    if rt.config.trace_path and rt.trace is not None:
        from ._trace import collect_and_write

        try:  # the run's timeline, before its procs stop
            collect_and_write(rt, rt.config.trace_path, stop=True, timeout=5.0)
        except Exception as exc:
            print(f"regency: could not write the trace {rt.config.trace_path}: {exc}", file=sys.stderr)
    try:
        stop_owned_procs(rt, timeout=1.0)
        rt.call_soon(lambda: detach_all(rt))
    finally:
        rt.stop()
        thread.join(timeout=2.0)
        if _current._runtime is rt:
            _current._runtime = None
        import shutil

        shutil.rmtree(jobdir, ignore_errors=True)
