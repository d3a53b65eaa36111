"""Boot: plugs the packages above the core into it, and chooses which world a controller
runs in.

``regency.core`` imports nothing above it (``tests/core/test_layers.py`` keeps it so); what it calls
of them it declares in :mod:`regency.core._extensions`, and this module fills those slots.
``import regency`` imports it, so every process (controller, zygote, proc, worker daemon) has
them filled before anything can call the core:

* the remote debugger (:mod:`regency._debugger`): its session count lives in core, so the
  mailbox's test stays a module attribute test;
* the tensor engine's ``ProcMesh`` methods (:mod:`regency._tensor_engine._procmesh`);
* log forwarding (:mod:`regency._logs`), imported when first used;
* what a new proc installs: log forwarding's tee (or its level control), then the
  ``breakpoint()`` hook;
* the controller's boot (:func:`start_controller`): the first ``current_runtime()`` of a
  script starts either a production controller (its runtime on a background thread, with
  :func:`regency.core._environment.production`) or, with ``REGENCY_RUNTIME=sim``, the
  simulated cluster whose runtimes get the simulator's environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _debugger
from ._tensor_engine import _procmesh
from .core import _extensions
from .core._config import current_config
from .core._controller import start_production_controller
from .core._oversight import install_interrupt_handler

if TYPE_CHECKING:
    from .core._runtime import Runtime


def start_controller() -> Runtime:
    """Start this process's controller runtime (called once, under the runtime lock)."""
    config = current_config()
    install_interrupt_handler()
    if config.runtime == "sim":
        from . import _prestart
        from .sim._cluster import start_simulated_controller

        _prestart.discard()  # no real procs: the zygote started at import is not needed

        return start_simulated_controller(config.seed)
    rt = start_production_controller(config)
    from ._admin import serve_admin

    serve_admin(rt)  # what `regency stacks` talks to
    return rt


def _log_forwarding() -> _extensions.LogForwarding:
    from . import _logs

    return _logs


def _install_logs(rt: Runtime) -> None:
    """In a new proc: the tee when forwarding, file capture or an output tail is on; else
    ``logging_option(level=...)`` still applies."""
    from . import _logs

    if rt.config.tees_output:
        _logs.install_proc(rt)
    else:
        _logs.install_level_control(rt)


def _install_breakpoint_hook(rt: Runtime) -> None:
    _debugger.install_breakpoint_hook()


def plug_in() -> None:
    """Fill core's extension slots (at import; again only to undo a test's changes)."""
    _extensions.register_debugger(_debugger.hooks)
    _extensions.register_mesh_tensors(_procmesh)
    _extensions.register_log_forwarding(_log_forwarding)
    _extensions.on_proc_start("logs", _install_logs)
    _extensions.on_proc_start("debugger", _install_breakpoint_hook)
    _extensions.register_boot(start_controller)


plug_in()
