"""Boot: which world a controller runs in, chosen by configuration above the core.

``regency.core`` never asks whether it runs simulated; the first ``current_runtime()`` of a
script comes here, and this module starts either a production controller (its runtime on a
background thread, with :func:`regency.core._environment.production`) or, with
``REGENCY_RUNTIME=sim``, the simulated cluster whose runtimes get the simulator's
environment.
"""

from __future__ import annotations

from .core._config import current_config
from .core._controller import start_production_controller
from .core._oversight import install_interrupt_handler
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
