"""Remote pdb for actors (docs/debugging.md).

* :mod:`._remote`: in procs, the ``breakpoint()`` hook, the remote pdb and the greenlet
  driver that keeps the loop free while an async endpoint sits at a breakpoint.
* :mod:`._controller`: in the controller, the ``DebugController`` actor and its TCP server.
* :mod:`._commands`: the debugger's command language.
* :mod:`._client`: the ``regency debug`` client.
"""

from __future__ import annotations

from . import _remote
from ._remote import call_ended, drive, install_breakpoint_hook

#: What the core's mailbox calls (``regency.core._extensions.Debugger``; plugged in by
#: :mod:`regency._boot`): ``call_ended`` and ``drive``.
hooks = _remote

__all__ = ["call_ended", "drive", "hooks", "install_breakpoint_hook"]
