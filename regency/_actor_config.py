"""``regency.actor.config``: switches read at run time (Monarch's ``monarch.actor.config``).

Assign to them from the program, e.g.
``regency.actor.config.prefix_python_logs_with_actor = False``.
"""

from __future__ import annotations

import logging
from typing import Any

#: Python log records emitted while an actor handles a message (or runs ``__init__``,
#: ``__supervise__``, ``__cleanup__``) get an ``[actor=<module.Class name{'gpus': 0/2}>]``
#: prefix, so lines from many ranks can be told apart. Also settable in procs through an
#: endpoint; each process reads its own.
prefix_python_logs_with_actor = True

_installed = False


def install_log_prefix() -> None:
    """Install the record factory that adds the prefix (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not prefix_python_logs_with_actor:
            return record
        from .core._context import current

        ctx = current.get()
        # Empty messages are structured-trace markers (torch.compile): leave them alone.
        if ctx is not None and ctx.actor_instance.class_name and record.msg:
            prefix = f"[actor={ctx.actor_instance}] "
            record.actor_prefix = prefix
            record.msg = f"{prefix}{record.msg}"
        return record

    logging.setLogRecordFactory(factory)
